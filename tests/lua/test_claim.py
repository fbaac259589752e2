"""claim.lua: one runtime at a time runs a key; a finished key is answered from its record;
a key is taken over only from the owner judged gone (``takeover_from``)."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.lua.announced import listening
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

OWNER_A, OWNER_B = "w-1/i1", "w-2/i2"
TTL_MS = 60_000


def _args(owner: str, *items: tuple[int, str] | tuple[int, str, str]) -> list[object]:
    """ARGV of a claim by ``owner`` of keys given as (lease_ms, msg_id[, takeover_from])."""
    args: list[object] = [owner, TTL_MS, owner.split("/")[0], 3]
    for lease_ms, msg_id, *takeover_from in items:
        args += [lease_ms, msg_id, takeover_from[0] if takeover_from else ""]
    return args


async def test_first_claim_gets_fence_one_and_marks_running(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k1")
    assert await scripts.call(r, "claim", [rec], _args(OWNER_A, (5_000, "m1"))) == [[1, 1]]
    h = await r.hgetall(rec)
    assert h[b"owner"] == OWNER_A.encode() and h[b"status"] == b"running"
    assert h[b"msg_id"] == b"m1" and h[b"agent_id"] == b"w-1" and h[b"runs"] == b"1"
    assert 0 < await r.pttl(rec) <= TTL_MS


async def test_a_held_claim_turns_away_other_copies(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k2")
    await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1")))
    # A second copy, from another runtime or from this one, must not run while the lease holds.
    for owner in (OWNER_B, OWNER_A):
        got = await scripts.call(r, "claim", [rec], _args(owner, (60_000, "m1")))
        assert got == [[3, OWNER_A.encode()]]
    assert await r.hget(rec, "runs") == b"1"


async def test_an_expired_lease_is_claimed_again_with_a_higher_fence(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k3")
    await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1")))
    await r.hset(rec, "lease_until", 0)  # as if the lease ran out
    got = await scripts.call(r, "claim", [rec], _args(OWNER_B, (60_000, "m1")))
    assert got == [[1, 2]]
    assert await r.hget(rec, "owner") == OWNER_B.encode()
    assert await r.hget(rec, "runs") == b"2"


async def test_a_claim_leaves_out_what_the_record_says_without_it(r: AnyRedis, ns: str) -> None:
    # Named by its msg_id (no caller's key): no msg_id field; sent_msg_id equal to the msg_id
    # claimed is deleted; takeovers 0 is not written. Each absent field reads as that.
    k = Keys(ns)
    named, keyed = k.idem("m7"), k.idem("cap||order-7")
    for rec in (named, keyed):
        await r.hset(rec, mapping={"status": "pending", "sent_msg_id": "m7", "msg_id": "old"})
    got = await scripts.call(
        r, "claim", [named, keyed], _args(OWNER_A, (5_000, "m7"), (5_000, "m7"))
    )
    assert got == [[1, 1], [1, 1]]
    h = await r.hgetall(named)
    assert not {b"msg_id", b"sent_msg_id", b"takeovers"} & set(h)
    h = await r.hgetall(keyed)
    assert h[b"msg_id"] == b"m7" and not {b"sent_msg_id", b"takeovers"} & set(h)
    # Another msg_id than the one sent is kept apart: both stay.
    other = k.idem("cap||order-8")
    await r.hset(other, mapping={"status": "pending", "sent_msg_id": "m9"})
    assert await scripts.call(r, "claim", [other], _args(OWNER_A, (5_000, "m8"))) == [[1, 1]]
    assert await r.hmget(other, "msg_id", "sent_msg_id") == [b"m8", b"m9"]


async def test_a_done_key_replays_its_stored_reply(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k4")
    await r.hset(
        rec,
        mapping={
            "done": "1",
            "reply": b"\x91\x01",
            "fence": 3,
            "status": "succeeded",
            "agent_id": "w-1",
            "msg_id": "m1",
        },
    )
    got = await scripts.call(r, "claim", [rec], _args(OWNER_B, (60_000, "m9")))
    # The stored bytes and the record's fields the reply is rebuilt from.
    assert got == [[2, b"\x91\x01", b"succeeded", b"w-1", b"m1"]]
    assert await r.hget(rec, "fence") == b"3"  # nothing was claimed


async def test_a_batch_answers_each_key_in_order(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    fresh, held, done = k.idem("b1"), k.idem("b2"), k.idem("b3")
    await scripts.call(r, "claim", [held], _args(OWNER_B, (60_000, "x")))
    await r.hset(done, mapping={"done": "1", "reply": b"R"})
    got = await scripts.call(
        r, "claim", [fresh, held, done], _args(OWNER_A, (1_000, "m1"), (1_000, "m2"), (1_000, "m3"))
    )
    assert got == [[1, 1], [3, OWNER_B.encode()], [2, b"R", b"", b"", b""]]
    # Each key's own lease and msg_id were written, not its neighbour's.
    assert await r.hget(fresh, "msg_id") == b"m1"
    assert await r.hget(held, "msg_id") == b"x"


# Numbers the runtime never sends: not plain digits, not finite, or out of range.
BAD_INTS = [
    "",
    "abc",
    "nan",
    "inf",
    "-inf",
    "1e309",
    "1e3",
    "-5",
    "0",
    "1.5",
    " 5",
    "0x10",
    "007",
    str(10**16),
]


def _mutated(args: list[object], at: int, value: object) -> list[object]:
    out = list(args)
    out[at] = value
    return out


def _bad_calls() -> list[tuple[str, int | None, object]]:
    # (what, ARGV index (0-based) to replace, value); index None: the count is wrong
    calls: list[tuple[str, int | None, object]] = []
    calls += [("ttl_ms", 1, v) for v in BAD_INTS]
    calls += [("lease_ms", 10, v) for v in [*BAD_INTS, str(8 * 86_400_000)]]  # the 3rd key's
    calls += [("max_takeovers", 3, v) for v in ["-1", "1000001", "1.5", "", "x"]]
    calls += [
        ("owner", 0, ""),
        ("agent_id", 2, ""),
        ("arguments", None, "drop"),
        ("arguments", None, "extra"),
    ]
    return calls


@pytest.mark.parametrize(("what", "at", "value"), _bad_calls())
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, what: str, at: int | None, value: object
) -> None:
    k = Keys(ns)
    free, held, done = k.idem("f"), k.idem("h"), k.idem("d")
    await scripts.call(r, "claim", [held], _args(OWNER_B, (60_000, "x")))
    await r.hset(done, mapping={"done": "1", "reply": b"R", "fence": 2})
    args = _args(OWNER_A, (1_000, "m1"), (1_000, "m2"), (1_000, "m3"))
    if at is not None:
        args = _mutated(args, at, value)
    elif value == "drop":
        args = args[:-1]
    else:
        args = [*args, "1000"]
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: bad {what}"):
        await scripts.call(r, "claim", [free, held, done], args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_key_that_is_not_a_hash_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    free, wrong = k.idem("f"), k.idem("w")
    await r.set(wrong, "not a record")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=r"^reach: bad KEYS\[2\]: holds a string"):
        await scripts.call(r, "claim", [free, wrong], _args(OWNER_A, (1_000, "m1"), (1_000, "m2")))
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_record_with_unreadable_numbers_is_claimed_with_a_fresh_fence(
    r: AnyRedis, ns: str
) -> None:
    # Written behind the scripts' back: HINCRBY cannot count on these, nor compare a lease.
    k = Keys(ns)
    recs = [k.idem(f"u{i}") for i in range(4)]
    bad = [("fence", "abc"), ("fence", "-3"), ("runs", "1.5"), ("lease_until", "soon")]
    for rec, (field, value) in zip(recs, bad, strict=True):
        await r.hset(rec, mapping={"owner": OWNER_B, "fence": 4, "runs": 1, field: value})
    got = await scripts.call(
        r, "claim", recs, _args(OWNER_A, *[(1_000, f"m{i}") for i in range(4)])
    )
    assert [code for code, _ in got] == [1, 1, 1, 1]
    secs, _ = await r.time()
    # An unreadable fence restarts from the server time in ms: above any fence handed out.
    for (_, fence), (field, _) in zip(got, bad, strict=True):
        if field == "fence":
            assert int(fence) > (secs - 60) * 1000
        else:
            assert int(fence) == 5
    assert await r.hget(recs[2], "runs") == b"1"
    assert [await r.hget(rec, "owner") for rec in recs] == [OWNER_A.encode()] * 4


async def test_the_counters_are_written_as_plain_integers(r: AnyRedis, ns: str) -> None:
    # The claim writes fence and runs in its one HSET, counted as HINCRBY counts: plain
    # decimal integers, exact up to the largest stored value a claim counts on (15 digits).
    k = Keys(ns)
    fresh, big = k.idem("fresh"), k.idem("big")
    await r.hset(big, mapping={"fence": "999999999999999", "runs": "41"})
    got = await scripts.call(r, "claim", [fresh, big], _args(OWNER_A, (1_000, "m1"), (1_000, "m2")))
    assert got == [[1, 1], [1, 1_000_000_000_000_000]]
    assert await r.hmget(fresh, "fence", "runs") == [b"1", b"1"]
    assert await r.hmget(big, "fence", "runs") == [b"1000000000000000", b"42"]
    # The next claim (the lease ran out: a takeover of the same owner) counts on from there.
    [[code, fence]] = await scripts.call(
        r, "claim", [fresh], _args(OWNER_B, (1_000, "m1", OWNER_A))
    )
    assert (code, fence) == (1, 2) and await r.hget(fresh, "runs") == b"2"


# -- takeover_from: ending the claim of an owner judged gone, in the claim itself ---------


async def test_a_takeover_ends_the_gone_owners_claim_and_claims(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("t1")
    await scripts.call(r, "claim", [rec], _args(OWNER_B, (600_000, "m1")))
    got = await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1", OWNER_B)))
    assert got == [[1, 2]]  # claimed in the same call, with a higher fence
    h = await r.hgetall(rec)
    assert h[b"owner"] == OWNER_A.encode() and h[b"runs"] == b"2"
    # The gone owner's late completion is fenced: its fence (1) no longer matches.
    done = [1, "succeeded", b"R", "done", ""]
    assert await scripts.call(r, "complete", [rec], [TTL_MS, *done]) == [0]


async def test_a_fresh_claim_by_a_third_owner_stands(r: AnyRedis, ns: str) -> None:
    # The runtime read "w-1/old" as the owner and judged it gone; meanwhile a third owner
    # took the key over. Its fresh claim must stand: BUSY with that owner, nothing written.
    rec = Keys(ns).idem("t2")
    await r.hset(rec, mapping={"owner": "w-1/old", "lease_until": 10**13, "fence": 1, "runs": 1})
    await r.hset(rec, mapping={"owner": "w-3/i3", "fence": 2, "runs": 2})  # the race
    before = await snapshot(r, ns)
    got = await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1", "w-1/old")))
    assert got == [[3, b"w-3/i3"]]
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_takeover_never_skips_a_done_key(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("t3")
    await r.hset(
        rec, mapping={"owner": "", "lease_until": 0, "fence": 3, "done": "1", "reply": b"R"}
    )
    got = await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1", "w-1/old")))
    assert got == [[2, b"R", b"", b"", b""]]
    assert await r.hget(rec, "fence") == b"3"


async def test_a_takeover_of_a_free_or_absent_key_is_a_plain_claim(r: AnyRedis, ns: str) -> None:
    # The owner completed (or its lease ran out) since it was read, or the record expired:
    # nobody holds the key, so it is claimed as without takeover_from.
    k = Keys(ns)
    released, expired, absent = k.idem("t4"), k.idem("t5"), k.idem("t6")
    await r.hset(released, mapping={"owner": "", "lease_until": 0, "fence": 2})
    await r.hset(expired, mapping={"owner": "w-3/i3", "lease_until": 1, "fence": 5})
    got = await scripts.call(
        r,
        "claim",
        [released, expired, absent],
        _args(OWNER_A, (1_000, "m1", "w-1/old"), (1_000, "m2", "w-1/old"), (1_000, "m3", "")),
    )
    assert got == [[1, 3], [1, 6], [1, 1]]


async def test_a_takeover_from_oneself_reclaims_a_key_nothing_runs(r: AnyRedis, ns: str) -> None:
    # This runtime's own claim, whose handler is not running here (its claim or settle
    # failed): the runtime passes its own owner and runs the key again.
    rec = Keys(ns).idem("t7")
    await scripts.call(r, "claim", [rec], _args(OWNER_A, (600_000, "m1")))
    assert await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1"))) == [
        [3, OWNER_A.encode()]
    ]
    got = await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1", OWNER_A)))
    assert got == [[1, 2]]


async def test_takeover_from_is_per_key(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    a, b = k.idem("t8"), k.idem("t9")
    for rec in (a, b):
        await scripts.call(r, "claim", [rec], _args(OWNER_B, (600_000, "x")))
    got = await scripts.call(
        r, "claim", [a, b], _args(OWNER_A, (1_000, "m1", OWNER_B), (1_000, "m2"))
    )
    assert got == [[1, 2], [3, OWNER_B.encode()]]


async def test_a_cancelled_key_is_never_claimed(r: AnyRedis, ns: str) -> None:
    # cancel.lua wrote 'cancelled': no claim runs it, a takeover neither; nothing is written.
    rec = Keys(ns).idem("cancelled")
    await r.hset(rec, mapping={"status": "cancelled", "owner": OWNER_A, "fence": 4})
    before = await r.hgetall(rec)
    got = await scripts.call(
        r, "claim", [rec, rec], _args(OWNER_B, (5_000, "m1"), (5_000, "m1", OWNER_A))
    )
    assert [list(a) for a in got] == [[4, b""], [4, b""]]
    assert await r.hgetall(rec) == before


async def test_a_run_taken_over_past_max_takeovers_is_poisoned_not_claimed(
    r: AnyRedis, ns: str
) -> None:
    rec = Keys(ns).idem("k-poison")

    def args(owner: str, takeover_from: str, max_takeovers: int) -> list[object]:
        a = _args(owner, (60_000, "m1", takeover_from))
        a[3] = max_takeovers
        return a

    assert await scripts.call(r, "claim", [rec], args(OWNER_A, "", 1)) == [[1, 1]]
    # A's run never ended: B takes it over (1 takeover, within the bound)...
    assert await scripts.call(r, "claim", [rec], args(OWNER_B, OWNER_A, 1)) == [[1, 2]]
    assert (await r.hmget(rec, "runs", "takeovers")) == [b"2", b"1"]
    # ...and B's run never ended either: one more takeover would pass it.
    got = await scripts.call(r, "claim", [rec], args(OWNER_A, OWNER_B, 1))
    assert got == [[5, 2, 2]]  # 2 runs, 2 claims that never ended
    h = await r.hgetall(rec)
    assert h[b"status"] == b"dead" and h[b"owner"] == b"" and h[b"runs"] == b"2"
    assert h[b"takeovers"] == b"2"
    assert int(h[b"fence"]) == 3  # B's late completion (fence 2) is fenced
    assert b"poisoned" in h[b"error"]
    # A new claim (a replay of its dead letter) is no takeover: it runs.
    assert await scripts.call(r, "claim", [rec], args(OWNER_B, "", 1)) == [[1, 4]]


async def test_a_claim_made_at_send_counts_its_run_when_taken_over(r: AnyRedis, ns: str) -> None:
    # send.lua's claim (runs 0): its runtime may have started the handler unconfirmed
    rec = Keys(ns).idem("k-sent")
    await r.hset(rec, mapping={"fence": 1, "runs": 0, "owner": OWNER_A, "lease_until": 0})
    a = _args(OWNER_B, (60_000, "m1"))
    assert await scripts.call(r, "claim", [rec], a) == [[1, 2]]
    # runs counts what is known to have started; the unconfirmed run is a takeover
    assert (await r.hmget(rec, "runs", "takeovers")) == [b"1", b"1"]
    assert await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1", OWNER_B))) == [
        [1, 3]
    ]
    assert await scripts.call(r, "claim", [rec], [*a[:3], 1, 60_000, "m1", OWNER_A]) == [[5, 2, 3]]


async def test_a_claim_after_a_completion_is_no_takeover(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k-free")
    await r.hset(rec, mapping={"fence": 5, "runs": 2, "owner": "", "lease_until": 0})
    a = _args(OWNER_B, (60_000, "m1"))
    a[3] = 0
    assert await scripts.call(r, "claim", [rec], a) == [[1, 6]]
    assert (await r.hmget(rec, "runs", "takeovers")) == [b"3", None]  # 0: not written


async def test_a_claim_announces_running_and_a_poisoned_one_dead(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    rec, quiet = Keys(ns).idem("k-announced"), Keys(ns).idem("k-quiet")
    await r.hset(rec, "watched", 1)  # what watch.lua writes
    async with listening(redis_url, quiet) as heard:  # not watched: nothing announced
        assert await scripts.call(r, "claim", [quiet], _args(OWNER_A, (60_000, "m2"))) == [[1, 1]]
        assert await heard() == []
    busy = _args(OWNER_B, (60_000, "m1"))
    poison = _args(OWNER_B, (60_000, "m1", OWNER_A))
    poison[3] = 0
    async with listening(redis_url, rec) as heard:
        assert await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1"))) == [[1, 1]]
        assert (await scripts.call(r, "claim", [rec], busy))[0][0] == 3  # BUSY: no change
        assert (await scripts.call(r, "claim", [rec], poison))[0][0] == 5
        assert await heard() == [b"running", b"dead"]

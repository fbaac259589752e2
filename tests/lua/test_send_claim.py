"""send.lua's claim at send (issue 11): the first send of a key, routed to a runtime, is
claimed for that runtime in the same step (its entry names the owner and the lease), so
the runtime can start the handler without a claim round trip. A resend, the batch form
and a call without an owner never claim."""

from __future__ import annotations

import time

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis, connect
from reach.keys import Keys
from reach.scripts import inbox
from reach.scripts.codes import ClaimCode

pytestmark = pytest.mark.anyio

TTL_MS = 60_000
OWNER = "w-1/inst-a"


def msg(i: int, key: str = "") -> inbox.Message:
    return inbox.Message(b"ENV%d" % i, "cap", 1, f"m{i}", key or f"m{i}", key)


async def test_a_first_send_is_claimed_for_the_runtime_named(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    before = int(time.time() * 1000)
    call = inbox.send_call(
        k, msg(1), agent_id="w-1", priority="normal", ttl_ms=TTL_MS, claim_for=OWNER,
        claim_lease_ms=5_000,
    )  # fmt: skip
    sent = await call.run(r)
    [(entry_id, fields)] = await r.xrange(k.inbox("w-1", "normal"))
    assert sent.entry_id == entry_id.decode()
    assert fields[b"e"] == b"ENV1" and fields[b"c"] == OWNER.encode()
    until = int(fields[b"l"])
    assert before + 5_000 - 1_000 <= until <= int(time.time() * 1000) + 5_000 + 1_000
    h = await r.hgetall(k.idem("m1"))
    # Claimed as claim.lua claims (fence 1, owner, lease; no runs: absent reads as 0, and
    # the run is counted when it happens),
    # still 'pending' until the runtime starts it (start.lua).
    assert h[b"status"] == b"pending" and h[b"fence"] == b"1" and b"runs" not in h
    assert h[b"owner"] == OWNER.encode() and int(h[b"lease_until"]) == until
    assert h[b"agent_id"] == b"w-1"
    # Neither sent_msg_id nor msg_id: the record is named by the msg_id.
    assert b"sent_msg_id" not in h and b"msg_id" not in h
    assert h[b"capability"] == b"cap" and h[b"attempt"] == b"1"
    assert 0 < await r.pttl(k.idem("m1")) <= TTL_MS


async def test_a_first_send_under_a_callers_key_stores_its_msg_id(r: AnyRedis, ns: str) -> None:
    # The record's name does not say the msg_id then: the field does.
    k = Keys(ns)
    await inbox.send_call(
        k, msg(4, "order-4"), agent_id="w-1", priority="normal", ttl_ms=TTL_MS,
        claim_for=OWNER, claim_lease_ms=5_000,
    ).run(r)  # fmt: skip
    h = await r.hgetall(k.idem("order-4"))
    assert h[b"msg_id"] == b"m4" and b"sent_msg_id" not in h


async def test_another_runtime_finds_the_claim_held(r: AnyRedis, ns: str) -> None:
    # The claim made at send is a claim like any other: a second owner meets BUSY, the
    # owner named completes with fence 1.
    k = Keys(ns)
    await inbox.send_call(
        k, msg(2), agent_id="w-1", priority="normal", ttl_ms=TTL_MS, claim_for=OWNER,
        claim_lease_ms=60_000,
    ).run(r)  # fmt: skip
    [got] = await scripts.call(
        r, "claim", [k.idem("m2")], ["w-1/inst-b", TTL_MS, "w-1", 3, 1000, "m2", ""]
    )
    assert got[0] == ClaimCode.BUSY and got[1] == OWNER.encode()


async def test_a_resend_of_a_key_is_not_claimed(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.hset(k.idem("order-1"), mapping={"status": "succeeded", "done": "1", "fence": "3"})
    await inbox.send_call(
        k, msg(3, "order-1"), agent_id="w-1", priority="high", ttl_ms=TTL_MS, claim_for=OWNER,
        claim_lease_ms=60_000,
    ).run(r)  # fmt: skip
    [(_, fields)] = await r.xrange(k.inbox("w-1", "high"))
    assert fields == {b"e": b"ENV3"}
    h = await r.hgetall(k.idem("order-1"))
    assert h[b"status"] == b"succeeded" and h[b"fence"] == b"3" and b"owner" not in h
    assert await r.get(k.task("m3")) == b"order-1"


async def test_no_owner_means_no_claim(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await inbox.send_call(k, msg(4), agent_id="w-1", priority="low", ttl_ms=TTL_MS).run(r)
    await scripts.call(
        r, "send", [k.inbox("w-1", "low"), k.idem("m5"), k.task("m5")],
        [b"ENV5", "cap", 1, "m5", "", TTL_MS, 0, "", 1000],
    )  # fmt: skip
    for _, fields in await r.xrange(k.inbox("w-1", "low")):
        assert fields.keys() == {b"e"}
    for key in ("m4", "m5"):
        h = await r.hgetall(k.idem(key))
        assert h[b"status"] == b"pending" and b"owner" not in h and b"fence" not in h


async def test_a_bounded_inbox_at_its_bound_refuses_without_claiming(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await inbox.send_call(k, msg(6), agent_id="w-2", priority="normal", ttl_ms=TTL_MS,
                          max_queue=1).run(r)  # fmt: skip
    sent = await inbox.send_call(
        k, msg(7), agent_id="w-2", priority="normal", ttl_ms=TTL_MS, max_queue=1,
        claim_for="w-2/i", claim_lease_ms=1000,
    ).run(r)  # fmt: skip
    assert sent.refused and sent.depth == 1
    assert await r.exists(k.idem("m7")) == 0


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["w-1/i"], r"want 6, 7 or 9 ARGV"),  # 8 ARGV
        (["w-1", 1000], r"claim for \(ARGV\[8\]\) w-1: want '<agent_id>/<instance_id>'"),
        (["w-1/", 1000], r"claim for \(ARGV\[8\]\) w-1\?: want"),
        (["ab", 1000], r"claim for \(ARGV\[8\]\): want 3..1024 bytes"),
        (["w-1/i", 0], r"claim lease_ms \(ARGV\[9\]\) 0: want an integer 1..604800000"),
        (["w-1/i", "1e3"], r"claim lease_ms \(ARGV\[9\]\) 1e3"),
        (["w-1/i", 604800001], r"claim lease_ms"),
    ],
)
async def test_bad_claim_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, extra: list[object], why: str
) -> None:
    k = Keys(ns)
    keys = [k.inbox("w-1", "normal"), k.idem("m9"), k.task("m9")]
    with pytest.raises(ResponseError, match=why):
        await scripts.call(r, "send", keys, [b"ENV", "cap", 1, "m9", "", TTL_MS, 0, *extra])
    assert await r.exists(*keys) == 0


async def test_the_batch_form_claims_each_fresh_key(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.hset(k.idem("old"), mapping={"status": "succeeded", "done": "1", "fence": "4"})
    msgs = [(msg(20), "normal"), (msg(21, "old"), "high"), (msg(22), "low")]
    call = inbox.send_batch_call(
        k, msgs, agent_id="w-1", ttl_ms=TTL_MS, claim_for=OWNER, claim_lease_ms=30_000
    )
    assert len(call.args) == 5 * 3 + 4  # the claim's two ARGV after ARGV[7]
    sent = await call.run(r)
    assert all(not s.refused for s in sent)
    for m, priority in msgs:
        [(_, fields)] = await r.xrange(k.inbox("w-1", priority))
        h = await r.hgetall(k.idem(m.key))
        if m.key == "old":  # a resend of a done key: neither claimed nor marked
            assert fields == {b"e": m.data}
            assert h[b"status"] == b"succeeded" and h[b"fence"] == b"4" and b"owner" not in h
        else:
            assert fields[b"e"] == m.data and fields[b"c"] == OWNER.encode()
            assert h[b"owner"] == OWNER.encode() and h[b"fence"] == b"1"
            assert h[b"status"] == b"pending" and int(h[b"lease_until"]) == int(fields[b"l"])
    # Without a claim the batch form is as before: 5 ARGV a message after the first's 7.
    plain = inbox.send_batch_call(k, [(msg(23), "normal"), (msg(24), "normal")],
                                  agent_id="w-2", ttl_ms=TTL_MS)  # fmt: skip
    assert len(plain.args) == 12
    await plain.run(r)
    for _, fields in await r.xrange(k.inbox("w-2", "normal")):
        assert fields.keys() == {b"e"}


async def test_a_batch_with_a_bad_claim_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    # Two priorities: the batch form's layout (one priority for all takes the compact one).
    call = inbox.send_batch_call(
        k, [(msg(30), "normal"), (msg(31), "high")], agent_id="w-1", ttl_ms=TTL_MS,
        claim_for="no-slash", claim_lease_ms=1000,
    )  # fmt: skip
    with pytest.raises(ResponseError, match=r"claim for \(ARGV\[8\]\) no-slash"):
        await call.run(r)
    assert await r.exists(*k.inboxes("w-1"), k.idem("m30"), k.idem("m31")) == 0
    # 7 + 2 + 5 + 1 ARGV fits neither layout.
    with pytest.raises(ResponseError, match=r"want 6, 7 or 9 ARGV, or 7 \(or 9\) and 5 per"):
        await scripts.call(r, "send", list(call.keys), [*call.args, "x"])


async def claimed_batch(r: AnyRedis, k: Keys, msgs: list[inbox.Message]) -> list[inbox.Sent]:
    call = inbox.send_batch_call(
        k, [(m, "normal") for m in msgs], agent_id="w-1", ttl_ms=TTL_MS, claim_for=OWNER,
        claim_lease_ms=30_000,
    )  # fmt: skip
    sent = await call.run(r)
    assert not any(s.refused for s in sent)
    return sent


async def test_the_batchs_fresh_records_are_written_alike_and_each_keeps_the_ttl(
    r: AnyRedis, ns: str
) -> None:
    # After the first, each fresh record of the same capability and attempt is a COPY of
    # it: the same fields, and its own TTL (COPY carries it; there is no PEXPIRE of it).
    k = Keys(ns)
    msgs = [msg(i) for i in range(40, 46)]
    await claimed_batch(r, k, msgs)
    first = await r.hgetall(k.idem("m40"))
    assert first[b"owner"] == OWNER.encode() and first[b"status"] == b"pending"
    assert b"msg_id" not in first and b"runs" not in first
    for m in msgs:
        assert await r.hgetall(k.idem(m.key)) == first
        assert 0 < await r.pttl(k.idem(m.key)) <= TTL_MS
    entries = await r.xrange(k.inbox("w-1", "normal"))
    assert [f[b"e"] for _, f in entries] == [m.data for m in msgs]


async def test_a_record_is_copied_only_from_one_of_the_same_capability_and_attempt(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)

    def m(i: int, cap: str, attempt: int, key: str = "") -> inbox.Message:
        return inbox.Message(b"ENV%d" % i, cap, attempt, f"m{i}", key or f"m{i}", key)

    msgs = [
        m(50, "cap.a", 1),
        m(51, "cap.a", 1),
        m(52, "cap.b", 1),  # another capability
        m(53, "cap.b", 2),  # another attempt
        m(54, "cap.b", 2, "order-54"),  # a caller's key: the record holds its msg_id
        m(55, "cap.b", 2),  # copied from m53, not from the keyed record
        m(56, "cap.a", 1),
    ]
    await claimed_batch(r, k, msgs)
    for x in msgs:
        h = await r.hgetall(k.idem(x.key))
        assert h[b"capability"] == x.capability.encode(), x.msg_id
        assert h[b"attempt"] == str(x.attempt).encode(), x.msg_id
        assert h[b"owner"] == OWNER.encode() and h[b"fence"] == b"1"
        assert (h.get(b"msg_id") == b"m54") if x.key == "order-54" else b"msg_id" not in h
        assert 0 < await r.pttl(k.idem(x.key)) <= TTL_MS
    assert await r.get(k.task("m54")) == b"order-54"


async def test_a_record_named_twice_in_a_batch_is_not_copied_over(r: AnyRedis, ns: str) -> None:
    # m60's record is named again by a later message under a caller's key "m60" (a record
    # of the same name, holding that message's msg_id): written over as before, it is no
    # longer what the batch's next fresh records may copy.
    k = Keys(ns)
    again = inbox.Message(b"ENV-again", "cap", 1, "m69", "m60", "m60")
    sent = await claimed_batch(r, k, [msg(60), msg(61), again, msg(62)])
    assert len({s.entry_id for s in sent}) == 4  # every entry added
    assert (await r.hgetall(k.idem("m60")))[b"msg_id"] == b"m69"
    for key in ("m61", "m62"):
        h = await r.hgetall(k.idem(key))
        assert b"msg_id" not in h and h[b"owner"] == OWNER.encode()
        assert 0 < await r.pttl(k.idem(key)) <= TTL_MS


async def test_a_user_without_copy_gets_every_record_written(
    r: AnyRedis, ns: str, redis_url: str
) -> None:
    # An ACL user set up before reach's roles held COPY: the batch writes each record with
    # an HSET instead of failing.
    user = f"nocopy-{ns}"
    await r.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
        commands=["+@all", "-copy"],
    )  # fmt: skip
    limited = await connect(redis_url.replace("redis://", f"redis://{user}:pw@"))
    try:
        k = Keys(ns)
        msgs = [msg(i) for i in range(70, 74)]
        await claimed_batch(limited, k, msgs)
        first = await r.hgetall(k.idem("m70"))
        for m in msgs:
            assert await r.hgetall(k.idem(m.key)) == first
            assert 0 < await r.pttl(k.idem(m.key)) <= TTL_MS
    finally:
        await limited.aclose()
        await r.acl_deluser(user)

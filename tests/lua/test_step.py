"""step.lua: a durable step's result is journaled in the message's idempotency record only
while the run that made it holds the claim (owner and fence, not done); the first result of
a name stays; the journal is bounded; a completion with mode 'done' deletes the journal,
'release' keeps it for the next run."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts import delivery, inbox
from reach.scripts.codes import SettleCode, StepCode
from reach.scripts.delivery import Completion, Mode, SettleItem
from reach.scripts.steps import MAX_STEPS, NAME_MAX_BYTES, RESULT_MAX_BYTES, step_call
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

OWNER = "w-1/inst-a"
TTL_MS = 60_000


async def claimed(r: AnyRedis, key: str, *, owner: str = OWNER, takeover_from: str = "") -> int:
    """Claim record ``key`` for ``owner`` with claim.lua: the claim's fence."""
    [got] = await delivery.claim(
        r,
        [delivery.ClaimItem(key, 60_000, "m", takeover_from)],
        cluster=False,
        owner=owner,
        ttl_ms=TTL_MS,
        agent_id=owner.split("/")[0],
        max_takeovers=10,
    )
    assert not isinstance(got, Exception) and got.code == scripts.ClaimCode.RUN, got
    return got.fence


async def step(r: AnyRedis, key: str, fence: int, name: str, result: bytes, owner: str = OWNER):  # type: ignore[no-untyped-def]
    return await step_call(key, owner=owner, fence=fence, name=name, result=result).run(r)


async def journal(r: AnyRedis, key: str) -> dict[bytes, bytes]:
    """The record's journal fields: each ``s:<name>`` and ``steps``."""
    h = await r.hgetall(key)
    return {f: v for f, v in h.items() if f.startswith(b"s:") or f == b"steps"}


async def test_the_claim_holder_journals_and_the_first_result_of_a_name_stays(
    r: AnyRedis, ns: str
) -> None:
    key = Keys(ns).idem("m1")
    fence = await claimed(r, key)
    ttl = await r.pttl(key)
    before = await r.hgetall(key)
    first = await step(r, key, fence, "charge", b"\x01")
    assert (first.code, first.count) == (StepCode.JOURNALED, 1)
    second = await step(r, key, fence, "ship", b"\xa2ok")
    assert (second.code, second.count) == (StepCode.JOURNALED, 2)
    again = await step(r, key, fence, "charge", b"\x02")
    assert (again.code, again.stored) == (StepCode.KEPT, b"\x01"), "the first result stays"
    assert await journal(r, key) == {b"s:charge": b"\x01", b"s:ship": b"\xa2ok", b"steps": b"2"}
    after = await r.hgetall(key)
    for f in (b"s:charge", b"s:ship", b"steps"):
        del after[f]
    assert after == before, "nothing but the journal changes"
    assert await r.pttl(key) <= ttl, "the TTL is the claim's"


async def test_a_claim_made_at_send_is_held_by_its_owner_with_fence_1(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    m = inbox.Message(data=b"env", capability="cap", attempt=1, msg_id="m2", key="m2")
    call = inbox.send_call(
        k, m, agent_id="w-1", priority="normal", ttl_ms=TTL_MS, claim_for=OWNER, claim_lease_ms=9000
    )
    await call.run(r)
    key = k.idem("m2")
    assert await r.hmget(key, "owner", "fence") == [OWNER.encode(), b"1"]
    got = await step(r, key, 1, "charge", b"\x01")
    assert got.code == StepCode.JOURNALED


async def test_a_stale_run_writes_nothing(r: AnyRedis, ns: str) -> None:
    """A run whose claim was taken over (another owner, a higher fence), a run of the same
    owner with an older fence, a cancelled, done or missing record: FENCED, nothing written
    (and a missing record is not created)."""
    k = Keys(ns)
    taken = k.idem("taken")
    old = await claimed(r, taken)
    new = await claimed(r, taken, owner="w-2/inst-b", takeover_from=OWNER)
    assert new == old + 1
    snap = await snapshot(r, ns)
    assert (await step(r, taken, old, "charge", b"\x01")).code == StepCode.FENCED
    assert (await step(r, taken, new, "charge", b"\x01")).code == StepCode.FENCED, "not the owner"
    assert_unchanged(snap, await snapshot(r, ns))
    # the new owner's own write goes through
    assert (await step(r, taken, new, "charge", b"\x01", "w-2/inst-b")).code == StepCode.JOURNALED

    cancelled = k.idem("cancelled")
    fence = await claimed(r, cancelled)
    from reach.scripts.cancelling import cancel_call

    await cancel_call(cancelled, msg_id="m", error="cancelled", ttl_ms=TTL_MS).run(r)
    done = k.idem("done")
    fence_done = await claimed(r, done)
    await delivery.complete_call(
        [(Completion(done, fence_done, "succeeded", Mode.DONE), b"\x91\xc0")], ttl_ms=TTL_MS
    ).run(r)
    gone = k.idem("gone")
    snap = await snapshot(r, ns)
    assert (await step(r, cancelled, fence, "charge", b"\x01")).code == StepCode.FENCED
    assert (await step(r, done, fence_done, "charge", b"\x01")).code == StepCode.FENCED
    assert (await step(r, gone, 1, "charge", b"\x01")).code == StepCode.FENCED
    assert_unchanged(snap, await snapshot(r, ns))


async def test_the_journal_holds_at_most_max_steps(r: AnyRedis, ns: str) -> None:
    key = Keys(ns).idem("full")
    fence = await claimed(r, key)
    for i in range(MAX_STEPS):
        got = await step(r, key, fence, f"s{i}", b"\x01")
        assert (got.code, got.count) == (StepCode.JOURNALED, i + 1)
    before = await r.hgetall(key)
    over = await step(r, key, fence, "one-more", b"\x01")
    assert (over.code, over.count) == (StepCode.FULL, MAX_STEPS)
    assert await r.hgetall(key) == before
    # a name journaled already still answers with its result
    kept = await step(r, key, fence, "s0", b"\x02")
    assert (kept.code, kept.stored) == (StepCode.KEPT, b"\x01")


async def test_done_deletes_the_journal_and_release_keeps_it(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    rel, done, plain = k.idem("rel"), k.idem("done2"), k.idem("plain")
    f_rel, f_done, f_plain = [await claimed(r, key) for key in (rel, done, plain)]
    for key, fence in ((rel, f_rel), (done, f_done)):
        await step(r, key, fence, "charge", b"\x01")
        await step(r, key, fence, "ship", b"\x02")
    codes = await delivery.complete_call(
        [
            (Completion(rel, f_rel, "retrying", Mode.RELEASE, "boom"), b""),
            (Completion(done, f_done, "succeeded", Mode.DONE), b"\x91\xc0"),
            (Completion(plain, f_plain, "succeeded", Mode.DONE), b"\x91\xc0"),
        ],
        ttl_ms=TTL_MS,
    ).run(r)
    assert codes == [SettleCode.SETTLED] * 3
    assert await journal(r, rel) == {b"s:charge": b"\x01", b"s:ship": b"\x02", b"steps": b"2"}
    assert await journal(r, done) == {}
    assert await r.hget(done, "reply") == b"\x91\xc0"
    assert await journal(r, plain) == {}, "a record without steps gets no journal field"
    # the next run of the released key (a retry) finds the journal and adds to it
    f_next = await claimed(r, rel)
    assert (await step(r, rel, f_next, "ship", b"\x03")).stored == b"\x02"
    assert (await step(r, rel, f_next, "pack", b"\x04")).count == 3


async def test_settle_done_deletes_the_journal(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    key = k.idem("settled")
    fence = await claimed(r, key)
    await step(r, key, fence, "charge", b"\x01")
    item = SettleItem(
        inbox="",
        entry_id="",
        completion=Completion(key, fence, "succeeded", Mode.DONE, stored=b"\x91\xc0"),
    )
    assert await delivery.settle_call([item], ttl_ms=TTL_MS).run(r) == [SettleCode.SETTLED]
    assert await journal(r, key) == {}
    assert await r.hmget(key, "done", "reply") == [b"1", b"\x91\xc0"]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([OWNER, 1, "a"], r"want 1 KEYS and 4 ARGV, got 1 and 3"),
        ([OWNER, 1, "a", b"\x01", "x"], r"want 1 KEYS and 4 ARGV"),
        (["", 1, "a", b"\x01"], r"owner \(ARGV\[1\]\): want 1..1024 bytes"),
        (["o" * 1025, 1, "a", b"\x01"], r"owner \(ARGV\[1\]\): want 1..1024 bytes"),
        ([OWNER, 0, "a", b"\x01"], r"fence \(ARGV\[2\]\) 0"),
        ([OWNER, "01", "a", b"\x01"], r"fence \(ARGV\[2\]\) 01"),
        ([OWNER, 2**54, "a", b"\x01"], r"fence \(ARGV\[2\]\)"),
        ([OWNER, 1, "", b"\x01"], rf"name \(ARGV\[3\]\): want 1..{NAME_MAX_BYTES} bytes"),
        ([OWNER, 1, "n" * (NAME_MAX_BYTES + 1), b"\x01"], r"name \(ARGV\[3\]\)"),
        ([OWNER, 1, "a", b""], rf"result \(ARGV\[4\]\): want 1..{RESULT_MAX_BYTES} bytes"),
        ([OWNER, 1, "a", b"x" * (RESULT_MAX_BYTES + 1)], r"result \(ARGV\[4\]\)"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, args: list[object], why: str
) -> None:
    key = Keys(ns).idem("bad")
    await claimed(r, key)
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match=why):
        await scripts.call(r, "step", [key], args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_two_keys_are_refused(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    with pytest.raises(ResponseError, match=r"want 1 KEYS and 4 ARGV, got 2"):
        await scripts.call(r, "step", [k.idem("a"), k.idem("b")], [OWNER, 1, "a", b"\x01"])


async def test_a_key_of_another_type_is_refused(r: AnyRedis, ns: str) -> None:
    key = Keys(ns).idem("str")
    await r.set(key, "x")
    with pytest.raises(ResponseError, match=r"KEYS\[1\]: holds a string, want a hash"):
        await step(r, key, 1, "charge", b"\x01")
    assert await r.get(key) == b"x"

"""renew.lua: a runtime extends the claims of the handlers it still runs, only while the
claim is still its own (owner and fence) and the key not done; a renewal never shortens a
claim and changes nothing else."""

from __future__ import annotations

import time

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts import delivery

pytestmark = pytest.mark.anyio

OWNER = "w-1/inst-a"


async def claimed(r: AnyRedis, k: Keys, i: int, lease_ms: int = 1_000) -> tuple[str, int]:
    """A record claimed by OWNER with claim.lua: (its key, the claim's fence)."""
    key = k.idem(f"m{i}")
    [got] = await delivery.claim(
        r,
        [delivery.ClaimItem(key, lease_ms, f"m{i}", "")],
        cluster=False,
        owner=OWNER,
        ttl_ms=60_000,
        agent_id="w-1",
        max_takeovers=3,
    )
    assert not isinstance(got, Exception)
    return key, got.fence


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_a_running_claim_is_extended_and_nothing_else_changes(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    key, fence = await claimed(r, k, 1)
    before = await r.hgetall(key)
    t0 = now_ms()
    got = await delivery.renew_call([delivery.RenewItem(key, 30_000, fence)], owner=OWNER).run(r)
    assert got == [True]
    after = await r.hgetall(key)
    assert t0 + 29_000 <= int(after[b"lease_until"]) <= now_ms() + 31_000
    del before[b"lease_until"], after[b"lease_until"]
    assert after == before, "status, fence, runs and the rest stay as they were"


async def test_a_renewal_never_shortens_a_claim(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    key, fence = await claimed(r, k, 2, lease_ms=60_000)
    lease = await r.hget(key, "lease_until")
    got = await delivery.renew_call([delivery.RenewItem(key, 1_000, fence)], owner=OWNER).run(r)
    assert got == [True]
    assert await r.hget(key, "lease_until") == lease


async def test_only_an_unfinished_claim_of_this_owner_and_fence_is_renewed(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    recs = [await claimed(r, k, i) for i in range(3, 8)]
    # 4: done meanwhile; 5: taken over by another owner; 6: a later claim (fence + 1);
    # 7: gone. 3 is renewed.
    await r.hset(recs[1][0], mapping={"status": "succeeded", "done": "1"})
    await r.hset(recs[2][0], mapping={"owner": "w-1/inst-b"})
    await r.hset(recs[3][0], mapping={"fence": str(recs[3][1] + 1)})
    await r.delete(recs[4][0])
    before = [await r.hgetall(key) for key, _ in recs]
    items = [delivery.RenewItem(key, 30_000, fence) for key, fence in recs]
    got = await delivery.renew_call(items, owner=OWNER).run(r)
    assert got == [True, False, False, False, False]
    assert [await r.hgetall(key) for key, _ in recs[1:]] == before[1:], "left as they were"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([OWNER, 1000], r"want 1 KEYS or more and 1 \+ 2 per key ARGV"),
        (["", 1000, 1], r"owner \(ARGV\[1\]\): want 1..1024 bytes"),
        ([OWNER, 0, 1], r"lease_ms of KEYS\[1\] \(ARGV\[2\]\) 0"),
        ([OWNER, 604_800_001, 1], r"lease_ms of KEYS\[1\]"),
        ([OWNER, 1000, "01"], r"fence of KEYS\[1\] \(ARGV\[3\]\) 01"),
        ([OWNER, 1000, 0], r"fence of KEYS\[1\]"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, args: list[object], why: str
) -> None:
    k = Keys(ns)
    key, _ = await claimed(r, k, 10)
    before = await r.hgetall(key)
    with pytest.raises(ResponseError, match=why):
        await scripts.call(r, "renew", [key], args)
    assert await r.hgetall(key) == before


async def test_a_key_of_another_type_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    key, fence = await claimed(r, k, 11)
    lease = await r.hget(key, "lease_until")
    other = k.idem("not-a-hash")
    await r.set(other, "x")
    with pytest.raises(ResponseError, match=r"KEYS\[2\]: holds a string, want a hash"):
        await delivery.renew_call(
            [delivery.RenewItem(key, 30_000, fence), delivery.RenewItem(other, 1000, fence)],
            owner=OWNER,
        ).run(r)
    assert await r.hget(key, "lease_until") == lease

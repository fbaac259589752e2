"""start.lua: a runtime that started a handler on a claim send.lua made for it marks the
task running under its own lease, only while the claim is still as the entry said."""

from __future__ import annotations

import time

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts import delivery, inbox
from tests.lua.announced import listening

pytestmark = pytest.mark.anyio

TTL_MS = 60_000
OWNER = "w-1/inst-a"


async def claimed_at_send(r: AnyRedis, k: Keys, i: int) -> str:
    m = inbox.Message(b"ENV", "cap", 1, f"m{i}", f"m{i}")
    await inbox.send_call(
        k, m, agent_id="w-1", priority="normal", ttl_ms=TTL_MS, claim_for=OWNER,
        claim_lease_ms=60_000,
    ).run(r)  # fmt: skip
    return k.idem(f"m{i}")


async def test_a_claim_made_at_send_is_started_with_the_runtimes_lease(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    rec = await claimed_at_send(r, k, 1)
    t0 = int(time.time() * 1000)
    got = await delivery.start_call(
        [delivery.StartItem(rec, 2_000, 1)], owner=OWNER, ttl_ms=TTL_MS
    ).run(r)
    assert got == [True]
    h = await r.hgetall(rec)
    assert h[b"status"] == b"running" and h[b"fence"] == b"1" and h[b"owner"] == OWNER.encode()
    assert h[b"runs"] == b"1"  # its run, which the claim at send did not count
    assert t0 + 1_000 <= int(h[b"lease_until"]) <= int(time.time() * 1000) + 3_000
    assert int(h[b"updated_ms"]) >= t0 - 1_000


async def test_only_a_pending_claim_of_this_owner_and_fence_is_started(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    recs = [await claimed_at_send(r, k, i) for i in range(2, 7)]
    # 3: done meanwhile (the handler's settle came first); 4: another owner holds it; 5:
    # a later claim (fence 2); 6: gone. 2 stays as send.lua wrote it.
    await r.hset(recs[1], mapping={"status": "succeeded", "done": "1", "owner": ""})
    await r.hset(recs[2], mapping={"owner": "w-1/inst-b"})
    await r.hset(recs[3], mapping={"fence": "2"})
    await r.delete(recs[4])
    items = [delivery.StartItem(rec, 5_000, 1) for rec in recs]
    got = await delivery.start_call(items, owner=OWNER, ttl_ms=TTL_MS).run(r)
    assert got == [True, False, False, False, False]
    assert (await r.hget(recs[1], "status")) == b"succeeded"
    assert (await r.hget(recs[2], "status")) == b"pending"
    assert await r.exists(recs[4]) == 0  # not recreated


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([OWNER, TTL_MS, 1000], r"want 1 KEYS or more and 2 \+ 2 per key ARGV"),
        (["", TTL_MS, 1000, 1], r"owner \(ARGV\[1\]\): want 1..1024 bytes"),
        ([OWNER, 0, 1000, 1], r"ttl_ms \(ARGV\[2\]\) 0"),
        ([OWNER, TTL_MS, 0, 1], r"lease_ms of KEYS\[1\] \(ARGV\[3\]\) 0"),
        ([OWNER, TTL_MS, 1000, "01"], r"fence of KEYS\[1\] \(ARGV\[4\]\) 01"),
        ([OWNER, TTL_MS, 1000, "x"], r"fence of KEYS\[1\]"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, args: list[object], why: str
) -> None:
    k = Keys(ns)
    rec = await claimed_at_send(r, k, 10)
    before = await r.hgetall(rec)
    with pytest.raises(ResponseError, match=why):
        await scripts.call(r, "start", [rec], args)
    assert await r.hgetall(rec) == before


async def test_a_key_of_another_type_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    rec = await claimed_at_send(r, k, 11)
    other = k.idem("not-a-hash")
    await r.set(other, "x")
    with pytest.raises(ResponseError, match=r"KEYS\[2\]: holds a string, want a hash"):
        await delivery.start_call(
            [delivery.StartItem(rec, 1000, 1), delivery.StartItem(other, 1000, 1)],
            owner=OWNER,
            ttl_ms=TTL_MS,
        ).run(r)
    assert (await r.hget(rec, "status")) == b"pending"


async def test_a_start_is_announced_a_start_left_alone_not(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    k = Keys(ns)
    rec = await claimed_at_send(r, k, 12)
    await r.hset(rec, "watched", 1)
    async with listening(redis_url, rec) as heard:
        item = delivery.StartItem(rec, 2_000, 1)
        assert await delivery.start_call([item], owner=OWNER, ttl_ms=TTL_MS).run(r) == [True]
        assert await delivery.start_call([item], owner=OWNER, ttl_ms=TTL_MS).run(r) == [False]
        assert await heard() == [b"running"]

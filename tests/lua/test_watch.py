"""watch.lua: a record is marked watched (its changes are announced from then on), an
absent one is not created; anything out of contract is refused before any write."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts.watching import watch_call
from tests.lua.announced import listening
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio


async def test_a_record_is_marked_watched_and_keeps_its_ttl(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    rec = Keys(ns).idem("w1")
    await r.hset(rec, mapping={"status": "running", "fence": 1})
    await r.pexpire(rec, 60_000)
    async with listening(redis_url, rec) as heard:
        assert await watch_call(rec).run(r)
        assert await heard() == []  # marking announces nothing itself
        assert await watch_call(rec).run(r)  # a second watcher: the same
    assert await r.hgetall(rec) == {b"status": b"running", b"fence": b"1", b"watched": b"1"}
    assert 0 < await r.pttl(rec) <= 60_000


async def test_an_absent_record_is_not_created(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("w2")
    assert not await watch_call(rec).run(r)
    assert not await r.exists(rec)


async def test_bad_calls_are_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    rec, other = k.idem("w3"), k.idem("w4")
    await r.hset(rec, "status", "pending")
    await r.set(other, "x")
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match="want 1 KEYS and 0 ARGV"):
        await scripts.call(r, "watch", [rec], ["extra"])
    with pytest.raises(ResponseError, match="want 1 KEYS and 0 ARGV"):
        await scripts.call(r, "watch", [rec, rec], [])
    with pytest.raises(ResponseError, match=r"KEYS\[1\]: holds a string"):
        await scripts.call(r, "watch", [other], [])
    assert_unchanged(before, await snapshot(r, ns))

"""complete.lua: only the holder of the current fence settles a key; 'release' lets it run again."""

from __future__ import annotations

import pytest

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


async def _claim(r: AnyRedis, rec: str, owner: str) -> int:
    [[code, fence]] = await scripts.call(r, "claim", [rec], [owner, TTL_MS, "w", 60_000, "m1"])
    assert code == 1
    return int(fence)


def _item(fence: int, status: str, reply: bytes, mode: str, error: str = "") -> list[object]:
    return [fence, status, reply, mode, error]


async def test_done_stores_the_reply_and_ends_the_claim(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k1")
    fence = await _claim(r, rec, "w-1/i1")
    got = await scripts.call(
        r, "complete", [rec], [TTL_MS, *_item(fence, "succeeded", b"ok", "done")]
    )
    assert got == [1]
    h = await r.hgetall(rec)
    assert h[b"done"] == b"1" and h[b"reply"] == b"ok" and h[b"status"] == b"succeeded"
    assert h[b"owner"] == b"" and h[b"lease_until"] == b"0"
    # A second completion (a late duplicate) is refused: the first outcome stands.
    again = await scripts.call(
        r, "complete", [rec], [TTL_MS, *_item(fence, "failed", b"no", "done")]
    )
    assert again == [0]
    assert await r.hget(rec, "reply") == b"ok"


async def test_a_stale_fence_writes_nothing(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k2")
    old = await _claim(r, rec, "w-1/i1")
    await r.hset(rec, "lease_until", 0)  # the first owner's lease ran out
    new = await _claim(r, rec, "w-2/i2")
    assert new == old + 1
    late = await scripts.call(
        r, "complete", [rec], [TTL_MS, *_item(old, "succeeded", b"late", "done")]
    )
    assert late == [0]
    assert await r.hget(rec, "done") is None
    assert await r.hget(rec, "owner") == b"w-2/i2"
    assert await scripts.call(
        r, "complete", [rec], [TTL_MS, *_item(new, "succeeded", b"x", "done")]
    ) == [1]


async def test_release_records_the_status_but_lets_the_key_run_again(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k3")
    fence = await _claim(r, rec, "w-1/i1")
    args = [TTL_MS, *_item(fence, "retrying", b"", "release", "TimeoutError: slow")]
    assert await scripts.call(r, "complete", [rec], args) == [1]
    h = await r.hgetall(rec)
    assert b"done" not in h and h[b"status"] == b"retrying" and h[b"error"] == b"TimeoutError: slow"
    [[code, next_fence]] = await scripts.call(
        r, "claim", [rec], ["w-2/i2", TTL_MS, "w", 1_000, "m1"]
    )
    assert (code, next_fence) == (1, fence + 1)


async def test_a_missing_record_is_fenced(r: AnyRedis, ns: str) -> None:
    # The record expired (or Redis lost it): no completion may invent one.
    rec = Keys(ns).idem("gone")
    assert await scripts.call(
        r, "complete", [rec], [TTL_MS, *_item(1, "succeeded", b"x", "done")]
    ) == [0]
    assert await r.exists(rec) == 0


async def test_a_batch_settles_each_key_on_its_own(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    a, b = k.idem("ba"), k.idem("bb")
    fa = await _claim(r, a, "w-1/i1")
    await _claim(r, b, "w-1/i1")
    args = [TTL_MS, *_item(fa, "succeeded", b"A", "done"), *_item(99, "succeeded", b"B", "done")]
    assert await scripts.call(r, "complete", [a, b], args) == [1, 0]
    assert await r.hget(a, "reply") == b"A"
    assert await r.hget(b, "reply") is None

"""progress.lua: a running handler's progress goes into its record and out to the task's
watchers, only while the reporting run holds the record; anything out of contract is
refused before any write."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts.watching import progress_call
from tests.lua.announced import listening
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


async def _running(r: AnyRedis, rec: str) -> int:
    [[code, fence]] = await scripts.call(
        r, "claim", [rec], ["w-1/i1", TTL_MS, "w-1", 3, 60_000, "m1", ""]
    )
    assert code == 1
    return int(fence)


async def test_progress_is_recorded_and_announced(r: AnyRedis, redis_url: str, ns: str) -> None:
    rec = Keys(ns).idem("p1")
    fence = await _running(r, rec)
    ttl = await r.pttl(rec)
    async with listening(redis_url, rec) as heard:  # not watched yet: recorded, not announced
        assert await progress_call(rec, fence=fence, fraction="0.1", note="").run(r)
        assert await heard() == []
    await r.hset(rec, "watched", 1)
    async with listening(redis_url, rec) as heard:
        assert await progress_call(rec, fence=fence, fraction="0.25", note="reading").run(r)
        assert await progress_call(rec, fence=fence, fraction="1", note="").run(r)
        assert await heard() == [b"progress:0.25:reading", b"progress:1:"]
    h = await r.hgetall(rec)
    assert h[b"progress"] == b"1" and b"progress_note" not in h  # an empty note: deleted
    assert h[b"status"] == b"running" and int(h[b"updated_ms"]) > 0
    assert 0 < await r.pttl(rec) <= ttl  # its TTL is kept, not renewed


@pytest.mark.parametrize("case", ["stale fence", "done", "cancelled", "absent"])
async def test_a_run_that_does_not_hold_the_record_changes_nothing(
    r: AnyRedis, redis_url: str, ns: str, case: str
) -> None:
    rec = Keys(ns).idem("p2")
    fence = 0
    if case != "absent":
        fence = await _running(r, rec)
    if case == "stale fence":
        fence -= 1 if fence > 1 else -1
    elif case == "done":
        await r.hset(rec, mapping={"done": "1", "status": "succeeded"})
    elif case == "cancelled":
        await scripts.call(r, "cancel", [rec], ["m1", "by me", TTL_MS, 100])
        fence = int(await r.hget(rec, "fence") or 0)
    fence = max(fence, 1)
    before = await snapshot(r, ns)
    async with listening(redis_url, rec) as heard:
        assert not await progress_call(rec, fence=fence, fraction="0.5", note="x").run(r)
        assert await heard() == []
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_claim_made_at_send_takes_progress_while_pending(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("p3")
    await r.hset(rec, mapping={"status": "pending", "fence": 1, "owner": "w-1/i1"})
    assert await progress_call(rec, fence=1, fraction="0.5", note="early").run(r)
    assert await r.hmget(rec, "progress", "progress_note", "status") == [
        b"0.5",
        b"early",
        b"pending",
    ]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["0", "0.5", ""], r"fence \(ARGV\[1\]\)"),
        (["1", "1.5", ""], r"fraction \(ARGV\[2\]\)"),
        (["1", "-0.1", ""], r"fraction \(ARGV\[2\]\)"),
        (["1", "nan", ""], r"fraction \(ARGV\[2\]\)"),
        (["1", "0x1", ""], r"fraction \(ARGV\[2\]\)"),
        (["1", "0.12345678901", ""], r"fraction \(ARGV\[2\]\)"),
        (["1", "0.5", "n" * 513], r"note \(ARGV\[3\]\)"),
        (["1", "0.5"], "want 1 KEYS and 3 ARGV"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, args: list[object], why: str
) -> None:
    rec = Keys(ns).idem("p4")
    await _running(r, rec)
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match=why):
        await scripts.call(r, "progress", [rec], args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_key_of_another_type_is_refused(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("p5")
    await r.set(rec, "x")
    with pytest.raises(ResponseError, match=r"KEYS\[1\]: holds a string"):
        await scripts.call(r, "progress", [rec], ["1", "0.5", ""])
    assert await r.get(rec) == b"x"

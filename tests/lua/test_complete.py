"""complete.lua: only the holder of the current fence settles a key; 'release' lets it run again."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.lua.announced import listening
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


async def _claim(r: AnyRedis, rec: str, owner: str) -> int:
    [[code, fence]] = await scripts.call(
        r, "claim", [rec], [owner, TTL_MS, "w", 3, 60_000, "m1", ""]
    )
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
    # The claim's fields and an empty error are deleted, not written empty.
    assert b"owner" not in h and b"lease_until" not in h and b"error" not in h
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
        r, "claim", [rec], ["w-2/i2", TTL_MS, "w", 3, 1_000, "m1", ""]
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


# Numbers the runtime never sends: not plain digits, not finite, or out of range.
BAD_INTS = ["", "abc", "nan", "inf", "1e309", "1e3", "-5", "0", "1.5", " 5", "007", str(10**16)]


def _bad_calls() -> list[tuple[str, int | None, object]]:
    # (what, ARGV index (0-based) to replace, value); the second key's item is ARGV[6..10]
    calls: list[tuple[str, int | None, object]] = [("ttl_ms", 0, v) for v in BAD_INTS]
    calls += [("fence", 6, v) for v in BAD_INTS]
    calls += [("status", 7, v) for v in ["", "running", "pending", "SUCCEEDED", "ok"]]
    calls += [("mode", 9, v) for v in ["", "Done", "keep", "done "]]
    calls += [("arguments", None, "drop"), ("arguments", None, "extra")]
    return calls


@pytest.mark.parametrize(("what", "at", "value"), _bad_calls())
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, what: str, at: int | None, value: object
) -> None:
    k = Keys(ns)
    a, b = k.idem("a"), k.idem("b")
    fa, fb = await _claim(r, a, "w-1/i1"), await _claim(r, b, "w-1/i1")
    args = [TTL_MS, *_item(fa, "succeeded", b"A", "done"), *_item(fb, "dead", b"B", "release")]
    if at is not None:
        args[at] = value
    elif value == "drop":
        args = args[:-1]
    else:
        args = [*args, ""]
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: bad {what}"):
        await scripts.call(r, "complete", [a, b], args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_key_that_is_not_a_hash_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    a, wrong = k.idem("a"), k.idem("w")
    fa = await _claim(r, a, "w-1/i1")
    await r.rpush(wrong, "x")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=r"^reach: bad KEYS\[2\]: holds a list"):
        await scripts.call(
            r,
            "complete",
            [a, wrong],
            [TTL_MS, *_item(fa, "succeeded", b"A", "done"), *_item(1, "succeeded", b"B", "done")],
        )
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_completion_is_announced_a_fenced_one_not(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    rec = Keys(ns).idem("k-announced")
    fence = await _claim(r, rec, "w-1/i1")
    await r.hset(rec, "watched", 1)
    async with listening(redis_url, rec) as heard:
        args = [TTL_MS, *_item(fence, "retrying", b"", "release", "boom")]
        assert await scripts.call(r, "complete", [rec], args) == [1]
        stale = [TTL_MS, *_item(fence - 1 or fence + 1, "succeeded", b"ok", "done")]
        assert await scripts.call(r, "complete", [rec], stale) == [0]
        assert await heard() == [b"retrying"]


@pytest.mark.parametrize("mode", ["done", "release"])
@pytest.mark.parametrize("error", ["", "boom"])
@pytest.mark.parametrize("runs", ["0", "2", None])
@pytest.mark.parametrize("journal", [False, True])
async def test_every_shape_of_completion_leaves_the_record_it_describes(
    r: AnyRedis, ns: str, mode: str, error: str, runs: str | None, journal: bool
) -> None:
    # complete_record writes its common shape (done, no error, no journal) with calls of
    # its own and every other through one general path: both must leave the record
    # fence.lua's comment describes.
    rec = Keys(ns).idem("shape")
    start = {"status": "running", "fence": "4", "owner": "w-1/i1", "lease_until": "99",
             "error": "an earlier one", "capability": "c"}  # fmt: skip
    if runs is not None:
        start["runs"] = runs
    if journal:
        start |= {"steps": "1", "s:a": "x"}
    await r.hset(rec, mapping=start)
    args = [TTL_MS, *_item(4, "succeeded" if mode == "done" else "failed", b"R", mode, error)]
    assert await scripts.call(r, "complete", [rec], args) == [1]
    h = {k.decode(): v.decode() for k, v in (await r.hgetall(rec)).items()}
    want = {"status": "succeeded" if mode == "done" else "failed", "fence": "4",
            "capability": "c"}  # fmt: skip
    if error:
        want["error"] = error
    if mode == "done":
        want |= {"done": "1", "reply": "R"}
    elif journal:
        want |= {"steps": "1", "s:a": "x"}  # a released key runs again: its journal stays
    # No runs (a claim made at send) or runs 0 (as an older send.lua wrote it): the run
    # is counted now.
    want["runs"] = "1" if runs in ("0", None) else runs
    assert int(h.pop("updated_ms")) > 0
    assert h == want
    assert 0 < await r.pttl(rec) <= TTL_MS

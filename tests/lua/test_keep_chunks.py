"""keep_chunks.lua: a streaming handler's chunk entries kept for a resume, each chunk number
once (a redelivered run's repeats are not kept again), closed once the task ended, bounded
in chunks and bytes (the oldest entries go), with a TTL, announced to a watched record;
anything out of contract refused before any write."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts.codes import KeepCode
from reach.scripts.keeping import Kept, keep_call
from tests.lua.announced import listening
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

BIG = 10**9


async def keep(
    r: AnyRedis,
    ns: str,
    seq: int,
    n: int,
    entry: bytes = b"e",
    *,
    key: str = "m1",
    chunks: int = BIG,
    size: int = BIG,
    keep_ms: int = 60_000,
) -> Kept:
    k = Keys(ns)
    call = keep_call(
        k.idem(key),
        k.kept_chunks(key),
        [(seq, n, entry)],
        max_chunks=chunks,
        max_bytes=size,
        keep_ms=keep_ms,
    )
    return await call.run(r)


async def running(r: AnyRedis, ns: str, key: str = "m1") -> str:
    rec = Keys(ns).idem(key)
    await r.hset(rec, mapping={"status": "running", "fence": "1"})
    return rec


async def ids(r: AnyRedis, ns: str, key: str = "m1") -> list[bytes]:
    return [i for i, _ in await r.xrange(Keys(ns).kept_chunks(key))]


async def test_entries_are_kept_each_number_once(r: AnyRedis, ns: str) -> None:
    rec = await running(r, ns)
    assert await keep(r, ns, 0, 3, b"run1-a") == Kept(KeepCode.KEPT, 3, 1)
    assert await keep(r, ns, 3, 2, b"run1-b") == Kept(KeepCode.KEPT, 5, 1)
    # A second run starts again from 0: what it repeats is not kept again...
    assert await keep(r, ns, 0, 4, b"run2-a") == Kept(KeepCode.KNOWN, 5, 1)
    # ...an entry reaching past the kept numbers is kept, named by its first new chunk.
    assert await keep(r, ns, 4, 3, b"run2-b") == Kept(KeepCode.KEPT, 7, 1)
    # An entry starting past the kept numbers (no run writes one): not kept.
    assert await keep(r, ns, 9, 1, b"gap") == Kept(KeepCode.KNOWN, 7, 1)
    assert await ids(r, ns) == [b"3-1", b"5-4", b"7-6"]
    h = await r.hgetall(rec)
    assert (h[b"chunks"], h[b"chunks_from"]) == (b"7", b"1")
    assert int(h[b"chunks_bytes"]) == len(b"run1-a") + len(b"run1-b") + len(b"run2-b")
    assert 0 < await r.pttl(Keys(ns).kept_chunks("m1")) <= 60_000
    assert await r.ttl(rec) == -1  # the record's TTL is not touched


async def test_one_call_keeps_several_entries_in_order(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    rec = await running(r, ns)
    k = Keys(ns)
    await r.hset(rec, "watched", 1)
    entries = [(0, 2, b"a"), (2, 3, b"bb"), (0, 1, b"again"), (7, 1, b"gap"), (5, 1, b"c")]
    async with listening(redis_url, rec) as heard:
        got = await keep_call(
            rec, k.kept_chunks("m1"), entries, max_chunks=4, max_bytes=BIG, keep_ms=1000
        ).run(r)
        assert await heard() == [b"chunks:6"]  # one announcement per call
    # 6 chunks kept, at most 4 held: the entry of 1..2 went.
    assert got == Kept(KeepCode.KEPT, 6, 3)
    assert await ids(r, ns) == [b"5-3", b"6-6"]
    assert (await r.hgetall(rec))[b"chunks_bytes"] == b"3"


@pytest.mark.parametrize("status", ["succeeded", "dead", "expired", "cancelled", "done"])
async def test_an_ended_or_absent_record_keeps_nothing(r: AnyRedis, ns: str, status: str) -> None:
    rec = await running(r, ns)
    await keep(r, ns, 0, 2)
    if status == "done":
        await r.hset(rec, "done", "1")
    else:
        await r.hset(rec, "status", status)
    before = await snapshot(r, ns)
    assert await keep(r, ns, 2, 2) == Kept(KeepCode.CLOSED, 2, 1)
    assert_unchanged(before, await snapshot(r, ns))
    before = await snapshot(r, ns)
    assert (await keep(r, ns, 0, 1, key="absent")).code == KeepCode.CLOSED
    assert_unchanged(before, await snapshot(r, ns))


async def test_past_the_chunk_bound_the_oldest_entries_go(r: AnyRedis, ns: str) -> None:
    rec = await running(r, ns)
    for seq in range(0, 40, 10):
        await keep(r, ns, seq, 10, b"x" * 10, chunks=25)
    # 40 chunks written, at most 25 held: the entries of 1..10 and 11..20 went.
    assert await ids(r, ns) == [b"30-21", b"40-31"]
    h = await r.hgetall(rec)
    assert (h[b"chunks"], h[b"chunks_from"], h[b"chunks_bytes"]) == (b"40", b"21", b"20")


async def test_past_the_bytes_bound_the_oldest_entries_go(r: AnyRedis, ns: str) -> None:
    rec = await running(r, ns)
    for seq in range(5):
        await keep(r, ns, seq, 1, b"y" * 100, size=250)
    assert await ids(r, ns) == [b"4-4", b"5-5"]
    h = await r.hgetall(rec)
    assert (h[b"chunks_from"], h[b"chunks_bytes"]) == (b"4", b"200")
    # An entry larger than the bound on its own: nothing is held, the numbers go on.
    assert await keep(r, ns, 5, 1, b"z" * 300, size=250) == Kept(KeepCode.KEPT, 6, 7)
    assert await ids(r, ns) == []
    h = await r.hgetall(rec)
    assert (h[b"chunks"], h[b"chunks_from"], h[b"chunks_bytes"]) == (b"6", b"7", b"0")
    assert await keep(r, ns, 6, 1, b"w", size=250) == Kept(KeepCode.KEPT, 7, 7)
    assert await ids(r, ns) == [b"7-7"]


async def test_a_stream_left_by_an_earlier_record_of_the_key_is_dropped(
    r: AnyRedis, ns: str
) -> None:
    await running(r, ns)
    await r.xadd(Keys(ns).kept_chunks("m1"), {"r": b"old"}, id="90-1")
    assert await keep(r, ns, 0, 2, b"new") == Kept(KeepCode.KEPT, 2, 1)
    assert await ids(r, ns) == [b"2-1"]


async def test_a_stream_that_expired_between_two_writes_held_nothing(r: AnyRedis, ns: str) -> None:
    rec = await running(r, ns)
    for seq in range(3):
        await keep(r, ns, seq, 1, b"y" * 100, size=250)
    await r.delete(Keys(ns).kept_chunks("m1"))  # as its TTL does
    # The bytes it held are not counted any more: the new entry stays.
    assert await keep(r, ns, 3, 1, b"z" * 100, size=250) == Kept(KeepCode.KEPT, 4, 4)
    assert await ids(r, ns) == [b"4-4"]
    assert (await r.hgetall(rec))[b"chunks_bytes"] == b"100"


async def test_a_watched_record_announces_each_entry_kept(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    rec = await running(r, ns)
    async with listening(redis_url, rec) as heard:
        await keep(r, ns, 0, 2)
        assert await heard() == []  # not watched: nothing announced
        await r.hset(rec, "watched", 1)
        await keep(r, ns, 2, 3)
        await keep(r, ns, 0, 1)  # nothing new: nothing announced
        assert await heard() == [b"chunks:5"]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ((-1, 1), "seq"),
        ((0, 0), "n"),
        ((0, 70000), "n"),
        ((0, 1, b""), "entry"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, args: tuple[int, ...], why: str
) -> None:
    await running(r, ns)
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match=f"reach: bad {why}"):
        await keep(r, ns, *args)  # type: ignore[arg-type]
    with pytest.raises(ResponseError, match="reach: bad max chunks"):
        await keep(r, ns, 0, 1, chunks=0)
    with pytest.raises(ResponseError, match="reach: bad keep ms"):
        await keep(r, ns, 0, 1, keep_ms=0)
    k = Keys(ns)
    for entries in ([], [(i, 1, b"x") for i in range(257)]):
        with pytest.raises(ResponseError, match="reach: bad arguments"):
            await keep_call(
                k.idem("m1"), k.kept_chunks("m1"), entries, max_chunks=1, max_bytes=1, keep_ms=1
            ).run(r)
    assert_unchanged(before, await snapshot(r, ns))
    await r.set(Keys(ns).idem("str"), "x")
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match="want an idempotency record"):
        await keep(r, ns, 0, 1, key="str")
    assert_unchanged(before, await snapshot(r, ns))

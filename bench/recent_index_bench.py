"""What the index of recent messages (reach.recent) costs the hot path: the same settled
batches written by ``settle.lua`` with and without the index's rows, alternating.

    .venv/bin/python bench/recent_index_bench.py [--batch 64] [--pairs 1000]

An embedded Redis. Each batch is what a worker settles: ``--batch`` inbox entries read by
a consumer group, each with its claimed idempotency record completed (succeeded, the
reply stored), its reply published, and acked. Batches come in pairs of the same shape,
one settled without the index and one with it (``recent_maxlen`` as the runtime's
default), in alternating order. Redis's own time is read from ``INFO commandstats`` (the
``evalsha`` usec of each settle call alone), so it is the server's work, not the round
trip; the index's cost is the median of the pairs' differences, which a loaded machine
weighs on alike. Then Redis's CPU time (``INFO cpu``: user + sys, which waiting for a
core does not inflate) over blocks of settle calls without and with the index, the
batches made before each block is timed. The worker's own cost, building and
packing the rows of a batch (reach._worker.recording.recent_rows), is timed in this
process. ``--coalesce``: the rows go through the runtime's RecentIndex, which holds a
small batch's rows and writes them with a later call (then the mean difference is the
one to read: most calls carry no rows). Printed: per message, Redis µs without / with
the index and the difference (median, mean), the
worker's µs, and the index's bytes per message in Redis (``MEMORY USAGE`` of the stream
after the run, over the rows it holds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import anyio

from reach import scripts
from reach._worker.items import Delivery
from reach._worker.recording import RecentIndex, recent_rows
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.envelope import Envelope, encode, encode_payload, new_id, now_ms
from reach.keys import GROUP, Keys
from reach.outcomes import Settled, Status
from reach.recent import RECENT_MAXLEN, unpack
from reach.scripts import delivery
from reach.scripts.delivery import ClaimItem, Completion, Mode

NS = "bench-recent"
TTL_MS = 60_000


async def _evalsha_usec(r: AnyRedis) -> tuple[int, int]:
    stats = await r.info("commandstats")
    s = stats.get("cmdstat_evalsha", {})
    return int(s.get("usec", 0)), int(s.get("calls", 0))


async def _batch(r: AnyRedis, keys: Keys, n: int, round_: int) -> list[Delivery]:
    """``n`` read entries with claimed records, ready to settle as succeeded."""
    inbox = keys.inbox("bench-1", "normal")
    envs = [
        Envelope(
            msg_id=new_id(),
            capability="bench.echo",
            payload=encode_payload({"text": "hello world", "n": i, "round": round_}),
            reply_to="c-1",
            sent_ms=now_ms(),
        )
        for i in range(n)
    ]
    pipe = r.pipeline(transaction=False)
    for env in envs:
        pipe.xadd(inbox, {"e": encode(env)})
    await pipe.execute()
    got = await r.xreadgroup(GROUP, "bench-1", {inbox: ">"}, count=n)
    entries = got[0][1]
    claims = await delivery.claim(
        r,
        [ClaimItem(keys.idem(e.key), 60_000, e.msg_id) for e in envs],
        cluster=False,
        owner="bench-1/i",
        ttl_ms=TTL_MS,
        agent_id="bench-1",
    )
    out = []
    for env, (entry_id, _), c in zip(envs, entries, claims, strict=True):
        assert not isinstance(c, Exception)
        it = Delivery(stream=inbox, entry_id=entry_id, env=env, idem=keys.idem(env.key))
        it.fence = c.fence
        it.started_ms = now_ms()
        it.complete = Completion(it.idem, c.fence, Status.SUCCEEDED, Mode.DONE)
        it.answer(keys, b"R" * 40, publish=True)
        it.outcome = Settled.SUCCEEDED
        out.append(it)
    return out


async def _settle(
    r: AnyRedis, keys: Keys, items: list[Delivery], index: bool, held: RecentIndex | None
) -> int:
    """Settle ``items`` (with the index's rows or not; ``held``: as the runtime does,
    small batches' rows held and written with a later one): Redis's µs for the call."""
    recent = None
    if index:
        recent = held.take(items) if held else recent_rows(items, keys, "bench-1", RECENT_MAXLEN)
    u0, _ = await _evalsha_usec(r)
    codes = await delivery.settle_call(items, ttl_ms=TTL_MS, recent=recent).run(r)
    u1, _ = await _evalsha_usec(r)
    assert all(c == 1 for c in codes), codes
    return u1 - u0


async def _cpu_s(r: AnyRedis) -> float:
    info = await r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _cpu_blocks(
    r: AnyRedis, keys: Keys, batch: int, blocks: int, per_block: int, coalesce: bool
) -> tuple[float, float]:
    """Redis's CPU time (user + sys, getrusage: not inflated by waiting for a core the way
    wall time is) per message over blocks of ``per_block`` settle calls, without and with
    the index, alternating; the batches are made before each block is timed."""
    cpu: dict[bool, float] = {False: 0.0, True: 0.0}
    held = RecentIndex(keys, "bench-1", RECENT_MAXLEN) if coalesce else None
    for blk in range(blocks):
        for index in (blk % 2 == 0, blk % 2 != 0):
            ready = [await _batch(r, keys, batch, blk) for _ in range(per_block)]
            c0 = await _cpu_s(r)
            for items in ready:
                await _settle(r, keys, items, index, held)
            cpu[index] += await _cpu_s(r) - c0
    n = blocks * per_block * batch
    return cpu[False] * 1e6 / n, cpu[True] * 1e6 / n


async def run(url: str, batch: int, pairs: int, coalesce: bool) -> dict[str, Any]:
    r = await connect(url)
    keys = Keys(NS)
    await r.xgroup_create(keys.inbox("bench-1", "normal"), GROUP, id="0", mkstream=True)
    await scripts.call(r, "settle", [], [TTL_MS, GROUP, 0])  # loaded before timing
    without: list[float] = []
    with_: list[float] = []
    diffs: list[float] = []
    build_us: list[float] = []
    held = RecentIndex(keys, "bench-1", RECENT_MAXLEN) if coalesce else None
    try:
        for i in range(pairs):
            a, b = await _batch(r, keys, batch, i), await _batch(r, keys, batch, i)
            t0 = time.perf_counter()
            recent_rows(a, keys, "bench-1", RECENT_MAXLEN)
            build_us.append((time.perf_counter() - t0) * 1e6 / batch)
            # Each pair settles one batch each way, in alternating order: the machine's
            # load weighs on both alike, and the median of the differences is the index.
            if i % 2:
                x = await _settle(r, keys, a, True, held)
                y = await _settle(r, keys, b, False, held)
            else:
                y = await _settle(r, keys, b, False, held)
                x = await _settle(r, keys, a, True, held)
            with_.append(x / batch)
            without.append(y / batch)
            diffs.append((x - y) / batch)
        rows = sum(len(unpack(i, f)) for i, f in await r.xrange(keys.recent))
        mem = int(await r.memory_usage(keys.recent) or 0)
        cpu_without, cpu_with = await _cpu_blocks(
            r, keys, batch, 10, max(1, pairs // (10 * batch) * 4), coalesce
        )
    finally:
        await r.aclose()
    return {
        "batch": batch,
        "pairs": pairs,
        "redis_us_per_msg_without": round(statistics.median(without), 3),
        "redis_us_per_msg_with": round(statistics.median(with_), 3),
        "coalesced": coalesce,
        "redis_us_per_msg_index": round(statistics.median(diffs), 3),
        "redis_us_per_msg_index_mean": round(statistics.fmean(diffs), 3),
        "redis_cpu_us_per_msg_without": round(cpu_without, 3),
        "redis_cpu_us_per_msg_with": round(cpu_with, 3),
        "redis_cpu_us_per_msg_index": round(cpu_with - cpu_without, 3),
        "worker_us_per_msg_rows": round(statistics.median(build_us), 3),
        "index_bytes_per_row": round(mem / rows, 1) if rows else None,
        "rows_held": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--pairs", type=int, default=1000)
    p.add_argument(
        "--coalesce",
        action="store_true",
        help="hold small batches' rows as the runtime does (reach._worker.recording)",
    )
    a = p.parse_args()
    with RedisServer() as server:
        res = anyio.run(run, server.url, a.batch, a.pairs, a.coalesce)
    for k, v in res.items():
        print(f"{k:28} {v}")


if __name__ == "__main__":
    main()

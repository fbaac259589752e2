"""Client.send_many's enqueue rate on its own, against the floor's pipelined XADDs.

One embedded Redis; the benchmark's worker (``reach_cli.tools.bench:bench_agent``) is
started so that its agent is registered, then stopped (SIGSTOP), so nothing but the sends
runs: the caller and Redis. Per round, ``--messages`` messages go out ``FLOOR_BATCH`` (500)
per ``send_many`` call, one call at a time, as ``reach bench`` sends them, then the floor
(``reach_cli.tools.floor.stream``: XADD pipelined 500 per batch) sends as many. Printed
per round: both rates, their ratio, the caller's CPU and Redis's script time per message.
``reach bench --floor`` measures the same with the worker running (it competes for Redis
and the cores).

Run:  python bench/send_many_bench.py [--messages 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis
from reach_cli.tools import bench as b
from reach_cli.tools import floor

from reach import Client
from reach.embedded import RedisServer


async def run(url: str, n: int, rounds: int) -> None:
    r: Any = aredis.Redis.from_url(url)
    ratios = []
    async with Client(redis_url=url, namespace=b.NS) as c:
        await c.eligible(b.CAP)
        for k in range(rounds):
            await r.execute_command("CONFIG", "RESETSTAT")
            t0, c0 = time.perf_counter(), time.process_time()
            for start in range(0, n, b.FLOOR_BATCH):
                batch = [{"i": i} for i in range(start, min(start + b.FLOOR_BATCH, n))]
                out = await c.send_many(b.CAP, batch)
                if any(isinstance(x, Exception) for x in out):
                    raise RuntimeError(f"send_many: not all sent: {out[:3]!r}")
            reach_rate = n / (time.perf_counter() - t0)
            cpu_us = (time.process_time() - c0) * 1e6 / n
            stats = await r.info("commandstats")
            script_us = stats.get("cmdstat_evalsha", {}).get("usec", 0) / n
            t0 = time.perf_counter()
            await floor.stream(r, f"send-many-floor:{k}", n, batch=b.FLOOR_BATCH, reply_key="r")
            floor_rate = n / (time.perf_counter() - t0)
            ratios.append(reach_rate / floor_rate)
            print(
                f"round {k + 1}: send_many {reach_rate:,.0f} msgs/s enqueued (caller CPU "
                f"{cpu_us:.1f} µs, send.lua {script_us:.1f} µs per message), floor "
                f"{floor_rate:,.0f} msgs/s: {ratios[-1]:.2f}x",
                flush=True,
            )
    await r.aclose()
    print(f"median ratio {statistics.median(ratios):.2f}x (goal >= 0.80)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with (
        RedisServer() as server,
        tempfile.TemporaryDirectory() as tmp,
        b.reach_worker(server.url, Path(tmp) / "worker.log") as w,
    ):
        w.send_signal(signal.SIGSTOP)
        anyio.run(run, server.url, a.messages, a.rounds)


if __name__ == "__main__":
    main()

"""A worker process's own CPU per message, measured on its own: the streaming workload's
messages (claimed at send for the worker, as ``Client.send`` claims them), handled while
nothing else runs but Redis.

One embedded Redis and one ``reach worker`` process (``reach_cli.tools.bench:bench_agent``,
``--concurrency 64``). Each round: the worker is stopped (SIGSTOP), ``--messages`` no-op
messages go to its inbox through ``Client.send_many`` (500 per call; each one claimed at send
for the stopped worker, whose registration stays fresh over the short pause), then the
worker is continued and runs until its inbox is processed (its consumer group has read and
acked every entry). Printed per round and as medians: the worker's CPU (user + system, from
``/proc/<pid>/stat``) and Redis's (``INFO cpu``) per message over the drain, and the drain's
messages/s.

``reach bench`` measures the same parts with a caller sending at the same time, all three
processes sharing the two cores; this one leaves the worker a core of its own, so its figure
moves less from run to run: compare code with it (``PYTHONPATH=<other checkout>`` runs the
worker of another checkout, which inherits it), and quote ``reach bench`` for the ratios.

Run:  python bench/worker_cost.py [--messages 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
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
from reach.keys import Keys
from reach.scripts.delivery import GROUP

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def _redis_cpu_s(r: Any) -> float:
    cpu = await r.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


async def run(url: str, worker: Any, n: int, rounds: int) -> list[dict[str, float]]:
    r: Any = aredis.Redis.from_url(url)
    inbox = Keys(b.NS).inbox(b.AGENT_ID, "normal")
    out = []
    async with Client(redis_url=url, namespace=b.NS) as c:
        await c.eligible(b.CAP)
        for k in range(rounds):
            await b.send_stopped(c, worker, n)
            w0, r0, t0 = _cpu_s(worker.pid), await _redis_cpu_s(r), time.perf_counter()
            worker.send_signal(signal.SIGCONT)
            while await floor.remaining(r, inbox, GROUP):
                await anyio.sleep(0.005)
            seconds = time.perf_counter() - t0
            w1, r1 = _cpu_s(worker.pid), await _redis_cpu_s(r)
            row = {
                "msgs_per_s": n / seconds,
                "worker_us": (w1 - w0) * 1e6 / n,
                "redis_us": (r1 - r0) * 1e6 / n,
            }
            out.append(row)
            print(
                f"round {k + 1}: worker {row['worker_us']:.1f} µs/msg, Redis "
                f"{row['redis_us']:.1f} µs/msg, {row['msgs_per_s']:,.0f} msgs/s",
                flush=True,
            )
    await r.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000, help="messages per round")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with (
        RedisServer() as server,
        tempfile.TemporaryDirectory() as tmp,
        b.reach_worker(server.url, Path(tmp) / "worker.log") as w,
    ):
        rows = anyio.run(run, server.url, w, a.messages, a.rounds)
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print(
        f"medians of {a.rounds}: worker {med['worker_us']:.1f} µs/msg, Redis "
        f"{med['redis_us']:.1f} µs/msg, {med['msgs_per_s']:,.0f} msgs/s"
    )


if __name__ == "__main__":
    main()

"""A lone request's CPU, caller and worker, reach against the lean floor, in one run.

``reach bench --floor`` gives the request/reply latency of both (p50, p99) but CPU only
for streaming. This runs one embedded Redis with reach's benchmark worker (``reach worker``,
``--concurrency 64``) and the lean floor's worker (``reach_cli.tools.lean_floor``) side by
side, then alternates rounds of ``--requests`` sequential requests: reach's
(``Client.request`` of the no-op benchmark capability) and the lean floor's (one
``SEND_LUA`` call, then ``XREAD BLOCK`` on its reply stream). Per round: the caller's CPU
per request (getrusage, this process), the worker's (its ``/proc/<pid>/stat``: user +
system, in clock ticks of 10 ms, so rounds of a few thousand requests), and the round's
p50 latency.

What it shows on the 2-core VM: most of a lone request's CPU, in both, is the process
waking from its wait and the system calls around each round trip, not the Python between
them; the difference between reach and the lean floor is what reach's own steps add.

Printed: per system, the medians over ``--repeat`` rounds; then reach / lean floor.

Run:  python bench/request_cpu.py [--requests 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis
from reach_cli.tools import bench as b
from reach_cli.tools import lean_floor
from reach_cli.tools.bench.processes import _lean_worker_cmd, _wait_floor_ready

from reach import Client
from reach.embedded import RedisServer

LEAN_STREAM = "{lean-request-cpu}"
WARM = 300  # requests before each system's first round (connections, scripts, caches)

Round = dict[str, float]


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _round(one: Callable[[int], Awaitable[None]], worker_pid: int, n: int) -> Round:
    lat: list[float] = []
    c0, w0 = _self_cpu_s(), _proc_cpu_s(worker_pid)
    for i in range(n):
        t = time.perf_counter()
        await one(i)
        lat.append(time.perf_counter() - t)
    c1, w1 = _self_cpu_s(), _proc_cpu_s(worker_pid)
    return {
        "caller_us": (c1 - c0) / n * 1e6,
        "worker_us": (w1 - w0) / n * 1e6,
        "p50_us": statistics.median(lat) * 1e6,
    }


async def _measure(url: str, reach_pid: int, lean_pid: int, n: int, repeat: int) -> dict[str, Any]:
    await _wait_floor_ready(url, LEAN_STREAM)
    r: Any = aredis.Redis.from_url(url)
    sender = lean_floor.Sender(r, LEAN_STREAM)
    reply = lean_floor.reply_key(LEAN_STREAM, "caller")
    last = b"0-0"

    async def lean_one(i: int) -> None:
        nonlocal last
        last = await lean_floor.request(r, sender, reply, last, b"%d" % i)

    rounds: dict[str, list[Round]] = {"reach": [], "lean floor": []}
    try:
        async with Client(redis_url=url, namespace=b.NS) as c:
            await c.eligible(b.CAP)

            async def reach_one(i: int) -> None:
                await c.request(b.CAP, {"i": i})

            for i in range(WARM):
                await reach_one(i)
                await lean_one(i)
            for _ in range(repeat):  # alternated: a drift of the machine hits both
                rounds["reach"].append(await _round(reach_one, reach_pid, n))
                rounds["lean floor"].append(await _round(lean_one, lean_pid, n))
    finally:
        await r.aclose()
    return {
        name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in rounds.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="requests per round")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per system (medians)")
    a = ap.parse_args()
    if a.requests < 100 or a.repeat < 1:
        raise SystemExit("--requests must be >= 100 (the worker's CPU is read in 10 ms ticks)"
                         " and --repeat >= 1.")  # fmt: skip
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        lean = subprocess.Popen(
            _lean_worker_cmd(server.url, LEAN_STREAM),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with b.reach_worker(server.url, Path(tmp) / "worker.log") as w:
                got = anyio.run(_measure, server.url, w.pid, lean.pid, a.requests, a.repeat)
        finally:
            lean.terminate()
            lean.wait()
    print(f"a lone request, {a.requests} a round, medians of {a.repeat} alternated rounds:")
    print(f"  {'':11s} {'caller CPU':>11s} {'worker CPU':>11s} {'p50':>9s}")
    for name, f in got.items():
        print(
            f"  {name:11s} {f['caller_us']:8.1f} µs {f['worker_us']:8.1f} µs {f['p50_us']:6.0f} µs"
        )
    re_, le = got["reach"], got["lean floor"]

    def ratio(k: str) -> str:  # a worker's CPU of 0 ticks in a short round: no ratio
        return f"{re_[k] / le[k]:.2f}" if le[k] > 0 else "n/a"

    print(
        f"  reach / lean floor: caller {ratio('caller_us')}, worker {ratio('worker_us')}, "
        f"p50 {ratio('p50_us')}"
    )


if __name__ == "__main__":
    main()

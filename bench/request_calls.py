"""A lone request's Python function calls, counted (cProfile), in the caller and in the
worker, with the lean floor's caller beside reach's: the counted twin of
``bench/request_cpu.py``, whose timed figures move by a tenth between runs here.

- caller: ``--requests`` sequential ``Client.request`` calls of the benchmark capability,
  profiled in this process (after a warm-up), then as many lean floor requests (one
  ``SEND_LUA`` call, then ``XREAD BLOCK``) against the lean floor's worker;
- worker: one ``reach worker`` process of the benchmark agent under ``python -m
  cProfile``, once for ``--requests`` requests and once for twice as many: the difference
  per request is what one more request costs it (start-up and idle work cancel out).

Printed: calls per request, and per process the event loop's turns per request (calls of
``selectors.select``) and the limits on awaits (``reach._expiry.expire_after``) entered.

Run:  python bench/request_calls.py [--requests 1500]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis
from reach_cli.tools import bench as b
from reach_cli.tools import lean_floor
from reach_cli.tools.bench.processes import _lean_worker_cmd, _wait_floor_ready

from reach import Client
from reach.embedded import RedisServer

LEAN_STREAM = "{lean-request-calls}"
WARM = 200

Counts = dict[tuple[str, int, str], int]


def _counts(stats: Any) -> Counts:
    return {func: row[1] for func, row in stats.items()}  # row[1]: calls, recursive too


def _summary(per: dict[tuple[str, int, str], float]) -> tuple[float, float, float]:
    total = sum(per.values())
    turns = sum(v for (path, _, name), v in per.items() if name == "select" and "selectors" in path)
    limits = sum(
        v for (path, _, name), v in per.items() if name == "__enter__" and "_expiry" in path
    )
    return total, turns, limits


async def _reach_caller(url: str, n: int) -> Counts:
    async with Client(redis_url=url, namespace=b.NS) as c:
        await c.eligible(b.CAP)
        for i in range(WARM):
            await c.request(b.CAP, {"i": i})
        prof = cProfile.Profile()
        prof.enable()
        for i in range(n):
            await c.request(b.CAP, {"i": i})
        prof.disable()
    return _counts(pstats.Stats(prof).stats)  # type: ignore[attr-defined]


async def _lean_caller(url: str, n: int) -> Counts:
    await _wait_floor_ready(url, LEAN_STREAM)
    r: Any = aredis.Redis.from_url(url)
    sender = lean_floor.Sender(r, LEAN_STREAM)
    reply = lean_floor.reply_key(LEAN_STREAM, "caller")
    last = b"0-0"
    try:
        for i in range(WARM):
            last = await lean_floor.request(r, sender, reply, last, b"%d" % i)
        prof = cProfile.Profile()
        prof.enable()
        for i in range(n):
            last = await lean_floor.request(r, sender, reply, last, b"%d" % i)
        prof.disable()
    finally:
        await r.aclose()
    return _counts(pstats.Stats(prof).stats)  # type: ignore[attr-defined]


async def _requests(url: str, n: int) -> None:
    async with Client(redis_url=url, namespace=b.NS) as c:
        await c.eligible(b.CAP)
        for i in range(n):
            await c.request(b.CAP, {"i": i})


def _reach_worker(url: str, n: int, tmp: Path) -> Counts:
    out = tmp / f"worker-{n}.prof"
    profiled = ("-m", "cProfile", "-o", str(out))
    with b.reach_worker(url, tmp / f"worker-{n}.log", python_args=profiled):
        anyio.run(_requests, url, n)
    if not out.exists():
        raise SystemExit("the worker wrote no profile")
    return _counts(pstats.Stats(str(out)).stats)  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1500, help="requests counted")
    a = ap.parse_args()
    if a.requests < 100:
        raise SystemExit("--requests must be >= 100.")
    n = a.requests
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        with b.reach_worker(server.url, Path(tmp) / "w.log"):
            caller = anyio.run(_reach_caller, server.url, n)
        lean = subprocess.Popen(
            _lean_worker_cmd(server.url, LEAN_STREAM),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            lean_caller = anyio.run(_lean_caller, server.url, n)
        finally:
            lean.terminate()
            lean.wait()
        first = _reach_worker(server.url, n, Path(tmp))
        second = _reach_worker(server.url, 2 * n, Path(tmp))
    worker = {f: (second.get(f, 0) - first.get(f, 0)) / n for f in set(first) | set(second)}
    rows = {
        "reach caller": {f: v / n for f, v in caller.items()},
        "lean caller": {f: v / n for f, v in lean_caller.items()},
        "reach worker": worker,
    }
    print(f"a lone request's Python calls, {n:,} requests:")
    print(f"  {'':13s} {'calls':>8s} {'loop turns':>11s} {'limits':>7s}")
    for name, per in rows.items():
        total, turns, limits = _summary(per)
        print(f"  {name:13s} {total:8.1f} {turns:11.2f} {limits:7.2f}")


if __name__ == "__main__":
    main()

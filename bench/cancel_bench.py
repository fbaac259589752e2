"""How fast a cancel reaches a running handler: the time from ``client.cancel(msg_id)`` to
the handler seeing ``ctx.cancelled`` (``await ctx.wait_cancelled()`` returning), in a
``reach worker`` process of its own, and to the caller getting ``reach.Cancelled``.

    .venv/bin/python bench/cancel_bench.py [--samples 300] [--rounds 3] [--json]

One worker process (``bench.cancel_bench:agent``), one Client in this process, an embedded
Redis. Each sample: a request whose handler waits for its cancel; once it runs (it pushes
its msg_id to a list the bench BLPOPs), the bench takes the wall clock and cancels it; the
handler pushes the wall clock at which it saw ``ctx.cancelled`` (same host: one clock).
Printed per round and as the median over rounds: p50 and p99 (ms) of cancel -> handler
saw it, of cancel -> the caller's ``Cancelled``, and of the ``cancel()`` call itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from reach import Agent, Cancelled, Client, Context
from reach.embedded import RedisServer

ROOT = Path(__file__).resolve().parents[1]
CAP = "bench.hold"
STARTED, SAW = "cancel-bench:started", "cancel-bench:saw"


def agent() -> Agent:
    """The worker's agent: a handler that waits for its cancel and says when it saw it."""
    app = Agent("cancel-bench-1", capabilities=[CAP])

    @app.handler(CAP)
    async def hold(payload: Any, ctx: Context) -> str:
        await ctx.redis.lpush(STARTED, ctx.msg_id)
        with anyio.move_on_after(30):
            await ctx.wait_cancelled()
        await ctx.redis.lpush(SAW, f"{ctx.msg_id} {time.time() * 1000:.3f}")
        return "held"

    return app


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _worker(url: str, ns: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    cmd = [sys.executable, "-m", "reach_cli.app", "worker", "bench.cancel_bench:agent"]
    cmd += ["--redis-url", url, "--namespace", ns, "--log-level", "warning"]
    cmd += ["--cancel-grace-s", "30", "--concurrency", "4"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)


async def _round(url: str, ns: str, samples: int) -> dict[str, float]:
    saw_ms: list[float] = []
    told_ms: list[float] = []
    call_ms: list[float] = []
    async with Client(redis_url=url, namespace=ns) as client:
        r = client.redis
        with anyio.fail_after(60):
            while True:
                try:
                    await client.eligible(CAP)
                    break
                except Exception:  # noqa: BLE001 - not registered yet
                    client.invalidate()
                    await anyio.sleep(0.1)
        for i in range(samples + 20):  # the first 20 warm up
            e = client.build(CAP, None, timeout_s=60)
            told = anyio.Event()
            told_at = [0.0]

            async def call(e: Any = e, told: anyio.Event = told, at: list[float] = told_at) -> None:
                try:
                    await client.call(e)
                except Cancelled:
                    at[0] = time.time() * 1000
                told.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                started = await r.blpop([STARTED], timeout=30)
                assert started is not None and started[1].decode() == e.msg_id
                t0 = time.time() * 1000
                p0 = time.perf_counter()
                res = await client.cancel(e.msg_id)
                p1 = time.perf_counter()
                assert res.cancelled, res
                got = await r.blpop([SAW], timeout=30)
                assert got is not None
                msg_id, at = got[1].decode().split()
                assert msg_id == e.msg_id
                with anyio.fail_after(30):
                    await told.wait()
            if i >= 20:
                saw_ms.append(float(at) - t0)
                told_ms.append(told_at[0] - t0)
                call_ms.append((p1 - p0) * 1000)
    return {
        "saw_p50_ms": statistics.median(saw_ms),
        "saw_p99_ms": _pct(saw_ms, 0.99),
        "told_p50_ms": statistics.median(told_ms),
        "told_p99_ms": _pct(told_ms, 0.99),
        "cancel_call_p50_ms": statistics.median(call_ms),
        "cancel_call_p99_ms": _pct(call_ms, 0.99),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rounds: list[dict[str, float]] = []
    with RedisServer() as server:
        for k in range(a.rounds):
            ns = f"cancelbench{k}"
            proc = _worker(server.url, ns)
            try:
                res = anyio.run(_round, server.url, ns, a.samples)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            rounds.append(res)
            if not a.json:
                print(f"round {k + 1}: " + ", ".join(f"{n} {v:.2f}" for n, v in res.items()))
    med = {n: statistics.median(r[n] for r in rounds) for n in rounds[0]}
    if a.json:
        print(json.dumps({"rounds": rounds, "median": med}))
    else:
        print("median of rounds: " + ", ".join(f"{n} {v:.2f}" for n, v in med.items()))


if __name__ == "__main__":
    main()

"""Streamed results: time to first chunk and chunks per second.

A worker process of its own runs ``bench.stream``, an async-generator handler yielding
``n`` chunks (a short text each, like tokens) without waiting between them; one caller in
this process iterates ``Client.stream`` over it, sequentially. On its own redis-server
(a free port, no persistence), started and stopped here.

* time to first chunk: from the ``client.stream(...)`` call to the first chunk in the
  caller's hands, for streams of 100 chunks; shown beside a ``request()`` of a handler that
  returns at once (``bench.noop``), the round trip a first chunk cannot beat;
* chunks/s: a stream of ``n`` chunks (20,000 by default) from the call to its final result,
  chunks delivered divided by the time.

Both unsigned and with a shared secret (every chunk entry signed by the agent and checked
by the caller). Medians over the runs; the first runs of each kind are warm-up.

Run:  python bench/stream_bench.py [--runs 200] [--chunks 20000] [--secret-too]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

SECRET = "bench-secret-0123456789abcdef"


def worker(url: str, secret: str) -> None:
    from reach import Agent, Context

    app = Agent("bench-stream-1", capabilities=["bench.stream", "bench.noop"])

    @app.handler("bench.stream")
    async def stream(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        for i in range(payload["n"]):
            yield f"token {i} "
        ctx.result = payload["n"]

    @app.handler("bench.noop")
    async def noop(payload: Any, ctx: Context) -> Any:
        return payload

    signal.signal(signal.SIGTERM, lambda *_: app.stop())
    anyio.run(
        lambda: app.run(
            redis_url=url,
            namespace="bench",
            concurrency=8,
            handle_signals=False,
            secret=secret or None,
        )
    )


async def measure(url: str, runs: int, chunks: int, secret: str) -> dict[str, float]:
    from reach import Client
    from reach.errors import NoAgentAvailable

    async with Client(redis_url=url, namespace="bench", secret=secret or None) as c:
        with anyio.fail_after(30):
            while True:
                try:
                    await c.eligible("bench.stream")
                    break
                except NoAgentAvailable:
                    c.invalidate()
                    await anyio.sleep(0.05)
        for _ in range(50):  # warm-up: connections, scripts, code paths
            await c.request("bench.noop", 1)
            async for _chunk in c.stream("bench.stream", {"n": 100}):
                pass
        rtt, ttfc = [], []
        for i in range(runs):
            t0 = time.perf_counter()
            await c.request("bench.noop", i)
            rtt.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            s = c.stream("bench.stream", {"n": 100})
            first = 0.0
            got = 0
            async for _chunk in s:
                if not got:
                    first = time.perf_counter() - t0
                got += 1
            assert got == 100 and s.result == 100
            ttfc.append(first)
        rates = []
        for _ in range(max(3, runs // 20)):
            t0 = time.perf_counter()
            s = c.stream("bench.stream", {"n": chunks}, timeout_s=600)
            got = 0
            async for _chunk in s:
                got += 1
            assert got == chunks and s.result == chunks
            rates.append(chunks / (time.perf_counter() - t0))
    return {
        "request_rtt_ms": statistics.median(rtt) * 1000,
        "ttfc_ms": statistics.median(ttfc) * 1000,
        "ttfc_p99_ms": sorted(ttfc)[int(len(ttfc) * 0.99) - 1] * 1000,
        "chunks_per_s": statistics.median(rates),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="streams timed for the first chunk")
    ap.add_argument("--chunks", type=int, default=20_000, help="chunks of the long streams")
    ap.add_argument("--secret-too", action="store_true", help="also measure with signing")
    args = ap.parse_args()
    from reach.embedded import RedisServer

    modes = [("unsigned", "")] + ([("signed (HMAC)", SECRET)] if args.secret_too else [])
    print(f"python {' '.join(sys.argv)}  (runs={args.runs}, chunks={args.chunks})")
    print(f"{'mode':<15} {'request rtt':>12} {'first chunk':>12} {'p99':>9} {'chunks/s':>10}")
    with RedisServer() as srv:
        for name, secret in modes:
            p = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "worker", srv.url, secret]
            )
            try:
                m = anyio.run(measure, srv.url, args.runs, args.chunks, secret)
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
            print(
                f"{name:<15} {m['request_rtt_ms']:>9.3f} ms {m['ttfc_ms']:>9.3f} ms "
                f"{m['ttfc_p99_ms']:>6.2f} ms {m['chunks_per_s']:>10,.0f}"
            )


if __name__ == "__main__":
    main()

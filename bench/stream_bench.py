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

``--keep-compare``: the same, with the worker keeping the chunks for a resume (its default,
``keep_chunks.lua`` beside each entry) and not keeping them (``stream_keep_chunks=0``),
alternated ``--rounds`` times in one run (order reversed every other round), with Redis's
own CPU per chunk (``INFO cpu`` around the long streams) and the kept / not-kept ratios.
``--per-entry`` makes the handler wait a turn after each chunk's write could start, so
entries hold few chunks: the keep's cost per chunk at its worst.

Run:  python bench/stream_bench.py [--runs 200] [--chunks 20000] [--secret-too]
      python bench/stream_bench.py --keep-compare [--rounds 4] [--per-entry]
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
import anyio.lowlevel

SECRET = "bench-secret-0123456789abcdef"


def worker(url: str, secret: str, keep: int, per_entry: bool) -> None:
    from reach import Agent, Context
    from reach._emitting import KEEP_CHUNKS

    app = Agent("bench-stream-1", capabilities=["bench.stream", "bench.noop"])

    @app.handler("bench.stream")
    async def stream(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        for i in range(payload["n"]):
            yield f"token {i} "
            if per_entry:  # the write of this chunk goes out before the next is emitted
                await anyio.lowlevel.checkpoint()
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
            stream_keep_chunks=KEEP_CHUNKS if keep < 0 else keep,
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
        rates, cpu = [], []
        for _ in range(max(3, runs // 20)):
            cpu0 = await _redis_cpu_s(c)
            t0 = time.perf_counter()
            s = c.stream("bench.stream", {"n": chunks}, timeout_s=600)
            got = 0
            async for _chunk in s:
                got += 1
            assert got == chunks and s.result == chunks
            rates.append(chunks / (time.perf_counter() - t0))
            cpu.append((await _redis_cpu_s(c) - cpu0) / chunks)
    return {
        "request_rtt_ms": statistics.median(rtt) * 1000,
        "ttfc_ms": statistics.median(ttfc) * 1000,
        "ttfc_p99_ms": sorted(ttfc)[int(len(ttfc) * 0.99) - 1] * 1000,
        "chunks_per_s": statistics.median(rates),
        "redis_us_per_chunk": statistics.median(cpu) * 1e6,
    }


async def _redis_cpu_s(c: Any) -> float:
    """The CPU seconds the Redis server used so far (user + system, its main thread's)."""
    info = await c.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _run(url: str, secret: str, keep: int, per_entry: bool, runs: int, chunks: int) -> Any:
    args = [sys.executable, os.path.abspath(__file__), "worker", url, secret, str(keep)]
    p = subprocess.Popen(args + (["per-entry"] if per_entry else []))
    try:
        return anyio.run(measure, url, runs, chunks, secret)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


def _row(name: str, m: dict[str, float]) -> str:
    return (
        f"{name:<15} {m['request_rtt_ms']:>9.3f} ms {m['ttfc_ms']:>9.3f} ms "
        f"{m['ttfc_p99_ms']:>6.2f} ms {m['chunks_per_s']:>10,.0f} "
        f"{m['redis_us_per_chunk']:>10.2f}"
    )


def keep_compare(runs: int, chunks: int, rounds: int, per_entry: bool) -> None:
    from reach.embedded import RedisServer

    got: dict[str, list[dict[str, float]]] = {"kept": [], "not kept": []}
    with RedisServer() as srv:
        for r in range(rounds):
            order = [("kept", -1), ("not kept", 0)]
            for name, keep in order if r % 2 == 0 else order[::-1]:
                m = _run(srv.url, "", keep, per_entry, runs, chunks)
                got[name].append(m)
                print(_row(f"{name} #{r + 1}", m), flush=True)
    med = {k: {f: statistics.median(m[f] for m in v) for f in v[0]} for k, v in got.items()}
    for name, m in med.items():
        print(_row(f"{name} (median)", m))
    kept, bare = med["kept"], med["not kept"]
    print(
        f"kept / not kept: first chunk {kept['ttfc_ms'] / bare['ttfc_ms']:.2f}x, "
        f"chunks/s {kept['chunks_per_s'] / bare['chunks_per_s']:.2f}x, "
        f"Redis CPU per chunk {kept['redis_us_per_chunk'] / bare['redis_us_per_chunk']:.2f}x"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        keep = int(sys.argv[4]) if len(sys.argv) > 4 else -1
        worker(sys.argv[2], sys.argv[3], keep, "per-entry" in sys.argv[5:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="streams timed for the first chunk")
    ap.add_argument("--chunks", type=int, default=20_000, help="chunks of the long streams")
    ap.add_argument("--secret-too", action="store_true", help="also measure with signing")
    ap.add_argument("--keep-compare", action="store_true", help="chunks kept vs not kept")
    ap.add_argument("--rounds", type=int, default=4, help="--keep-compare: alternations")
    ap.add_argument("--per-entry", action="store_true", help="few chunks per entry")
    args = ap.parse_args()
    print(f"python {' '.join(sys.argv)}  (runs={args.runs}, chunks={args.chunks})")
    print(
        f"{'mode':<15} {'request rtt':>12} {'first chunk':>12} {'p99':>9} {'chunks/s':>10} "
        f"{'Redis µs/chunk':>14}"
    )
    if args.keep_compare:
        keep_compare(args.runs, args.chunks, args.rounds, args.per_entry)
        return
    from reach.embedded import RedisServer

    modes = [("unsigned", "")] + ([("signed (HMAC)", SECRET)] if args.secret_too else [])
    with RedisServer() as srv:
        for name, secret in modes:
            print(_row(name, _run(srv.url, secret, -1, args.per_entry, args.runs, args.chunks)))


if __name__ == "__main__":
    main()

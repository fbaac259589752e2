"""What durable steps (``ctx.step``) cost a request, and what they leave in Redis.

    .venv/bin/python bench/steps_bench.py [--requests 300] [--steps 0,1,5] [--json]

An embedded Redis and one agent in this process (its own thread and event loop). One
sequential caller sends ``--requests`` rounds of one request per step count, interleaved;
the handler runs that many
steps, each an async function returning a small dict (no outside effect: what is measured
is the journal, a read of the record before the first step and one ``step.lua`` call per
step). Printed per step count: the request's median and p99 time, the median's extra
over no step, per step. Then the completed records of each step count: ``MEMORY USAGE``,
fields and encoding (the journal is deleted with the completion, so a record with steps
should end as small as one without).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from typing import Any

import redis

import reach
from reach.connection import connect
from reach.embedded import RedisServer
from reach.keys import Keys
from reach.registry import Registry

NS = "bench-steps"
CAP = "steps.bench"


async def _work(i: int) -> dict[str, int]:
    return {"step": i}


def _agent() -> reach.Agent:
    app = reach.Agent("steps-1", capabilities=[CAP])

    @app.handler(CAP)
    async def run(payload: Any, ctx: reach.Context) -> Any:
        for i in range(int(payload["steps"])):
            await ctx.step(f"s{i}", _work, i)
        return payload["steps"]

    return app


async def _requests(
    url: str, counts: list[int], n: int
) -> dict[int, tuple[list[float], list[str]]]:
    """``n`` rounds of one request per step count, interleaved (a load that drifts over
    the run weighs on every count alike): each count's request times and msg_ids."""
    out: dict[int, tuple[list[float], list[str]]] = {k: ([], []) for k in counts}
    async with reach.Client(redis_url=url, namespace=NS) as c:
        for _ in range(n):
            for k in counts:
                env = c.build(CAP, {"steps": k}, timeout_s=30)
                t0 = time.perf_counter()
                got = await c.call(env)
                out[k][0].append(time.perf_counter() - t0)
                assert got == k, got
                out[k][1].append(env.msg_id)
    return out


def _wait_eligible(url: str) -> None:
    async def wait() -> None:
        r = await connect(url)
        try:
            for _ in range(600):
                if await Registry(r, NS).agents(CAP, ready=True):
                    return
                await asyncio.sleep(0.05)
        finally:
            await r.aclose()
        raise TimeoutError("the benchmark's agent did not become ready within 30 s")

    asyncio.run(wait())


def _records(r: redis.Redis, msg_ids: list[str]) -> dict[str, Any]:
    keys = [Keys(NS).idem(m) for m in msg_ids]
    sizes = [int(r.memory_usage(k, samples=0) or 0) for k in keys]
    fields = {int(r.hlen(k)) for k in keys}  # type: ignore[arg-type]
    enc = {str(r.object("encoding", k), "ascii") for k in keys}  # type: ignore[arg-type]
    return {
        "bytes_median": statistics.median(sizes),
        "fields": sorted(fields),
        "encodings": sorted(enc),
    }


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--steps", default="0,1,5")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.steps.split(",")]
    out: dict[str, Any] = {"requests": a.requests, "runs": {}}
    with RedisServer() as srv:
        app = _agent()
        t = threading.Thread(
            target=lambda: asyncio.run(
                app.run(redis_url=srv.url, namespace=NS, handle_signals=False)
            ),
            daemon=True,
        )
        t.start()
        _wait_eligible(srv.url)
        asyncio.run(_requests(srv.url, counts, 20))  # warm-up: connections, scripts loaded
        sync = redis.Redis.from_url(srv.url)
        measured = asyncio.run(_requests(srv.url, counts, a.requests))
        for k, (times, ids) in measured.items():
            out["runs"][k] = {
                "p50_ms": statistics.median(times) * 1000,
                "p99_ms": _p(times, 0.99) * 1000,
                "records": _records(sync, ids),
            }
        sync.close()
        app.stop()
        t.join(timeout=30)
    base = out["runs"].get(0, {}).get("p50_ms")
    for k, run in out["runs"].items():
        run["extra_per_step_ms"] = (run["p50_ms"] - base) / k if base is not None and k else 0.0
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    for k, run in out["runs"].items():
        rec = run["records"]
        print(
            f"{k:>3} steps: p50 {run['p50_ms']:.3f} ms, p99 {run['p99_ms']:.3f} ms, "
            f"+{run['extra_per_step_ms']:.3f} ms per step; completed record "
            f"{rec['bytes_median']:.0f} bytes, fields {rec['fields']}, {'/'.join(rec['encodings'])}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

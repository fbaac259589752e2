"""High-priority wait on an agent saturated with low-priority work, with and without
priority preemption (``RuntimeOptions.preempt_after_s``).

    .venv/bin/python bench/preempt_bench.py [--high 60] [--low-s 1.0] [--rounds 2] [--json]

An embedded Redis; one agent in this process (``--concurrency`` 4, no read-ahead) whose
``bench.low`` handler sleeps ``--low-s`` (a model call, say) and whose ``bench.high``
returns at once. Each run loads enough low-priority messages to keep every slot busy for
the whole run, then sends ``--high`` high-priority requests one after another, spaced
``--every-s``, and times each (send to result: its wait for a slot is most of it). Runs
alternate off / on (``preempt_after_s`` = ``--after-s``), ``--rounds`` times each, a fresh
namespace each. Printed per mode: the median over rounds of p50 and p99 (ms) of the high
requests, the low messages finished during the run, and the runs preempted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from functools import partial
from typing import Any

import anyio

from reach import Agent, Client, Context
from reach.embedded import RedisServer


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def one_run(
    url: str, ns: str, a: argparse.Namespace, after_s: float | None
) -> dict[str, float]:
    app = Agent("preempt-bench-1", capabilities=["bench.low", "bench.high"])
    finished = [0]

    @app.handler("bench.low")
    async def low(payload: Any, ctx: Context) -> None:
        await anyio.sleep(a.low_s)
        finished[0] += 1

    @app.handler("bench.high")
    async def high(payload: Any, ctx: Context) -> str:
        return "high"

    ready = threading.Event()
    run = partial(
        app.run,
        redis_url=url,
        namespace=ns,
        concurrency=a.concurrency,
        prefetch=0,
        preempt_after_s=after_s,
        sweep_interval_s=0.1,
        handle_signals=False,
        drain_timeout_s=0.1,
        ready_event=ready,
    )
    times: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        while not ready.is_set():
            await anyio.sleep(0.05)
        async with Client(redis_url=url, namespace=ns) as c:
            # Enough low work to keep every slot busy for the whole run (and then some).
            span_s = a.high * (a.every_s + a.low_s / 2)
            n_low = int(a.concurrency * span_s / a.low_s) + 2 * a.concurrency
            await c.send_many("bench.low", [None] * n_low, priority="low")
            await anyio.sleep(a.low_s / 2)  # every slot taken
            t_start = time.perf_counter()
            for _ in range(a.high):
                t = time.perf_counter()
                await c.request("bench.high", None, priority="high", timeout_s=60)
                times.append(time.perf_counter() - t)
                await anyio.sleep(a.every_s)
            elapsed = time.perf_counter() - t_start
        rt = app.runtime
        preempted = rt.preemption.preempted if rt is not None and rt.preemption else 0
        app.stop()
    return {
        "high_p50_ms": statistics.median(times) * 1000,
        "high_p99_ms": _pct(times, 0.99) * 1000,
        "low_finished": float(finished[0]),
        "low_per_s": finished[0] / elapsed,
        "preempted": float(preempted),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--high", type=int, default=60)
    ap.add_argument("--every-s", type=float, default=0.1)
    ap.add_argument("--low-s", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--after-s", type=float, default=0.02)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with RedisServer() as server:
        for k in range(a.rounds):
            for mode in ("off", "on") if k % 2 == 0 else ("on", "off"):
                after = a.after_s if mode == "on" else None
                res = anyio.run(one_run, server.url, f"preempt{k}{mode}", a, after)
                out[mode].append(res)
                if not a.json:
                    print(
                        f"round {k + 1} {mode}: "
                        + ", ".join(f"{n} {v:.1f}" for n, v in res.items())
                    )
    med = {m: {n: statistics.median(r[n] for r in rs) for n in rs[0]} for m, rs in out.items()}
    if a.json:
        print(json.dumps({"rounds": out, "median": med}))
    else:
        for m, v in med.items():
            print(f"median {m}: " + ", ".join(f"{n} {x:.1f}" for n, x in v.items()))


if __name__ == "__main__":
    main()

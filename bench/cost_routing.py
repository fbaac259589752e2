"""Cost-aware routing: two agents of equal slots, one twice as slow (two ``reach worker``
processes, default heartbeats), under steady open-loop traffic from several callers.

    .venv/bin/python bench/cost_routing.py [--slots 4] [--fast-s 0.05] [--load 0.85] \\
        [--callers 4] [--warmup-s 5] [--seconds 20] [--policy least_conn] [--json]

The agents' slots run ``--fast-s`` and twice that; together they finish
``slots / fast_s + slots / (2 fast_s)`` messages a second, and ``--callers`` Clients (each
its own in-flight counts, as separate caller processes would have) send ``--load`` of that
rate, arrivals spread at random (Poisson). Each handler returns when it started; a
message's *wait* is its start minus its send (one host, one clock). After ``--warmup-s``
(the agents report their means meanwhile), the waits of the next ``--seconds`` are
summed up: p50, p99, max, and each agent's share.

To measure another version of reach, run this file from that version's checkout (it
imports the reach next to it): e.g. ``git archive <commit> | tar -x -C /tmp/base``, copy
this file into ``/tmp/base/bench/``, and run it from there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reach import Agent, Client, Context
from reach.embedded import RedisServer

CAP = "bench.cost"


def _agent(agent_id: str, env_var: str) -> Agent:
    run_s = float(os.environ[env_var])
    app = Agent(agent_id, capabilities=[CAP])

    @app.handler(CAP)
    async def handle(payload: Any, ctx: Context) -> list[Any]:
        started = time.time()
        await anyio.sleep(run_s)
        return [ctx.agent_id, started]

    return app


def fast() -> Agent:
    return _agent("fast", "BENCH_FAST_S")


def slow() -> Agent:
    return _agent("slow", "BENCH_SLOW_S")


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")


async def _run(args: argparse.Namespace, url: str, ns: str) -> dict[str, Any]:
    rate = args.load * (args.slots / args.fast_s + args.slots / (2 * args.fast_s))
    per_caller = rate / args.callers
    waits: list[float] = []
    share: Counter[str] = Counter()
    failed = 0
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(Client(redis_url=url, namespace=ns, slow_start_s=0))
            for _ in range(args.callers)
        ]
        while len({a.agent_id for a in await clients[0].registry.agents(CAP) if a.routable}) < 2:
            await anyio.sleep(0.1)
        t_start = time.monotonic()
        measure_from = t_start + args.warmup_s
        end = measure_from + args.seconds

        async def one(c: Client) -> None:
            nonlocal failed
            sent = time.time()
            counted = time.monotonic() >= measure_from
            try:
                agent, started = await c.request(CAP, None, timeout_s=60, policy=args.policy)
            except Exception:  # noqa: BLE001 - counted, the run goes on
                failed += counted
                return
            if counted:
                waits.append(started - sent)
                share[agent] += 1

        async def caller(c: Client, rng: random.Random) -> None:
            async with anyio.create_task_group() as tg:
                while time.monotonic() < end:
                    tg.start_soon(one, c)
                    await anyio.sleep(rng.expovariate(per_caller))

        async with anyio.create_task_group() as tg:
            for i, c in enumerate(clients):
                tg.start_soon(caller, c, random.Random(i))
    return {
        "policy": args.policy,
        "rate_per_s": round(rate, 1),
        "measured": len(waits),
        "failed": failed,
        "wait_p50_ms": round(_pct(waits, 0.50) * 1000, 1),
        "wait_p99_ms": round(_pct(waits, 0.99) * 1000, 1),
        "wait_max_ms": round(max(waits, default=float("nan")) * 1000, 1),
        "share": dict(share),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--fast-s", type=float, default=0.05)
    p.add_argument("--load", type=float, default=0.85)
    p.add_argument("--callers", type=int, default=4)
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--policy", default="least_conn")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    ns = f"bench-cost-{os.getpid()}"
    with RedisServer() as server:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")]),
            "BENCH_FAST_S": str(args.fast_s),
            "BENCH_SLOW_S": str(2 * args.fast_s),
        }
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "reach_cli.app",
                    "worker",
                    f"bench.cost_routing:{name}",
                    "--redis-url",
                    server.url,
                    "--namespace",
                    ns,
                    "--concurrency",
                    str(args.slots),
                    "--log-level",
                    "error",
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            for name in ("fast", "slow")
        ]
        try:
            out = anyio.run(_run, args, server.url, ns)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)
    out["code"] = str(ROOT)
    if args.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:>12}: {v}")


if __name__ == "__main__":
    main()

"""Routing by free capacity: one agent at ``--concurrency 2`` beside one at
``--concurrency 16`` (two ``reach worker`` processes, default heartbeat settings), one
Client sending bursts of requests to their shared capability.

    .venv/bin/python bench/capacity_routing.py [--rounds 3] [--requests 120] \\
        [--handler-s 0.4] [--timeout-s 6] [--policy weighted_rr|least_conn] [--json]

Each round sends ``--requests`` requests at once (each with a ``--timeout-s`` deadline)
to handlers that sleep ``--handler-s``, and counts the failures (any exception: a deadline
passed, ``NoAgentAvailable``...), the share each agent answered, the wall time of the
round, and the breaker opens this Client logged. 18 slots drain 120 requests of 0.4 s in
about 2.7 s when the work is split by capacity (2:16); split evenly, the small agent holds
60 for 12 s, past the deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reach import Agent, Client, Context, NoAgentAvailable
from reach.breaker import BreakerChange
from reach.embedded import RedisServer

ROOT = Path(__file__).resolve().parents[1]
CAP = "bench.capacity"


def _agent(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=[CAP])

    @app.handler(CAP)
    async def work(payload: Any, ctx: Context) -> str:
        await anyio.sleep(float(payload))
        return ctx.agent_id

    return app


def small() -> Agent:
    """The agent started with ``--concurrency 2``."""
    return _agent("small")


def big() -> Agent:
    """The agent started with ``--concurrency 16``."""
    return _agent("big")


def _worker(url: str, ns: str, name: str, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    cmd = [sys.executable, "-m", "reach_cli.app", "worker", f"bench.capacity_routing:{name}"]
    cmd += ["--redis-url", url, "--namespace", ns, "--log-level", "warning"]
    cmd += ["--concurrency", str(concurrency)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)


async def _ready(client: Client) -> None:
    with anyio.fail_after(60):
        while True:
            client.invalidate()
            try:
                if {a.agent_id for a in await client.eligible(CAP)} >= {"small", "big"}:
                    return
            except NoAgentAvailable:
                pass
            await anyio.sleep(0.1)


async def _round(
    client: Client, n: int, handler_s: float, timeout_s: float, policy: str
) -> dict[str, Any]:
    got: Counter[str] = Counter()
    errors: Counter[str] = Counter()

    async def one() -> None:
        try:
            got[await client.request(CAP, handler_s, timeout_s=timeout_s, policy=policy)] += 1
        except Exception as e:  # noqa: BLE001 - every failure counts, by type
            errors[type(e).__name__] += 1

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return {
        "failed": sum(errors.values()),
        "errors": dict(errors),
        "small": got["small"],
        "big": got["big"],
        "wall_s": round(time.perf_counter() - t0, 2),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with RedisServer() as server:
        ns = f"capbench{os.getpid()}"
        procs = [_worker(server.url, ns, "small", 2), _worker(server.url, ns, "big", 16)]
        opens: Counter[str] = Counter()

        def on_change(c: BreakerChange) -> None:
            if c.new == "open":
                opens[c.agent_id] += 1

        try:
            async with Client(redis_url=server.url, namespace=ns, slow_start_s=0) as client:
                client.breakers.listeners.append(on_change)
                await _ready(client)
                rounds = []
                for i in range(args.rounds):
                    res = await _round(
                        client, args.requests, args.handler_s, args.timeout_s, args.policy
                    )
                    rounds.append(res)
                    if not args.json:
                        print(f"round {i + 1}: {res}", flush=True)
                    await anyio.sleep(args.pause_s)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
    return {
        "policy": args.policy,
        "requests": args.requests,
        "handler_s": args.handler_s,
        "timeout_s": args.timeout_s,
        "rounds": rounds,
        "failed_total": sum(r["failed"] for r in rounds),
        "breaker_opens": dict(opens),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--handler-s", type=float, default=0.4)
    ap.add_argument("--timeout-s", type=float, default=6.0)
    ap.add_argument("--pause-s", type=float, default=1.0, help="between rounds")
    ap.add_argument("--policy", default="weighted_rr", choices=["weighted_rr", "least_conn"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = anyio.run(main_async, args)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{args.policy}: failed {out['failed_total']} of {args.requests * args.rounds}, "
            f"breaker opens {out['breaker_opens']}"
        )


if __name__ == "__main__":
    main()

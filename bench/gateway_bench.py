"""The A2A gateway's added latency, and 1,000 concurrent A2A requests through one gateway.

Three processes besides this one's: a redis-server (a free port, no persistence), a
worker running ``bench.echo`` (returns its payload; concurrency 64) and a ``reach gateway``
(bearer token on). This process is the caller, both ways:

* direct: ``Client.request("bench.echo", i)``, one after another (``--runs``);
* through the gateway: the same message as an A2A ``SendMessage`` (JSON-RPC over HTTP, a
  data part, the caller's connection kept alive) to ``/caps/bench.echo``, one after
  another, answered with the completed task and its result artifact;
* load: ``--concurrent`` (1,000) such requests at once (one HTTP connection each, over
  HTTP clients of 50 connections), all of which must be answered completed: wall time,
  and p50/p99 of their latencies.

The gateway's added latency is the through-the-gateway figure minus the direct one (p50
and p99). Medians over ``--repeat`` rounds (each round: runs each way, then the load).

Run:  python bench/gateway_bench.py [--runs 500] [--concurrent 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-gateway-token-0123456789"


def worker(url: str) -> None:
    from reach import Agent, Context

    app = Agent("bench-echo-1", capabilities=["bench.echo"])

    @app.handler("bench.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return payload

    signal.signal(signal.SIGTERM, lambda *_: app.stop())
    anyio.run(
        lambda: app.run(redis_url=url, namespace="bench", concurrency=64, handle_signals=False)
    )


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))]


def body(i: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "SendMessage",
        "params": {
            "message": {"messageId": f"m-{i}", "role": "ROLE_USER", "parts": [{"data": {"i": i}}]}
        },
    }


def completed(resp: Any, i: int) -> bool:
    task = resp.json().get("result", {}).get("task", {})
    art = (task.get("artifacts") or [{}])[0]
    return bool(
        task.get("status", {}).get("state") == "TASK_STATE_COMPLETED"
        and art.get("parts", [{}])[0].get("data") == {"i": i}
    )


async def measure(url: str, gw: str, runs: int, concurrent: int) -> dict[str, float]:
    import httpx

    from reach import Client
    from reach.errors import NoAgentAvailable

    headers = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}
    endpoint = f"{gw}/caps/bench.echo"
    async with Client(redis_url=url, namespace="bench") as c:
        with anyio.fail_after(60):
            while True:
                try:
                    await c.eligible("bench.echo")
                    break
                except NoAgentAvailable:
                    c.invalidate()
                    await anyio.sleep(0.05)
        async with httpx.AsyncClient(headers=headers, timeout=60) as h:
            with anyio.fail_after(60):
                while True:
                    try:
                        r = await h.get(f"{endpoint}/.well-known/agent-card.json")
                        if r.status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await anyio.sleep(0.1)
            for i in range(100):  # warm-up: connections, scripts, code paths
                await c.request("bench.echo", {"i": i})
                assert completed(await h.post(endpoint, json=body(i)), i)
            direct, via = [], []
            for i in range(runs):
                t0 = time.perf_counter()
                assert await c.request("bench.echo", {"i": i}) == {"i": i}
                direct.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                r = await h.post(endpoint, json=body(i))
                via.append(time.perf_counter() - t0)
                assert completed(r, i), r.text
    # the load: every request on a connection of its own, all at once (over several HTTP
    # clients of 50 connections: one pool of 1,000 costs the caller more CPU than the
    # gateway spends, on the same 2 cores)
    lat: list[float] = []
    ok = 0
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    pools = [
        httpx.AsyncClient(headers=headers, timeout=300, limits=limits)
        for _ in range(max(1, concurrent // 50))
    ]

    async def one(i: int) -> None:
        nonlocal ok
        t0 = time.perf_counter()
        r = await pools[i % len(pools)].post(endpoint, json=body(i))
        lat.append(time.perf_counter() - t0)
        ok += completed(r, i)

    try:
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(concurrent):
                tg.start_soon(one, i)
        wall = time.perf_counter() - t0
    finally:
        for pool in pools:
            await pool.aclose()
    return {
        "direct_p50": pct(direct, 0.5) * 1000,
        "direct_p99": pct(direct, 0.99) * 1000,
        "via_p50": pct(via, 0.5) * 1000,
        "via_p99": pct(via, 0.99) * 1000,
        "load_ok": ok,
        "load_wall_s": wall,
        "load_p50": pct(lat, 0.5) * 1000,
        "load_p99": pct(lat, 0.99) * 1000,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500, help="sequential requests each way")
    ap.add_argument("--concurrent", type=int, default=1000, help="requests at once (load)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (medians reported)")
    args = ap.parse_args()
    from reach.embedded import RedisServer, free_port

    print(f"python {' '.join(sys.argv)}")
    rounds: list[dict[str, float]] = []
    with RedisServer() as srv:
        port = free_port()
        env = {**os.environ, "REACH_GATEWAY_TOKENS": f"bench:{TOKEN}"}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")]
        )
        procs = [
            subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", srv.url]),
            subprocess.Popen(
                [sys.executable, "-m", "reach_cli.app", "gateway", "--port", str(port),
                 "--redis-url", srv.url, "--namespace", "bench",
                 # every one of --concurrent at once (503 past the bound); the gateway
                 # lowers it to its open-files limit less 100 (924 under a 1,024 limit)
                 "--max-connections", str(args.concurrent + 100)],
                env=env,
            ),
        ]  # fmt: skip
        try:
            for _ in range(args.repeat):
                m = anyio.run(measure, srv.url, f"http://127.0.0.1:{port}", args.runs,
                              args.concurrent)  # fmt: skip
                rounds.append(m)
                print(
                    f"  round: direct p50 {m['direct_p50']:.2f} ms p99 {m['direct_p99']:.2f} ms | "
                    f"gateway p50 {m['via_p50']:.2f} ms p99 {m['via_p99']:.2f} ms | "
                    f"{args.concurrent} at once: {m['load_ok']:.0f} completed in "
                    f"{m['load_wall_s']:.2f} s, p50 {m['load_p50']:.0f} ms "
                    f"p99 {m['load_p99']:.0f} ms"
                )
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(30)

    def med(k: str) -> float:
        return statistics.median(r[k] for r in rounds)

    print(f"medians of {len(rounds)} rounds ({args.runs} sequential requests each way):")
    print(f"{'':<22} {'p50':>9} {'p99':>9}")
    print(f"{'Client.request':<22} {med('direct_p50'):>6.2f} ms {med('direct_p99'):>6.2f} ms")
    print(f"{'A2A via the gateway':<22} {med('via_p50'):>6.2f} ms {med('via_p99'):>6.2f} ms")
    print(
        f"{'added by the gateway':<22} {med('via_p50') - med('direct_p50'):>6.2f} ms "
        f"{med('via_p99') - med('direct_p99'):>6.2f} ms"
    )
    print(
        f"{args.concurrent} concurrent A2A requests: {med('load_ok'):.0f} completed, "
        f"{med('load_wall_s'):.2f} s wall, p50 {med('load_p50'):.0f} ms, "
        f"p99 {med('load_p99'):.0f} ms"
    )


if __name__ == "__main__":
    main()

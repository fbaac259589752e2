"""Where a lone request's time goes on the worker: the benchmark agent in a worker process
of its own, one sequential caller (``Client.request``), and per request the time of each
step, from stamps taken in both processes (``time.perf_counter``: CLOCK_MONOTONIC, the same
clock in every process of the machine).

Steps: caller's request -> the worker's blocking read returns (the send and the worker's
wake-up); -> claim sent (decode); the claim round trip; -> the handler starts (the hand-off
to the handler pool); the handler with its hooks and outcome; -> settle sent; the settle
round trip (the caller can have its reply before it ends: settle.lua publishes it); the
caller's reply read. The worker's steps are timed by wrapping its private methods.

Run:  python bench/worker_latency.py [requests, default 1000]
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import anyio

ROWS = os.path.join(tempfile.gettempdir(), f"reach-worker-latency-{os.getpid()}.json")


def worker(url: str, out: str) -> None:
    from reach_cli.tools.bench import bench_agent

    from reach._worker import consumer as c
    from reach._worker import execution as e
    from reach._worker import settlement as s

    rows = []
    cur = {}
    ob = c.Consumer._block

    async def block(self, n):
        got = await ob(self, n)
        if got:
            cur.clear()
            cur["read"] = time.perf_counter()
        return got

    c.Consumer._block = block
    oc = e.Execution._claim

    async def claim(self, items, **kw):
        cur["claim0"] = time.perf_counter()
        r = await oc(self, items, **kw)
        cur["claim1"] = time.perf_counter()
        return r

    e.Execution._claim = claim
    orun = e.Execution._run

    async def run(self, it, **kw):
        cur["handle0"] = time.perf_counter()
        await orun(self, it, **kw)
        cur["handle1"] = time.perf_counter()

    e.Execution._run = run
    ost = s.Settlement._settle

    async def settle(self, batch):
        cur["settle0"] = time.perf_counter()
        await ost(self, batch)
        cur["settle1"] = time.perf_counter()
        rows.append(dict(cur))

    s.Settlement._settle = settle
    agent = bench_agent()

    def stop(*_):
        agent.stop()

    signal.signal(signal.SIGTERM, stop)
    try:
        anyio.run(
            lambda: agent.run(
                redis_url=url, namespace="bench", concurrency=64, handle_signals=False
            )
        )
    finally:
        with open(out, "w") as f:
            json.dump(rows, f)


async def caller(url: str, n: int) -> list[tuple[float, float]]:
    from reach import Client
    from reach.connection import connect
    from reach.registry import Registry

    r = await connect(url)
    with anyio.fail_after(30):
        while not await Registry(r, "bench").agents("bench.noop", ready=True):
            await anyio.sleep(0.02)
    await r.aclose()
    out = []
    async with Client(redis_url=url, namespace="bench") as c:
        for _ in range(200):
            await c.request("bench.noop", 1)
        for i in range(n):
            t0 = time.perf_counter()
            await c.request("bench.noop", i)
            out.append((t0, time.perf_counter()))
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit()
    from reach.embedded import RedisServer

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with RedisServer() as srv:
        p = subprocess.Popen([sys.executable, __file__, "worker", srv.url, ROWS])
        try:
            calls = anyio.run(caller, srv.url, n)
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    with open(ROWS) as f:
        rows = json.load(f)[-n:]
    os.unlink(ROWS)
    # Each call: caller t0 -> read (send + worker wake-up) -> claim -> handler -> settle -> caller end (reply read)
    parts = {
        k: []
        for k in (
            "send_to_worker_read",
            "read_to_claim",
            "claim_rt",
            "claim_to_handler",
            "handler",
            "handler_to_settle",
            "settle_rt",
            "settled_to_caller",
            "total",
        )
    }
    for (t0, t1), w in zip(calls, rows):
        if not all(
            k in w for k in ("read", "claim0", "claim1", "handle0", "handle1", "settle0", "settle1")
        ):
            continue
        parts["send_to_worker_read"].append(w["read"] - t0)
        parts["read_to_claim"].append(w["claim0"] - w["read"])
        parts["claim_rt"].append(w["claim1"] - w["claim0"])
        parts["claim_to_handler"].append(w["handle0"] - w["claim1"])
        parts["handler"].append(w["handle1"] - w["handle0"])
        parts["handler_to_settle"].append(w["settle0"] - w["handle1"])
        parts["settle_rt"].append(w["settle1"] - w["settle0"])
        parts["settled_to_caller"].append(t1 - w["settle1"])
        parts["total"].append(t1 - t0)
    print(f"{len(parts['total'])} of {n} requests matched")
    for k, v in parts.items():
        print(
            f"{k:22} p50 {1000 * statistics.median(v):6.3f} ms  mean {1000 * statistics.fmean(v):6.3f} ms"
        )

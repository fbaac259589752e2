"""Messaging benchmark: one Redis, one worker process.

Measures
* fire-and-forget throughput: a backlog of N messages is loaded into the inbox of one
  `reach worker` while it is stopped (SIGSTOP); after SIGCONT it processes them (batch
  reads, claim, handler, fenced completion, ack + delete): msgs/s until the inbox is empty;
* request/reply latency with one sequential caller: p50 / p99;
* Redis commands per message (INFO commandstats) and the worker's own count of round
  trips per message (logged by the runtime when it stops).

Run:  python bench/messaging_bench.py [--messages 50000] [--requests 3000] [--concurrency 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reach.client import Client
from reach.connection import connect
from reach.embedded import RedisServer
from reach.envelope import encode
from reach.keys import Keys
from reach.registry import Registry
from reach.tasks import pending_ops

NS = "bench"


def start_worker(url: str, concurrency: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "reach_cli.app", "worker", "bench.bench_agents:noop",
           "--redis-url", url, "--namespace", NS, "--concurrency", str(concurrency),
           "--log-level", "info"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)


async def wait_ready(url: str) -> None:
    r = await connect(url)
    reg = Registry(r, NS)
    with anyio.fail_after(30):
        while not await reg.agents("bench.noop", ready=True):
            await anyio.sleep(0.02)
    await r.aclose()


async def commandstats(r: Any) -> dict[str, int]:
    info = await r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


async def throughput(url: str, n: int, worker: subprocess.Popen[str]) -> dict[str, float]:
    """Preload a backlog of n messages while the worker is stopped (SIGSTOP), then let it
    go (SIGCONT) and time until every entry is acked and deleted."""
    keys = Keys(NS)
    r = await connect(url)
    async with Client(redis=r, namespace=NS) as c:
        envs = [c.build("bench.noop", {"i": i}, reply=False) for i in range(n)]
        inbox = keys.inbox("bench-1", "normal")
        worker.send_signal(signal.SIGSTOP)
        chunk = 1000
        t_send = time.perf_counter()
        for i in range(0, n, chunk):
            pipe = r.pipeline(transaction=False)
            for env in envs[i : i + chunk]:
                pipe.execute_command("XADD", inbox, "*", "e", encode(env))
                for op in pending_ops(keys, env):
                    pipe.execute_command(*op)
            await pipe.execute()
        t_sent = time.perf_counter()
        before = await commandstats(r)
        t0 = time.perf_counter()
        worker.send_signal(signal.SIGCONT)
        with anyio.fail_after(600):
            while True:
                depth = sum([await r.xlen(k) for k in keys.inboxes("bench-1")])
                if depth == 0:
                    break
                await anyio.sleep(0.005)
        t1 = time.perf_counter()
        after = await commandstats(r)
        done = (await c.task(envs[-1].msg_id)).status
    await r.aclose()
    # Commands run for the backlog, those inside scripts included; the bench's own polling
    # (XLEN, INFO) is left out.
    skip = {"xlen", "info"}
    worker_cmds = sum(v - before.get(k, 0) for k, v in after.items() if k not in skip)
    return {
        "messages": n,
        "seconds": t1 - t0,
        "send_seconds": t_sent - t_send,
        "msgs_per_s": n / (t1 - t0),
        "redis_commands_per_msg_worker": worker_cmds / n,
        "last_status": done,  # type: ignore[dict-item]
    }


async def latency(url: str, n: int) -> dict[str, float]:
    async with Client(redis_url=url, namespace=NS) as c:
        for _ in range(200):  # warm up
            await c.request("bench.noop", 1)
        samples = []
        for i in range(n):
            t = time.perf_counter()
            await c.request("bench.noop", i)
            samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return {
        "requests": n,
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[int(len(samples) * 0.99) - 1],
        "mean_ms": statistics.fmean(samples),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--requests", type=int, default=3_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with RedisServer() as server:
        w = start_worker(server.url, a.concurrency)
        try:
            anyio.run(wait_ready, server.url)
            tp = anyio.run(throughput, server.url, a.messages, w)
            lat = anyio.run(latency, server.url, a.requests)
        finally:
            w.send_signal(signal.SIGTERM)
            _, err = w.communicate(timeout=60)
        m = re.search(r"stats: (\{.*\})", err)
        stats = json.loads(m.group(1)) if m else {}
    total = a.messages + a.requests + 200
    rt = stats.get("round_trips", 0) / total if stats else float("nan")
    out = {"throughput": tp, "latency": lat, "worker_round_trips_per_msg": rt,
           "worker_stats": stats, "redis": server.binary.version_str, "cpus": os.cpu_count()}  # fmt: skip
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"redis {server.binary.version_str}, {os.cpu_count()} cpus, worker concurrency {a.concurrency}")
    print(f"fire-and-forget backlog of {tp['messages']} msgs processed in {tp['seconds']:.2f}s = "
          f"{tp['msgs_per_s']:,.0f} msgs/s (loading it took {tp['send_seconds']:.2f}s)")
    print(f"worker Redis commands per msg: {tp['redis_commands_per_msg_worker']:.2f}; "
          f"worker round trips per msg: {rt:.3f}")
    print(f"request/reply, 1 sequential caller, {lat['requests']} requests: "
          f"p50 {lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms, mean {lat['mean_ms']:.3f} ms")


if __name__ == "__main__":
    main()

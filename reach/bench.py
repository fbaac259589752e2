"""The messaging benchmark: one Redis, one `reach worker` process (`reach bench`,
`bench/messaging_bench.py`).

It measures
* fire-and-forget throughput: a backlog of N messages is loaded into the inbox of the
  worker while it is stopped (SIGSTOP); after SIGCONT it processes them (batch reads,
  claim, handler, fenced completion, ack + delete): messages/s until the inbox is empty;
* request/reply latency with one sequential caller: p50 / p99;
* Redis commands per message (INFO commandstats, those inside scripts included) and the
  worker's own count of round trips per message (logged by the runtime when it stops).
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
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from .client import Client
from .connection import AnyRedis, connect
from .embedded import RedisServer
from .envelope import encode
from .keys import Keys
from .registry import Registry
from .runtime import Agent, Context
from .tasks import pending_ops

NS = "bench"
CAP = "bench.noop"
Progress = Callable[[str, int, int], None]  # (phase, done, total)


def bench_agent() -> Agent:
    """The benchmark's agent: answers with its payload (the cost is reach's, not the handler's)."""
    app = Agent("bench-1", capabilities=[CAP])

    @app.handler(CAP)
    async def handle(payload: Any, ctx: Context) -> Any:
        return payload

    return app


def _start_worker(url: str, concurrency: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "reach_cli.app", "worker", "reach.bench:bench_agent",
           "--redis-url", url, "--namespace", NS, "--concurrency", str(concurrency),
           "--log-level", "info"]  # fmt: skip
    with open(log, "wb") as err:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=err)


async def _wait_ready(url: str) -> None:
    r = await connect(url)
    try:
        reg = Registry(r, NS)
        with anyio.fail_after(30):
            while not await reg.agents(CAP, ready=True):
                await anyio.sleep(0.02)
    finally:
        await r.aclose()


async def _commandstats(r: AnyRedis) -> dict[str, int]:
    info = await r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


async def _throughput(
    url: str, n: int, worker: subprocess.Popen[bytes], progress: Progress | None
) -> dict[str, Any]:
    keys = Keys(NS)
    r = await connect(url)
    try:
        async with Client(redis=r, namespace=NS) as c:
            envs = [c.build(CAP, {"i": i}, reply=False) for i in range(n)]
            inbox = keys.inbox("bench-1", "normal")
            worker.send_signal(signal.SIGSTOP)  # load the backlog while it cannot read
            t_load = time.perf_counter()
            for i in range(0, n, 1000):
                pipe = r.pipeline(transaction=False)
                for env in envs[i : i + 1000]:
                    pipe.execute_command("XADD", inbox, "*", "e", encode(env))
                    for op in pending_ops(keys, env):
                        pipe.execute_command(*op)
                await pipe.execute()
                if progress:
                    progress("loading", min(i + 1000, n), n)
            t_loaded = time.perf_counter()
            before = await _commandstats(r)
            t0 = time.perf_counter()
            worker.send_signal(signal.SIGCONT)
            with anyio.fail_after(600):
                while True:
                    depth = sum([await r.xlen(k) for k in keys.inboxes("bench-1")])
                    if progress:
                        progress("processing", n - depth, n)
                    if depth == 0:
                        break
                    await anyio.sleep(0.005)
            t1 = time.perf_counter()
            after = await _commandstats(r)
            last = (await c.task(envs[-1].msg_id)).status
    finally:
        await r.aclose()
    # Commands run for the backlog, those inside scripts included; the bench's own polling
    # (XLEN, INFO) is left out.
    skip = {"xlen", "info"}
    worker_cmds = sum(v - before.get(k, 0) for k, v in after.items() if k not in skip)
    return {
        "messages": n,
        "seconds": t1 - t0,
        "load_seconds": t_loaded - t_load,
        "msgs_per_s": n / (t1 - t0),
        "redis_commands_per_msg_worker": worker_cmds / n,
        "last_status": last,
    }


async def _latency(url: str, n: int, progress: Progress | None) -> dict[str, Any]:
    async with Client(redis_url=url, namespace=NS) as c:
        for _ in range(200):  # warm up
            await c.request(CAP, 1)
        samples = []
        every = max(1, n // 20)
        for i in range(n):
            t = time.perf_counter()
            await c.request(CAP, i)
            samples.append((time.perf_counter() - t) * 1000)
            if progress and ((i + 1) % every == 0 or i + 1 == n):
                progress("requests", i + 1, n)
    samples.sort()
    return {
        "requests": n,
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[max(0, int(len(samples) * 0.99) - 1)],
        "mean_ms": statistics.fmean(samples),
    }


def run_bench(
    *, messages: int = 30_000, requests: int = 3_000, concurrency: int = 64,
    progress: Progress | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the whole benchmark on an embedded Redis; returns the figures."""
    if messages < 1 or requests < 1:
        raise ValueError("messages and requests must be >= 1")
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="reach-bench-") as tmp:
        log = Path(tmp) / "worker.log"
        w = _start_worker(server.url, concurrency, log)
        try:
            anyio.run(_wait_ready, server.url)
            tp = anyio.run(_throughput, server.url, messages, w, progress)
            lat = anyio.run(_latency, server.url, requests, progress)
        finally:
            w.send_signal(signal.SIGCONT)
            w.send_signal(signal.SIGTERM)
            try:
                w.wait(timeout=60)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        m = re.search(r"stats: (\{.*\})", log.read_text(errors="replace"))
        stats = json.loads(m.group(1)) if m else {}
    total = messages + requests + 200
    return {
        "throughput": tp,
        "latency": lat,
        "worker_round_trips_per_msg": stats.get("round_trips", 0) / total if stats else None,
        "worker_stats": stats,
        "redis": f"{server.binary.origin} {server.binary.version_str}",
        "cpus": os.cpu_count(),
        "concurrency": concurrency,
    }


def format_report(out: dict[str, Any]) -> str:
    tp, lat = out["throughput"], out["latency"]
    rt = out["worker_round_trips_per_msg"]
    rts = f"{rt:.3f}" if rt is not None else "?"
    return "\n".join([
        f"redis {out['redis']}, {out['cpus']} cpus, worker concurrency {out['concurrency']}",
        (f"fire-and-forget backlog of {tp['messages']} msgs processed in {tp['seconds']:.2f}s"
         f" = {tp['msgs_per_s']:,.0f} msgs/s (loading it took {tp['load_seconds']:.2f}s)"),
        (f"worker Redis commands per msg: {tp['redis_commands_per_msg_worker']:.2f}; "
         f"worker round trips per msg: {rts}"),
        (f"request/reply, 1 sequential caller, {lat['requests']} requests: p50 "
         f"{lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms, mean {lat['mean_ms']:.3f} ms"),
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """`python bench/messaging_bench.py` (plain progress lines on stderr)."""
    ap = argparse.ArgumentParser(prog="messaging_bench", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--requests", type=int, default=3_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = run_bench(messages=a.messages, requests=a.requests, concurrency=a.concurrency)
    print(json.dumps(out, indent=2) if a.json else format_report(out))
    return 0

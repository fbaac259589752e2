"""The messaging benchmark: one Redis, one `reach worker` process (`reach bench`,
`bench/messaging_bench.py`). A tool shipped with the CLI, not part of the library.

It measures
* fire-and-forget throughput: a backlog of N messages is loaded into the inbox of the
  worker while it is stopped (SIGSTOP); after SIGCONT it processes them (batch reads,
  claim, handler, fenced completion, ack + delete): messages/s until the inbox is empty;
* request/reply latency with one sequential caller: p50 / p99;
* Redis commands and round trips per message, for each phase: commands from INFO
  commandstats (those inside scripts included), round trips as the reads Redis processed
  (INFO stats ``total_reads_processed``: one per request or pipeline a client sends), with
  the benchmark's own polling taken out; and the worker's own count of its round trips
  (logged by the runtime when it stops). Each phase has a worker process of its own, so
  its figures are its own.
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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from reach import Agent, Client, Context, admin
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.envelope import encode
from reach.errors import ConfigError
from reach.keys import Keys
from reach.registry import Registry
from reach.tasks import pending_ops

NS = "bench"
CAP = "bench.noop"
Progress = Callable[[str, int, int], None]  # (phase, done, total)
WARM_UP = 200  # requests before the latency samples


def bench_agent() -> Agent:
    """The benchmark's agent: answers with its payload (the cost is reach's, not the handler's)."""
    app = Agent("bench-1", capabilities=[CAP])

    @app.handler(CAP)
    async def handle(payload: Any, ctx: Context) -> Any:
        return payload

    return app


def _start_worker(url: str, concurrency: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "reach_cli.app",
        "worker",
        "reach_cli.tools.bench:bench_agent",
        "--redis-url",
        url,
        "--namespace",
        NS,
        "--concurrency",
        str(concurrency),
        "--log-level",
        "info",
    ]
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


async def _reads(r: AnyRedis) -> int:
    """Requests (or pipelines) Redis has read from all clients so far."""
    return int((await r.info("stats"))["total_reads_processed"])


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
            reads_before = await _reads(r)
            own_reads = 0  # the bench's own requests, taken out of the count below
            t0 = time.perf_counter()
            worker.send_signal(signal.SIGCONT)
            with anyio.fail_after(600):
                while True:  # one pipeline of XLEN a poll (left out of the counts below)
                    depth = sum(
                        (await admin.queue_depths(r, keys, ["bench-1"]))["bench-1"].values()
                    )
                    own_reads += 1
                    if progress:
                        progress("processing", n - depth, n)
                    if depth == 0:
                        break
                    await anyio.sleep(0.005)
            t1 = time.perf_counter()
            after = await _commandstats(r)
            reads = await _reads(r) - reads_before - own_reads - 1  # the INFO before it
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
        "round_trips_per_msg_worker": max(0, reads) / n,
        "last_status": last,
    }


async def _latency(
    url: str, n: int, worker: subprocess.Popen[bytes], progress: Progress | None
) -> dict[str, Any]:
    r = await connect(url)  # the bench's own connection, for INFO only
    try:
        async with Client(redis_url=url, namespace=NS) as c:
            for _ in range(WARM_UP):
                await c.request(CAP, 1)
            before, reads_before = await _commandstats(r), await _reads(r)
            samples = []
            every = max(1, n // 20)
            for i in range(n):
                t = time.perf_counter()
                await c.request(CAP, i)
                samples.append((time.perf_counter() - t) * 1000)
                if progress and ((i + 1) % every == 0 or i + 1 == n):
                    progress("requests", i + 1, n)
            after, reads = await _commandstats(r), await _reads(r) - reads_before - 1
    finally:
        await r.aclose()
    cmds = sum(v - before.get(k, 0) for k, v in after.items() if k != "info")
    samples.sort()
    return {
        "requests": n,
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[max(0, int(len(samples) * 0.99) - 1)],
        "mean_ms": statistics.fmean(samples),
        # Caller and worker together (heartbeats and the like included).
        "redis_commands_per_request": cmds / n,
        "round_trips_per_request": max(0, reads) / n,
    }


def _phase(
    url: str,
    concurrency: int,
    log: Path,
    measure: Callable[
        [str, int, subprocess.Popen[bytes], Progress | None], Awaitable[dict[str, Any]]
    ],
    n: int,
    progress: Progress | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One phase with a worker process of its own: (figures, the worker's own stats)."""
    w = _start_worker(url, concurrency, log)
    try:
        anyio.run(_wait_ready, url)
        out = anyio.run(measure, url, n, w, progress)
    finally:
        w.send_signal(signal.SIGCONT)
        w.send_signal(signal.SIGTERM)
        try:
            w.wait(timeout=60)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
    m = re.search(r"stats: (\{.*\})", log.read_text(errors="replace"))
    return out, (json.loads(m.group(1)) if m else {})


def run_bench(
    *,
    messages: int = 30_000,
    requests: int = 3_000,
    concurrency: int = 64,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark on an embedded Redis; returns the figures."""
    if messages < 1 or requests < 1:
        raise ConfigError("messages and requests must be >= 1")
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="reach-bench-") as tmp:
        tp, tp_stats = _phase(
            server.url,
            concurrency,
            Path(tmp) / "worker-backlog.log",
            _throughput,
            messages,
            progress,
        )
        lat, lat_stats = _phase(
            server.url, concurrency, Path(tmp) / "worker-requests.log", _latency, requests, progress
        )
    if "round_trips" in tp_stats:
        tp["worker_own_round_trips_per_msg"] = tp_stats["round_trips"] / messages
    if "round_trips" in lat_stats:
        lat["worker_own_round_trips_per_request"] = lat_stats["round_trips"] / (requests + WARM_UP)
    return {
        "throughput": tp,
        "latency": lat,
        "worker_stats": {"backlog": tp_stats, "requests": lat_stats},
        "redis": f"{server.binary.origin} {server.binary.version_str}",
        "cpus": os.cpu_count(),
        "concurrency": concurrency,
    }


def format_report(out: dict[str, Any]) -> str:
    tp, lat = out["throughput"], out["latency"]
    return "\n".join(
        [
            f"redis {out['redis']}, {out['cpus']} cpus, worker concurrency {out['concurrency']}",
            (
                f"fire-and-forget backlog of {tp['messages']} msgs processed in "
                f"{tp['seconds']:.2f}s = {tp['msgs_per_s']:,.0f} msgs/s "
                f"(loading it took {tp['load_seconds']:.2f}s)"
            ),
            (
                f"  per msg, worker: {tp['redis_commands_per_msg_worker']:.2f} Redis commands, "
                f"{tp['round_trips_per_msg_worker']:.3f} round trips"
            ),
            (
                f"request/reply, 1 sequential caller, {lat['requests']} requests: p50 "
                f"{lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms, mean {lat['mean_ms']:.3f} ms"
            ),
            (
                f"  per request, caller and worker: {lat['redis_commands_per_request']:.2f} Redis "
                f"commands, {lat['round_trips_per_request']:.2f} round trips"
            ),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python bench/messaging_bench.py` (plain progress lines on stderr)."""
    ap = argparse.ArgumentParser(
        prog="messaging_bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--requests", type=int, default=3_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = run_bench(messages=a.messages, requests=a.requests, concurrency=a.concurrency)
    print(json.dumps(out, indent=2) if a.json else format_report(out))
    return 0

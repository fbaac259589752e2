"""The benchmark's setting: its namespace, capability and agent, the constants of its
workloads, and the worker processes it starts and waits for."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis

from reach import Agent, Context
from reach.connection import connect
from reach.registry import Registry

from .. import floor

NS = "bench"
CAP = "bench.noop"
AGENT_ID = "bench-1"
Progress = Callable[[str, int, int], None]  # (phase, done, total)
WARM_UP = 200  # requests before the latency samples
STREAM_INFLIGHT = 50  # reach's streaming caller: Client.send calls in flight
FLOOR_BATCH = 500  # the floor's streaming caller: XADDs per pipeline
POLL_S = 0.005  # completion polling interval
LOAD_BATCH = 1000  # backlog messages per loading pipeline
Measure = Callable[[str, int, subprocess.Popen[bytes], Progress | None], Awaitable[dict[str, Any]]]


def bench_agent() -> Agent:
    """The benchmark's agent: answers with its payload (the cost is reach's, not the handler's)."""
    app = Agent(AGENT_ID, capabilities=[CAP])

    @app.handler(CAP)
    async def handle(payload: Any, ctx: Context) -> Any:
        return payload

    return app


def _popen(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=err)


def _reach_worker_cmd(url: str, concurrency: int) -> list[str]:
    return [
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


@contextmanager
def reach_worker(
    url: str, log: Path, concurrency: int = 64, *, python_args: Sequence[str] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``reach worker`` process of :func:`bench_agent` on ``url`` (stderr to ``log``),
    yielded once its agent is ready; continued (if stopped) and ended (SIGTERM, waited
    for) on exit. ``python_args`` go to its interpreter before ``-m reach_cli.app`` (e.g.
    ``-m cProfile -o FILE``, whose profile is written as the process ends)."""
    cmd = _reach_worker_cmd(url, concurrency)
    w = _popen([cmd[0], *python_args, *cmd[1:]], log)
    try:
        anyio.run(_wait_ready, url)
        yield w
    finally:
        w.send_signal(signal.SIGCONT)
        w.send_signal(signal.SIGTERM)
        w.wait()


async def send_stopped(client: Any, worker: subprocess.Popen[bytes], n: int) -> None:
    """Stop ``worker`` (SIGSTOP) and send ``n`` no-op messages to the benchmark capability
    through ``client.send_many``, :data:`FLOOR_BATCH` per call (each claimed at send for
    the stopped worker, whose registration stays fresh over the short pause); the worker
    is left stopped, its inbox full, for the caller to continue it (SIGCONT)."""
    worker.send_signal(signal.SIGSTOP)
    for start in range(0, n, FLOOR_BATCH):
        batch = [{"i": i} for i in range(start, min(start + FLOOR_BATCH, n))]
        sent = await client.send_many(CAP, batch)
        if any(isinstance(x, Exception) for x in sent):
            raise RuntimeError(f"send_many: not all sent: {sent[:3]!r}")


def _floor_worker_cmd(url: str, stream: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reach_cli.tools.floor",
        "worker",
        "--redis-url",
        url,
        "--stream",
        stream,
    ]


async def _wait_ready(url: str) -> None:
    r = await connect(url)
    try:
        reg = Registry(r, NS)
        with anyio.fail_after(30):
            while not await reg.agents(CAP, ready=True):
                await anyio.sleep(0.02)
    finally:
        await r.aclose()


def _lean_worker_cmd(url: str, stream: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reach_cli.tools.lean_floor",
        "worker",
        "--redis-url",
        url,
        "--stream",
        stream,
    ]


async def _wait_floor_ready(url: str, stream: str) -> None:
    r: Any = aredis.Redis.from_url(url)
    try:
        with anyio.fail_after(30):
            while not await r.get(floor.ready_key(stream)):
                await anyio.sleep(0.02)
    finally:
        await r.aclose()

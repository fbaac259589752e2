"""Self-healing: a Redis restart (with AOF, and one that lost everything) mid-stream."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import reach
from reach.client import Client
from reach.embedded import RedisServer
from reach.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "--heartbeat-s",
    "0.1",
    "--lease-s",
    "0.5",
    "--evict-after-s",
    "1.0",
    "--sweep-interval-s",
    "0.1",
]
pytestmark = pytest.mark.anyio


@pytest.fixture
def worker(fresh_redis: RedisServer, ns: str) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [
        sys.executable,
        "-m",
        "reach_cli.app",
        "worker",
        "tests.support.agents_recovery:w1",
        "--redis-url",
        fresh_redis.url,
        "--namespace",
        ns,
        "--log-level",
        "error",
        *FAST,
    ]
    p = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL)
    yield p
    p.kill()
    p.wait(timeout=10)


async def until_answered(c: Client, timeout_s: float = 30.0) -> str:
    """Keep asking until a request goes through (typed errors while Redis is away)."""
    with anyio.fail_after(timeout_s):
        while True:
            try:
                return str(await c.request("rec.work", {}, timeout_s=2))
            except reach.ReachError:
                c.invalidate()
                await anyio.sleep(0.05)


async def test_restart_with_aof_keeps_messages_and_traffic_resumes(
    fresh_redis: RedisServer, worker: subprocess.Popen[bytes], ns: str
) -> None:
    async with Client(redis_url=fresh_redis.url, namespace=ns, slow_start_s=0) as c:
        assert await until_answered(c) == "rec-1"
        before = await c.send("rec.work", {"sleep_s": 0.5})  # in flight across the restart
        fresh_redis.restart()  # SIGKILL, then start again from the AOF
        assert await until_answered(c) == "rec-1"
        with anyio.fail_after(30):
            while (await c.task(before)).status != "succeeded":
                await anyio.sleep(0.05)
        # Scripts were reloaded (NOSCRIPT), groups kept, the agent still registered.
        reg = Registry(c.redis, ns)
        a = await reg.get("rec-1")
        assert a is not None and a.state == "active" and a.ready
    assert worker.poll() is None


async def test_restart_that_lost_everything_re_registers(
    fresh_redis: RedisServer, worker: subprocess.Popen[bytes], ns: str
) -> None:
    async with Client(redis_url=fresh_redis.url, namespace=ns, slow_start_s=0) as c:
        assert await until_answered(c) == "rec-1"
        # Everything gone: registry, consumer groups, scripts.
        await c.redis.flushall()
        await c.redis.script_flush()
        assert await until_answered(c) == "rec-1"
        reg = Registry(c.redis, ns)
        with anyio.fail_after(20):  # its next heartbeat is told "not registered"
            while not ((a := await reg.get("rec-1")) and a.ready and a.state == "active"):
                await anyio.sleep(0.05)
        assert await reg.agent_ids("rec.work") == ["rec-1"]
    assert worker.poll() is None

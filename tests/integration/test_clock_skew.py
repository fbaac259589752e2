"""A worker whose clock is 30 s ahead of Redis's: deadlines are judged on Redis's clock
(reach.clock: the offset to Redis's TIME, measured at start and with the heartbeats), so
its messages are not expired, and it says once that its clock is off; on standalone Redis
and on a Cluster (there through server_time.lua, keyed to the registry's master)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

import reach
from reach.client import Client
from reach.clock import APPLY_S, WARN_S, Clock
from tests.support.cluster import RedisTestCluster
from tests.support.workers import FAST, ROOT

pytestmark = pytest.mark.anyio


def test_an_injected_clock_30_s_ahead_is_corrected_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    real = 1_800_000_000.0
    clock = Clock(local=lambda: real + 30.0)
    reply = (b"1800000000", b"250000")  # Redis's TIME: real + 0.25 s
    assert clock.now_ms() == int((real + 30) * 1000)  # not measured yet: the host's own
    with caplog.at_level("WARNING", logger="reach.clock"):
        skew = clock.observe(reply, real + 30.0, real + 30.0)
        clock.observe(reply, real + 30.0, real + 30.0)
    assert skew == pytest.approx(-29.75)
    assert clock.now_ms() == int((real + 0.25) * 1000)
    assert len(caplog.records) == 1  # once, however many measurements
    assert "29.8 s ahead of Redis's" in caplog.records[0].message
    # clocks that agree within what one round trip measures are left alone
    near = Clock(local=lambda: real + APPLY_S / 2)
    near.observe((b"1800000000", b"0"), real, real + 0.001)
    assert near.offset_ms == 0 and not near.warned
    assert WARN_S > APPLY_S


@contextmanager
def skewed_worker(url: str, ns: str, log: Path) -> Iterator[None]:
    """A ``reach worker`` whose host clock is 30 s ahead, serving ``route.echo``; its
    warnings go to ``log``."""
    cmd = [sys.executable, "-m", "tests.support.skewed", "30", "worker"]
    cmd += ["tests.support.agents_routing:fast", "--redis-url", url, "--namespace", ns]
    cmd += ["--log-level", "warning", *FAST]
    with open(log, "wb") as err:
        p = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=err)
    try:
        yield
    finally:
        p.kill()
        p.wait(timeout=10)


async def _answered_in_time_and_warned_once(url: str, ns: str, log: Path) -> None:
    async with Client(redis_url=url, namespace=ns) as c:
        with anyio.fail_after(60):
            while True:
                c.invalidate()
                try:
                    if await c.eligible("route.echo"):
                        break
                except reach.NoAgentAvailable:
                    pass
                await anyio.sleep(0.05)
        # deadlines well under the 30 s the worker's clock is ahead
        got = [await c.request("route.echo", i, timeout_s=5) for i in range(5)]
        got += await c.request_many("route.echo", [5, 6, 7], timeout_s=2)
    assert got == ["fast"] * 8
    text = log.read_text()
    warnings = [line for line in text.splitlines() if "clock is" in line]
    assert len(warnings) == 1, text
    assert re.search(r"clock is (29|30)\.\d s ahead of Redis's", warnings[0]), warnings[0]


async def test_a_worker_30_s_ahead_does_not_expire_messages_and_warns_once(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with skewed_worker(redis_url, ns, log):
        await _answered_in_time_and_warned_once(redis_url, ns, log)


@pytest.mark.cluster
async def test_on_a_cluster_a_worker_30_s_ahead_does_not_expire_messages_and_warns_once(
    redis_cluster: RedisTestCluster, ns: str, tmp_path: Path
) -> None:
    """On a Cluster the offset is measured with server_time.lua, keyed to the registry's
    master (a keyless TIME would need a connection of its own): measured all the same."""
    log = tmp_path / "worker.log"
    with skewed_worker(redis_cluster.url, ns, log):
        await _answered_in_time_and_warned_once(redis_cluster.url, ns, log)


def test_a_slow_round_trip_does_not_invent_a_skew() -> None:
    real = 1_800_000_000.0
    clock = Clock(local=lambda: real)
    # answered 0.15 s after the middle of a 0.4 s round trip: within what it can tell
    clock.observe((b"1800000000", b"350000"), real, real + 0.4)
    assert clock.offset_ms == 0
    clock.observe((b"1800000000", b"350000"), real, real + 0.002)  # a quick one can
    assert clock.offset_ms == 349

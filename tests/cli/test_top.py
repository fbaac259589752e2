"""`reach top`: one frame (--once, table and --json) with a real worker, rates from
Redis' own stream counters, and the live view ending on q (on a pty) and on Ctrl-C."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis
from reach_cli.app import app
from reach_cli.top import collect, frame_data
from typer.testing import CliRunner

from reach.client import Client
from reach.connection import connect
from reach.keys import GROUP, Keys
from reach.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "--heartbeat-s",
    "0.1",
    "--lease-s",
    "0.3",
    "--evict-after-s",
    "0.6",
    "--sweep-interval-s",
    "0.1",
]
runner = CliRunner()


def cli(url: str, ns: str, *args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, ["top", *args, "--redis-url", url, "--namespace", ns])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture
def plain_worker(redis_url: str, ns: str) -> Iterator[None]:
    """plain-1 (test.plain echoes; test.other refuses: its messages dead-letter),
    after 3 echoes and 1 dead letter."""
    cmd = [
        sys.executable,
        "-m",
        "reach_cli.app",
        "worker",
        "tests.support.agents_lifecycle:plain",
        "--redis-url",
        redis_url,
        "--namespace",
        ns,
        "--log-level",
        "warning",
        *FAST,
    ]
    p = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL)

    async def setup() -> None:
        r = await connect(redis_url)
        reg = Registry(r, ns)
        with anyio.fail_after(20):
            while not ((a := await reg.get("plain-1")) and a.ready):
                assert p.poll() is None
                await anyio.sleep(0.05)
            async with Client(redis=r, namespace=ns) as c:
                for i in range(3):
                    assert await c.request("test.plain", i, timeout_s=20) == i
                await c.send("test.other", {})
            while await r.xlen(Keys(ns).dlq("test.other")) < 1:
                await anyio.sleep(0.05)
        await r.aclose()

    try:
        anyio.run(setup)
        yield
    finally:
        p.kill()
        p.wait(timeout=10)


def test_once_renders_one_frame(plain_worker: None, redis_url: str, ns: str) -> None:
    code, out, err = cli(redis_url, ns, "--once", "--interval", "0.2")
    assert code == 0, err
    assert out.count("reach top") == 1  # one frame
    for word in (
        "capabilities",
        "agents",
        "plain-1",
        "test.plain",
        "test.other",
        "active",
        "routable",
        f"ns={ns}",
        "dead letters 1",
    ):
        assert word in out, (word, out)
    assert "q or Ctrl-C" not in out


def test_once_json(plain_worker: None, redis_url: str, ns: str) -> None:
    code, out, err = cli(redis_url, ns, "--once", "--json", "--interval", "0.2")
    assert code == 0, err
    data = json.loads(out)
    assert data["namespace"] == ns and data["interval_s"] > 0
    (a,) = data["agents"]
    assert a["agent_id"] == "plain-1" and a["state"] == "active" and a["weight"] == 3
    assert a["routing"] == "routable"
    assert a["capabilities"] == ["test.plain", "test.other"]
    assert set(a["queue"]) == {"high", "normal", "low"}
    assert a["lease_age_ms"] is not None and a["lease_age_ms"] < 5000
    assert a["in_per_s"] is not None  # Redis >= 7: counters known
    caps = {c["capability"]: c for c in data["capabilities"]}
    assert caps["test.other"]["dead_letters"] == 1
    assert caps["test.plain"] == {
        "capability": "test.plain",
        "agents": 1,
        "routable": 1,
        "queued": 0,
        "inflight": 0,
        "shared": ["test.other"],  # one agent serves both: one inbox
        "dead_letters": 0,
        "failed": None,  # reach top does not count cancelled letters apart
        "cancelled": None,
        "dead_per_s": None,
        "security": "public",  # who may call it (reach.authz)
    }
    assert data["totals"]["agents"] == {"active": 1}
    assert data["totals"]["routing"] == {"routable": 1}
    assert data["totals"]["dead_letters"] == 1


def test_once_on_an_empty_namespace(redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "--once", "--interval", "0")
    assert code == 0 and "no agents" in out


def test_bad_options(redis_url: str, ns: str) -> None:
    code, _, err = cli(redis_url, ns, "--once", "--sort", "nope")
    assert code == 2 and "--sort" in err


@pytest.mark.anyio
async def test_rates_are_deltas_of_the_stream_counters(redis_url: str, ns: str) -> None:
    r = await connect(redis_url)
    keys = Keys(ns)
    reg = Registry(r, ns)
    await reg.register(
        "rate-1",
        instance_id="i",
        version=1,
        capabilities=["t.rate"],
        ready=True,
        lease_ms=60_000,
        evict_after_ms=120_000,
    )
    inbox = keys.inbox("rate-1", "normal")
    await r.xgroup_create(inbox, GROUP, id="0", mkstream=True)

    async def take(n: int, settle: int) -> None:
        """Read n entries, ack and delete the first ``settle`` (as the runtime does)."""
        got = await r.xreadgroup(GROUP, "rate-1", {inbox: ">"}, count=n)
        ids = [i for i, _ in got[0][1]][:settle]
        if ids:
            await r.xack(inbox, GROUP, *ids)
            await r.xdel(inbox, *ids)

    for _ in range(3):
        await r.xadd(inbox, {"e": b"x"})
    await take(1, 1)
    first = await collect(r, ns)
    for _ in range(10):
        await r.xadd(inbox, {"e": b"x"})
    await take(4, 2)  # deleted entries do not change the counters
    await r.xadd(keys.dlq("t.rate"), {"x": b"1"})
    await anyio.sleep(0.1)
    second = await collect(r, ns)
    await r.aclose()
    data = frame_data(second, first, ns)
    dt = second.mono - first.mono
    (a,) = data["agents"]
    assert a["in_per_s"] == pytest.approx(10 / dt)
    assert a["taken_per_s"] == pytest.approx(4 / dt)
    assert a["queue"] == {"high": 0, "normal": 10, "low": 0}
    assert a["pending"] == 2
    assert a["state"] == "active" and a["routing"] == "routable"
    (c,) = data["capabilities"]
    assert c["dead_letters"] == 1 and c["queued"] == 10
    assert c["dead_per_s"] is None  # the stream did not exist at the first sample
    assert frame_data(second, None, ns)["agents"][0]["in_per_s"] is None


def _top_cmd(url: str, ns: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reach_cli.app",
        "top",
        "--redis-url",
        url,
        "--namespace",
        ns,
        "--interval",
        "0.1",
        *extra,
    ]


def _read_until(fd: int, needle: bytes, timeout_s: float = 20.0) -> bytes:
    buf = b""
    end = time.monotonic() + timeout_s
    while needle not in buf:
        assert time.monotonic() < end, buf[-2000:]
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf


def test_live_view_quits_on_q_and_restores_the_terminal(redis_url: str, ns: str) -> None:
    import pty
    import termios

    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "160", "LINES": "50"}
    p = subprocess.Popen(
        _top_cmd(redis_url, ns), cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, env=env
    )
    try:
        out = _read_until(master, b"q or Ctrl-C to quit")
        out += _read_until(master, b"q or Ctrl-C to quit")  # it refreshes
        assert b"reach top" in out
        os.write(master, b"q")
        assert p.wait(timeout=20) == 0
        assert termios.tcgetattr(slave)[3] == before[3]  # cbreak undone (lflags)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
        os.close(slave)


def test_piped_live_view_prints_frames_and_ends_on_ctrl_c_with_130(
    redis_url: str, ns: str, sync_r: redis.Redis
) -> None:
    p = subprocess.Popen(
        _top_cmd(redis_url, ns, "--json"),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline(), p.stdout.readline()]  # one JSON object per refresh
        assert [json.loads(x)["namespace"] for x in lines] == [ns, ns]
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
        assert p.returncode == 130, err  # interrupted, as docs/cli.md says of every command
        assert b"Traceback" not in err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()

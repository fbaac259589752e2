"""The registry commands of the `reach` CLI against a real Redis: tables and --json."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis
from reach_cli.app import app
from typer.testing import CliRunner

from reach.connection import connect
from reach.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def cli(url: str, ns: str, *args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, [*args, "--redis-url", url, "--namespace", ns])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture
def populated(redis_url: str, ns: str) -> Iterator[None]:
    async def setup() -> None:
        r = await connect(redis_url)
        reg = Registry(r, ns)
        common = {"lease_ms": 60_000, "evict_after_ms": 120_000}
        await reg.register(
            "sum-1",
            instance_id="i1",
            version=1,
            ready=True,
            weight=2,
            capabilities=["text.summarize"],
            metadata={"region": "eu", "timeouts": {"text.summarize": 15}},
            **common,
        )
        await reg.register(
            "sum-2",
            instance_id="i2",
            version=1,
            ready=False,
            capabilities=["text.summarize", "text.translate"],
            metadata={"region": "us", "timeouts": {"text.summarize": 40, "text.translate": "x"}},
            **common,
        )
        await reg.register(
            "gone-1",
            instance_id="i3",
            version=1,
            ready=True,
            capabilities=["code.review"],
            lease_ms=1,
            evict_after_ms=1,
        )
        await anyio.sleep(0.01)
        await reg.sweep(owner="t")
        await r.aclose()

    anyio.run(setup)
    yield


def test_caps_table_and_json(populated: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "caps", "--json")
    assert code == 0
    rows = {r["capability"]: r for r in json.loads(out)}
    # the timeout: the longest the agents advertise (40 s of the two); none readable: null
    assert rows == {
        "text.summarize": {
            "capability": "text.summarize", "agents": 2, "routable": 1, "timeout_s": 40.0,
            "limit": None, "security": "public",
        },
        "text.translate": {
            "capability": "text.translate", "agents": 1, "routable": 0, "timeout_s": None,
            "limit": None, "security": "public",
        },
    }  # fmt: skip
    code, out, _ = cli(redis_url, ns, "caps")
    assert code == 0 and "text.summarize" in out and "text.translate" in out
    assert "40 s" in out


def test_agents_json_has_the_documented_fields(populated: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "agents", "--json")
    assert code == 0
    rows = {r["agent_id"]: r for r in json.loads(out)}
    assert set(rows) == {"sum-1", "sum-2", "gone-1"}
    for r in rows.values():
        for f in (
            "agent_id",
            "state",
            "routing",
            "ready",
            "draining",
            "weight",
            "version",
            "capabilities",
            "metadata",
            "last_heartbeat_ms",
        ):
            assert f in r
    assert rows["sum-1"]["weight"] == 2 and rows["sum-1"]["ready"] is True
    assert rows["sum-2"]["capabilities"] == ["text.summarize", "text.translate"]
    assert rows["gone-1"]["state"] == "evicted"
    assert {k: r["routing"] for k, r in rows.items()} == {
        "sum-1": "routable",
        "sum-2": "starting",
        "gone-1": "-",
    }


def test_agents_table_is_readable_text(populated: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "agents")
    assert code == 0
    assert "routing" in out and "routable" in out and "starting" in out
    assert "text.summarize, text.translate" in out  # a list as text
    for repr_bit in ("['", "{'", "True", "False"):
        assert repr_bit not in out, (repr_bit, out)


def test_agents_filters(populated: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "agents", "--cap", "text.summarize", "--json")
    assert sorted(r["agent_id"] for r in json.loads(out)) == ["sum-1", "sum-2"]
    code, out, _ = cli(redis_url, ns, "agents", "--state", "evicted", "--json")
    assert [r["agent_id"] for r in json.loads(out)] == ["gone-1"]
    code, out, _ = cli(redis_url, ns, "agents", "--where", "region=us", "--json")
    assert [r["agent_id"] for r in json.loads(out)] == ["sum-2"]
    code, out, err = cli(redis_url, ns, "agents", "--state", "sleeping")
    assert code == 2 and "unknown state" in err


def test_agents_table_shows_lease_age(populated: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "agents")
    assert code == 0
    assert "lease age" in out and "sum-1" in out and "evicted" in out


def test_agents_show_and_drain(populated: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "agents", "show", "sum-1", "--json")
    assert code == 0
    assert json.loads(out)["metadata"] == {"region": "eu", "timeouts": {"text.summarize": 15}}
    code, out, _ = cli(redis_url, ns, "agents", "drain", "sum-1")
    assert code == 0 and "draining" in out
    code, out, _ = cli(redis_url, ns, "agents", "show", "sum-1", "--json")
    assert json.loads(out)["draining"] is True
    code, _, err = cli(redis_url, ns, "agents", "show", "nobody")
    assert code == 2 and "No agent 'nobody'" in err
    code, _, err = cli(redis_url, ns, "agents", "drain", "nobody")
    assert code == 2 and "reach agents" in err


def test_events_and_sweep(populated: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "events", "--json")
    assert code == 0
    types = [e["type"] for e in json.loads(out)]
    assert types.count("registered") == 3 and "evicted" in types
    code, out, _ = cli(redis_url, ns, "events")
    assert "registered" in out and "gone-1" in out
    code, out, _ = cli(redis_url, ns, "sweep", "--json")
    assert code == 0 and json.loads(out)["evicted"] == []


def test_unreachable_redis_is_one_clear_line(ns: str) -> None:
    for args in (["agents"], ["caps"], ["events"], ["agents", "show", "x"], ["dlq", "list"]):
        res = runner.invoke(app, [*args, "--redis-url", "redis://127.0.0.1:1/0"])
        assert res.exit_code == 2, args
        assert "Cannot reach Redis" in res.stderr and "reach redis" in res.stderr
        assert "Traceback" not in res.stderr + res.stdout


def test_worker_with_bad_target_says_what_to_do(redis_url: str, ns: str) -> None:
    code, _, err = cli(redis_url, ns, "worker", "no_such_module:app")
    assert code == 2 and "Cannot import" in err
    code, _, err = cli(redis_url, ns, "worker", "json")
    assert code == 2 and "MODULE:ATTR" in err


def test_version_and_help() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.startswith("reach ")
    res = runner.invoke(app, ["agents", "--help"])
    assert res.exit_code == 0 and "--json" in res.stdout and "REACH_REDIS_URL" in res.stdout


def test_reach_redis_runs_a_persistent_server(tmp_path: Path) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "reach_cli.app", "redis", "--port", "0", "--dir", str(tmp_path)],
        cwd=tmp_path,  # it writes .reach/config where it runs: never in the repository
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        url = p.stdout.readline().strip()
        assert url.startswith("redis://127.0.0.1:")
        c = redis.Redis.from_url(url)
        assert c.ping()
        assert c.config_get("appendonly")["appendonly"] == "yes"
        assert c.config_get("appendfsync")["appendfsync"] == "everysec"
        c.close()
        assert (tmp_path / "url").read_text().strip() == url
    finally:
        p.send_signal(signal.SIGINT)
        # Generous: stopping flushes the AOF to disk, and the CLI gives Redis 10 s after
        # SIGTERM before it SIGKILLs it; a slow disk on a shared CI machine can take that.
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate(timeout=10)
            pytest.fail(f"`reach redis` did not stop within 60 s of SIGINT; stderr: {err}")
    assert p.returncode == 130, err  # Ctrl-C: interrupted, as docs/cli.md says
    assert "Traceback" not in err
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()


def test_events_follow_prints_new_events_as_they_happen(redis_url: str, ns: str) -> None:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reach_cli.app",
            "events",
            "--follow",
            "--redis-url",
            redis_url,
            "--namespace",
            ns,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        async def register() -> None:
            r = await connect(redis_url)
            await Registry(r, ns).register(
                "late-1",
                instance_id="i",
                version=1,
                ready=False,
                capabilities=["x.y"],
                lease_ms=60_000,
                evict_after_ms=120_000,
            )
            await r.aclose()

        # It prints past events first (none here), then follows; registering after it
        # started must show up on its output.
        line = ""
        for _ in range(3):  # the follower may start after the first registration
            anyio.run(register)
            assert p.stdout is not None
            line = p.stdout.readline()
            if "late-1" in line:
                break
        assert "registered" in line and "late-1" in line
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=20)

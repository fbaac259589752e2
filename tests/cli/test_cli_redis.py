"""`reach redis`: a restart keeps its port while the old connections are in TIME-WAIT, a
second server on the same data directory is refused, and Ctrl-C exits 130."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from reach.embedded import free_port
from reach.keys import Keys


class ReachRedis:
    """One `reach redis` process; ``url`` is the line it printed."""

    def __init__(self, *args: str, cwd: Path) -> None:
        # Run in a directory of the test's own: `reach redis` writes .reach/config there.
        self.p = subprocess.Popen(
            [sys.executable, "-m", "reach_cli.app", "redis", *args],
            cwd=cwd,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.p.stdout is not None
        self.url = self.p.stdout.readline().strip()
        if not self.url:
            _, err = self.p.communicate(timeout=30)
            pytest.fail(f"`reach redis {' '.join(args)}` printed no URL: {err}")

    def ctrl_c(self) -> tuple[int, str]:
        self.p.send_signal(signal.SIGINT)
        try:
            _, err = self.p.communicate(timeout=60)  # stopping flushes the AOF
        except subprocess.TimeoutExpired:
            self.p.kill()
            _, err = self.p.communicate(timeout=10)
            pytest.fail(f"`reach redis` did not stop within 60 s of SIGINT; stderr: {err}")
        return self.p.returncode, err

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.communicate(timeout=10)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "REACH_REDIS_URL"}


@pytest.fixture
def servers() -> Iterator[list[ReachRedis]]:
    started: list[ReachRedis] = []
    yield started
    for s in started:
        s.kill()  # its Redis dies with it (PDEATHSIG)


def _plain_bind_fails(port: int) -> bool:
    """True when a bind() without SO_REUSEADDR fails: the port's sockets are in TIME-WAIT."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def test_restart_keeps_the_port_while_old_connections_are_in_time_wait(
    tmp_path: Path, servers: list[ReachRedis]
) -> None:
    port = free_port()
    first = ReachRedis("--port", str(port), "--dir", str(tmp_path), cwd=tmp_path)
    servers.append(first)
    assert first.url == f"redis://127.0.0.1:{port}/0"
    clients = [redis.Redis.from_url(first.url) for _ in range(5)]
    for c in clients:
        assert c.ping()
    code, err = first.ctrl_c()  # Redis closes the connections first: its side waits
    assert code == 130, err
    for c in clients:
        c.close()
    assert _plain_bind_fails(port), "no TIME-WAIT left behind: this test would prove nothing"

    second = ReachRedis("--port", str(port), "--dir", str(tmp_path), cwd=tmp_path)
    servers.append(second)
    assert second.url == f"redis://127.0.0.1:{port}/0"
    assert (tmp_path / "url").read_text().strip() == second.url
    code, err = second.ctrl_c()
    assert "busy" not in err, err
    assert code == 130, err


def test_a_second_server_on_the_same_directory_is_refused(
    tmp_path: Path, servers: list[ReachRedis]
) -> None:
    first = ReachRedis("--port", "0", "--dir", str(tmp_path), cwd=tmp_path)
    servers.append(first)
    c = redis.Redis.from_url(first.url)
    pid = c.info("server")["process_id"]
    c.set("k", "v")
    c.close()

    p = subprocess.Popen(
        [sys.executable, "-m", "reach_cli.app", "redis", "--port", "0", "--dir", str(tmp_path)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate(timeout=10)
        pytest.fail(f"a second `reach redis` on one directory kept running: {out} {err}")
    assert p.returncode == 2, (out, err)
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith("error:") and first.url in err and f"pid {pid}" in err, err
    assert str(tmp_path) in err.replace("\n", "")
    # the first one is untouched and still serves the same data
    assert (tmp_path / "url").read_text().strip() == first.url
    c = redis.Redis.from_url(first.url)
    assert c.get("k") == b"v"
    c.close()
    code, err = first.ctrl_c()
    assert code == 130, err

    # once it stopped, the directory can be served again
    again = ReachRedis("--port", "0", "--dir", str(tmp_path), cwd=tmp_path)
    servers.append(again)
    c = redis.Redis.from_url(again.url)
    assert c.get("k") == b"v"  # from the AOF
    c.close()
    assert again.ctrl_c()[0] == 130


def _reach(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reach_cli.app", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_commands_refuse_to_guess_a_redis(tmp_path: Path) -> None:
    """No --redis-url, no REACH_REDIS_URL, no project file: one error line saying how to
    set one, exit 2 (never a look at localhost:6379)."""
    for args in (["caps"], ["agents"], ["top", "--once"], ["worker", "x:y"], ["dlq", "list"]):
        p = _reach(*args, cwd=tmp_path)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        err = " ".join(p.stderr.split())
        assert err.startswith("error: No Redis configured"), err
        for needle in ("--redis-url", "REACH_REDIS_URL", "reach redis", "reach init"):
            assert needle in err, (needle, err)
        assert "Cannot reach" not in err  # it did not try one


def test_commands_find_the_reach_redis_started_in_a_parent(
    tmp_path: Path, servers: list[ReachRedis]
) -> None:
    project = tmp_path / "project"
    sub = project / "src" / "deep"
    sub.mkdir(parents=True)
    srv = ReachRedis("--port", "0", cwd=project)  # data in project/.reach/redis
    servers.append(srv)
    assert (project / ".reach" / "config").read_text().count(srv.url) == 1
    c = redis.Redis.from_url(srv.url)
    c.xadd(Keys("default").events, {"type": "registered", "agent_id": "marker-1", "ts": "1"})
    c.close()
    p = _reach("events", "--json", cwd=sub)  # from two levels below: the same server
    assert p.returncode == 0, p.stderr
    assert [e["agent_id"] for e in json.loads(p.stdout)] == ["marker-1"]
    # an explicit URL still wins over the file
    p = _reach("caps", "--redis-url", "redis://127.0.0.1:1/0", cwd=sub)
    assert p.returncode == 2 and "127.0.0.1:1" in p.stderr
    # outside the project: nothing found
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert _reach("caps", cwd=other).returncode == 2
    assert srv.ctrl_c()[0] == 130


def test_init_writes_reach_toml(tmp_path: Path) -> None:
    p = _reach("init", cwd=tmp_path)
    assert p.returncode == 2 and "--redis-url" in p.stderr
    p = _reach("init", "--redis-url", "redis://u:secret@10.0.0.9:6379/2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "secret" not in p.stdout
    assert 'redis_url = "redis://u:secret@10.0.0.9:6379/2"' in (tmp_path / "reach.toml").read_text()
    p = _reach("init", "--redis-url", "redis://other:1/0", cwd=tmp_path)
    assert p.returncode == 2 and "--force" in p.stderr and "secret" not in p.stderr
    p = _reach("init", "--redis-url", "redis://other:1/0", "--force", cwd=tmp_path)
    assert p.returncode == 0
    from reach.config import resolve_redis_url

    assert resolve_redis_url(start=tmp_path) == "redis://other:1/0"

"""`reach redis`: a restart keeps its port while the old connections are in TIME-WAIT, a
second server on the same data directory is refused, and Ctrl-C exits 130."""

from __future__ import annotations

import errno
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from reach.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]


class ReachRedis:
    """One `reach redis` process; ``url`` is the line it printed."""

    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "reach_cli.app", "redis", *args],
            cwd=ROOT,
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
    first = ReachRedis("--port", str(port), "--dir", str(tmp_path))
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

    second = ReachRedis("--port", str(port), "--dir", str(tmp_path))
    servers.append(second)
    assert second.url == f"redis://127.0.0.1:{port}/0"
    assert (tmp_path / "url").read_text().strip() == second.url
    code, err = second.ctrl_c()
    assert "busy" not in err, err
    assert code == 130, err


def test_a_second_server_on_the_same_directory_is_refused(
    tmp_path: Path, servers: list[ReachRedis]
) -> None:
    first = ReachRedis("--port", "0", "--dir", str(tmp_path))
    servers.append(first)
    c = redis.Redis.from_url(first.url)
    pid = c.info("server")["process_id"]
    c.set("k", "v")
    c.close()

    p = subprocess.Popen(
        [sys.executable, "-m", "reach_cli.app", "redis", "--port", "0", "--dir", str(tmp_path)],
        cwd=ROOT,
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
    again = ReachRedis("--port", "0", "--dir", str(tmp_path))
    servers.append(again)
    c = redis.Redis.from_url(again.url)
    assert c.get("k") == b"v"  # from the AOF
    c.close()
    assert again.ctrl_c()[0] == 130

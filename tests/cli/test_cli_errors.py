"""Every mistake an operator or the environment can make ends in one `error:` line and exit
code 2, never a traceback: bad arguments, bad worker targets, a Redis URL with a bad DB,
a server that is not Redis, an ACL user without a permission; Ctrl-C exits 130."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis
from reach_cli.app import app
from typer.testing import CliRunner

from reach.connection import connect
from reach.keys import Keys
from reach.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    # An exception typer did not turn into an exit code is a traceback for a user.
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        args,
        repr(res.exception),
        res.output,
    )
    return res.exit_code, res.stdout, res.stderr


def reach(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real command in a process of its own: what a user sees, exit code included."""
    return subprocess.run(
        [sys.executable, "-m", "reach_cli.app", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_one_error_line(out: str, err: str, *needles: str) -> None:
    assert "Traceback" not in out + err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, err
    text = " ".join(lines)
    for n in needles:
        assert n.lower() in text.lower(), (n, err)


# -- bad Redis: DB index, not a Redis, ACL --------------------------------------------------
@pytest.fixture(scope="module")
def not_redis() -> Iterator[str]:
    """A TCP service that answers every connection with an HTTP error page."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.settimeout(2)
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"redis://127.0.0.1:{srv.getsockname()[1]}/0"
    stop.set()
    t.join(timeout=5)
    srv.close()


@pytest.fixture
def no_info_url(sync_r: redis.Redis, redis_server) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """An ACL user of the test's own Redis allowed everything but INFO."""
    user = f"noinfo-{uuid.uuid4().hex[:8]}"
    sync_r.acl_setuser(
        user,
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-info"],
    )
    try:
        yield f"redis://{user}:pw@127.0.0.1:{redis_server.port}/0"
    finally:
        sync_r.acl_deluser(user)


LISTINGS = (
    ["caps"],
    ["agents"],
    ["events"],
    ["queues"],
    ["dlq", "list"],
    ["sweep"],
    ["task", "x"],
    ["send", "a.b", "1"],
    ["top", "--once", "--interval", "0"],
)


def test_db_index_out_of_range_is_one_error_line(redis_server, ns: str) -> None:  # type: ignore[no-untyped-def]
    url = f"redis://127.0.0.1:{redis_server.port}/99999"
    for args in LISTINGS:
        code, out, err = invoke(*args, "--redis-url", url, "-n", ns)
        assert code == 2, (args, out, err)
        assert_one_error_line(out, err, "DB index is out of range", "/99999")


def test_a_server_that_is_not_redis_is_one_error_line(not_redis: str, ns: str) -> None:
    for args in LISTINGS:
        code, out, err = invoke(*args, "--redis-url", not_redis, "-n", ns)
        assert code == 2, (args, out, err)
        assert_one_error_line(out, err, "not answer like a Redis server")


def test_a_missing_acl_permission_is_one_error_line(no_info_url: str, ns: str) -> None:
    for args in LISTINGS:
        code, out, err = invoke(*args, "--redis-url", no_info_url, "-n", ns)
        assert code == 2, (args, out, err)
        assert_one_error_line(out, err, "no permissions", "info", "ACL")
        assert ":pw@" not in err  # the password stays out of messages


def test_wrong_password_says_so(redis_server, ns: str) -> None:  # type: ignore[no-untyped-def]
    url = f"redis://nobody:wrong@127.0.0.1:{redis_server.port}/0"
    code, out, err = invoke("caps", "--redis-url", url, "-n", ns)
    assert code == 2
    assert_one_error_line(out, err, "credentials")
    assert "wrong" not in err


@pytest.mark.parametrize("bad", ["db", "not_redis", "acl"])
def test_worker_against_a_bad_redis_is_one_error_line(  # type: ignore[no-untyped-def]
    bad: str, redis_server, not_redis: str, no_info_url: str, ns: str
) -> None:
    url = {
        "db": f"redis://127.0.0.1:{redis_server.port}/99999",
        "not_redis": not_redis,
        "acl": no_info_url,
    }[bad]
    p = reach("worker", "tests.support.agents_lifecycle:plain", "--redis-url", url, "-n", ns)
    assert p.returncode == 2, p.stderr
    assert_one_error_line(p.stdout, p.stderr)


# -- events --------------------------------------------------------------------------------
def test_events_count_zero_and_negative(redis_url: str, ns: str) -> None:
    code, out, err = invoke("events", "--count", "0", "--redis-url", redis_url, "-n", ns)
    assert (code, out) == (0, ""), err
    code, out, err = invoke("events", "--count", "-1", "--redis-url", redis_url, "-n", ns)
    assert code == 2 and "--count" in err


def test_events_follow_count_zero_prints_only_new_events(redis_url: str, ns: str) -> None:
    async def register(agent_id: str) -> None:
        r = await connect(redis_url)
        await Registry(r, ns).register(
            agent_id,
            instance_id="i",
            version=1,
            ready=False,
            capabilities=["x.y"],
            lease_ms=60_000,
            evict_after_ms=120_000,
        )
        await r.aclose()

    anyio.run(register, "old-1")  # a past event: --count 0 must not print it
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reach_cli.app",
            "events",
            "--follow",
            "--count",
            "0",
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
    # It starts following at some point after the process starts: keep registering new
    # agents until it prints one (each registration is an event after the one before).
    done = threading.Event()

    def keep_registering() -> None:
        i = 0
        while not done.wait(0.2):
            anyio.run(register, f"new-{i}")
            i += 1

    t = threading.Thread(target=keep_registering, daemon=True)
    t.start()
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "registered" in line and "new-" in line and "old-1" not in line, (line, p.poll())
    finally:
        done.set()
        t.join(timeout=10)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
    assert p.returncode == 130, err
    assert "Traceback" not in err


# -- worker targets and options ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "needles"),
    [
        ("tests.cli.worker_targets:nope", ["has no attribute 'nope'", "app"]),
        (
            "tests.cli.worker_targets:handler_function",
            ["handler_function", "argument", "reach.Agent"],
        ),
        ("tests.cli.worker_targets:async_handler", ["async_handler", "reach.Agent"]),
        ("tests.cli.worker_targets:factory_of_a_string", ["returned str", "reach.Agent"]),
        ("tests.cli.worker_targets:NOT_AN_AGENT", ["is int", "reach.Agent"]),
        ("json:nope", ["has no attribute 'nope'"]),
    ],
)
def test_worker_targets_that_are_not_agents(target: str, needles: list[str], ns: str) -> None:
    code, out, err = invoke("worker", target, "--redis-url", "redis://127.0.0.1:1/0", "-n", ns)
    assert code == 2, (out, err)
    assert_one_error_line(out, err, *needles)
    assert "NoneType" not in err


def test_worker_log_level_is_checked(ns: str) -> None:
    code, _, err = invoke(
        "worker",
        "tests.cli.worker_targets:app",
        "--log-level",
        "loud",
        "--redis-url",
        "redis://127.0.0.1:1/0",
        "-n",
        ns,
    )
    assert code == 2
    for level in ("loud", "debug", "info", "warning", "error"):
        assert level in err, err


# -- Ctrl-C ----------------------------------------------------------------------------------
def test_ctrl_c_on_a_worker_drains_and_exits_130(redis_url: str, ns: str) -> None:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reach_cli.app",
            "worker",
            "tests.support.agents_lifecycle:plain",
            "--redis-url",
            redis_url,
            "-n",
            ns,
            "--heartbeat-s",
            "0.1",
            "--lease-s",
            "0.3",
            "--evict-after-s",
            "0.6",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    async def ready() -> bool:
        r = await connect(redis_url)
        try:
            a = await Registry(r, ns).get("plain-1")
            return bool(a and a.ready)
        finally:
            await r.aclose()

    async def wait_ready() -> None:
        from tests.support.waiting import wait_until

        await wait_until(ready, what="worker ready")

    try:
        anyio.run(wait_ready)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert "Traceback" not in err

    async def gone() -> bool:
        r = await connect(redis_url)
        try:
            return await Registry(r, ns).get("plain-1") is None
        finally:
            await r.aclose()

    assert anyio.run(gone), "a Ctrl-C'd worker drains and deregisters"


def test_a_reader_that_goes_away_ends_the_listing_quietly(
    sync_r: redis.Redis, redis_url: str, ns: str
) -> None:
    """`reach events | head -1`: no error, no traceback, exit code 0."""
    pipe = sync_r.pipeline(transaction=False)
    for i in range(3000):  # well over a pipe's buffer
        pipe.xadd(
            Keys(ns).events, {"type": "registered", "agent_id": f"a-{i}", "ts": "1700000000000"}
        )
    pipe.execute()
    for extra in ([], ["--json"], ["--follow"]):
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reach_cli.app",
                "events",
                "--count",
                "3000",
                *extra,
                "--redis-url",
                redis_url,
                "-n",
                ns,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline()
        p.stdout.close()
        try:
            err = p.stderr.read()
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, (extra, err)
        assert err == b"", (extra, err)

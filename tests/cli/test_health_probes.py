"""``/healthz`` and ``/readyz`` of real `reach worker` processes.

Two workers of one capability, each serving its probes on its metrics port. Worker A's
readiness check fails while a file the test creates exists: its ``/readyz`` turns 503
(saying why), the registry shows it not ready, and requests go to worker B meanwhile; the
file removed, A is ready and served again. Then A's handler pauses A by hand
(``ctx.agent.set_ready(False)``), with the same effects, until the test lets it resume.
``/healthz`` stays 200 throughout (not ready is not dead), and each flip is logged once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis
from reach.embedded import free_port
from reach.registry import Registry
from tests.support.waiting import wait_until
from tests.support.workers import FAST, ROOT

pytestmark = pytest.mark.anyio

TARGET = "tests.support.agents_health:flagged"


class ProbedWorker:
    """A `reach worker` serving its probes on a port of its own; its log in a file."""

    def __init__(self, url: str, ns: str, agent_id: str, log: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = log
        cmd = [
            sys.executable,
            "-m",
            "reach_cli.app",
            "worker",
            TARGET,
            "--agent-id",
            agent_id,
            "--redis-url",
            url,
            "--namespace",
            ns,
            *FAST,
            "--metrics-port",
            str(self.port),
            "--metrics-addr",
            "127.0.0.1",
            "--log-level",
            "info",
        ]
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **env},
            )

    async def probe(self, path: str) -> tuple[int, dict[str, Any]] | None:
        """(status, JSON body) of ``GET path``; None while nothing listens yet."""
        assert self.proc.poll() is None, self.log.read_text()

        def get() -> tuple[int, dict[str, Any]]:
            url = f"http://127.0.0.1:{self.port}{path}"
            try:
                with urllib.request.urlopen(url, timeout=5) as f:
                    return f.status, json.loads(f.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        try:
            return await anyio.to_thread.run_sync(get)
        except (urllib.error.URLError, ConnectionError):
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def flags(tmp_path: Path) -> dict[str, Path]:
    return {"unready": tmp_path / "unready.flag", "resume": tmp_path / "resume.flag"}


@pytest.fixture
def workers(
    redis_url: str, ns: str, tmp_path: Path, flags: dict[str, Path]
) -> Iterator[dict[str, ProbedWorker]]:
    env_a = {
        "REACH_TEST_UNREADY_FILE": str(flags["unready"]),
        "REACH_TEST_RESUME_FILE": str(flags["resume"]),
    }
    ws = {
        "a": ProbedWorker(redis_url, ns, "health-a", tmp_path / "a.log", env_a),
        # B's flags name no file: its check always passes
        "b": ProbedWorker(redis_url, ns, "health-b", tmp_path / "b.log", {}),
    }
    yield ws
    for w in ws.values():
        w.stop()


async def status_is(w: ProbedWorker, path: str, code: int) -> dict[str, Any] | None:
    got = await w.probe(path)
    return got[1] if got is not None and got[0] == code else None


async def registry_ready(r: AnyRedis, ns: str, agent_id: str, ready: bool) -> bool:
    a = await Registry(r, ns).get(agent_id)
    return a is not None and a.state == "active" and a.ready is ready and not a.draining


async def served_by(c: Client, n: int) -> set[str]:
    """Who answered ``n`` requests of health.echo."""
    return {str(await c.request("health.echo", {}, timeout_s=10)) for _ in range(n)}


async def test_readyz_follows_the_readiness_check_and_set_ready(
    workers: dict[str, ProbedWorker],
    flags: dict[str, Path],
    redis_url: str,
    ns: str,
    r: AnyRedis,
) -> None:
    a, b = workers["a"], workers["b"]
    for w in (a, b):
        body = await wait_until(lambda w=w: status_is(w, "/readyz", 200), what="ready")
        assert body == {"status": "ready", "agents": 1}
        assert await status_is(w, "/healthz", 200) == {"status": "ok", "agents": 1}

    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await wait_until(lambda: registry_ready(r, ns, "health-a", True), what="health-a routable")
        assert await served_by(c, 20) == {"health-a", "health-b"}

        # The dependency goes away: A's check fails at its next heartbeat.
        flags["unready"].touch()
        body = await wait_until(lambda: status_is(a, "/readyz", 503), what="A's /readyz 503")
        assert body == {
            "status": "not ready",
            "why": {"health-a": ["readiness check returned False"]},
        }
        assert await registry_ready(r, ns, "health-a", False)
        assert await status_is(a, "/healthz", 200) == {"status": "ok", "agents": 1}
        assert await status_is(b, "/readyz", 200)
        # Callers see it within a round trip (the `unready` event): none goes to A.
        await wait_until(
            lambda: _view_ready(c, "health-a", False), what="the client's view sees A unready"
        )
        assert await served_by(c, 20) == {"health-b"}

        # Back: ready and routed to again.
        flags["unready"].unlink()
        await wait_until(lambda: status_is(a, "/readyz", 200), what="A's /readyz 200 again")
        assert await registry_ready(r, ns, "health-a", True)
        await wait_until(lambda: _view_ready(c, "health-a", True), what="the view sees A ready")
        assert "health-a" in await served_by(c, 20)

        # A pauses itself by hand from a handler, until the test lets it resume.
        await c.send("health.pause", {}, target="health-a", timeout_s=60)
        body = await wait_until(lambda: status_is(a, "/readyz", 503), what="A paused")
        assert body == {"status": "not ready", "why": {"health-a": ["paused by set_ready(False)"]}}
        assert await registry_ready(r, ns, "health-a", False)
        assert await status_is(a, "/healthz", 200)
        await wait_until(lambda: _view_ready(c, "health-a", False), what="the view sees A paused")
        assert await served_by(c, 20) == {"health-b"}
        flags["resume"].touch()
        await wait_until(lambda: status_is(a, "/readyz", 200), what="A resumed")
        assert await registry_ready(r, ns, "health-a", True)

    # Each flip is logged once: two flips to not ready (the check, the pause), two back.
    a.stop()
    log = a.log.read_text()
    assert log.count("not ready, routing avoids it") == 2, log
    assert log.count("ready again: routable") == 2, log
    assert "readiness check returned False" in log and "paused by set_ready(False)" in log


async def _view_ready(c: Client, agent_id: str, ready: bool) -> bool:
    """Whether the client's registry view shows ``agent_id`` ready (routable) or not."""
    agents, _ = await c.view.candidates("health.echo")
    return any(x.agent_id == agent_id and x.ready is ready for x in agents)

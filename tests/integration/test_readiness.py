"""``@app.readiness``, ``set_ready`` and the probes, on agents run in this process.

The check's every way of failing (False, an exception, a timeout, a plain function
whose thread is still running) marks the agent not ready in the registry and in
``/readyz``, with the reason; passing again makes it ready. An agent paused before it runs
starts not ready. ``/healthz`` fails while a handler blocks the event loop past
``stall_s`` (served from a thread, it answers meanwhile) and passes again after.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import anyio
import pytest

from reach import Agent, Context, health
from reach.client import Client
from reach.connection import AnyRedis
from reach.registry import Registry
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

FAST: dict[str, Any] = {
    "heartbeat_s": 0.05,
    "lease_s": 0.5,
    "evict_after_s": 1.0,
    "block_ms": 100,
    "handle_signals": False,
    "sweeper": False,
}


def echo_agent(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=["rd.echo"])

    @app.handler("rd.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return payload

    return app


async def ready_in_registry(r: AnyRedis, ns: str, agent_id: str, ready: bool) -> bool:
    a = await Registry(r, ns).get(agent_id)
    return a is not None and a.state == "active" and a.ready is ready


async def readyz_says(probes: health.Health, *why: str) -> bool:
    """Whether ``/readyz`` (its function) says exactly ``why`` (none: 200 ready)."""
    code, body = probes.ready()
    if not why:
        return code == 200
    return code == 503 and body["why"] == {probes.agents[0].agent_id: list(why)}


async def test_each_way_the_check_fails_and_passing_again(
    redis_url: str, ns: str, r: AnyRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reach.runtime")
    app = echo_agent("rd-1")
    mode = {"now": "ok"}
    release = threading.Event()

    @app.readiness(timeout_s=0.3)
    def check() -> bool:  # a plain function: it runs in a worker thread
        m = mode["now"]
        if m == "raise":
            raise ConnectionError("db down")
        if m == "hang":
            release.wait(30)
        return m != "false"

    probes = health.Health([app])
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run(redis_url=redis_url, namespace=ns, **FAST))
        await wait_until(lambda: ready_in_registry(r, ns, "rd-1", True), what="ready")
        await wait_until(lambda: readyz_says(probes), what="/readyz 200")

        for m, why in (
            ("false", "readiness check returned False"),
            ("raise", "readiness check raised ConnectionError: db down"),
        ):
            mode["now"] = m
            await wait_until(lambda w=why: readyz_says(probes, w), what=f"/readyz: {why}")
            # The reason is noted first, then written: the registry follows.
            await wait_until(lambda: ready_in_registry(r, ns, "rd-1", False), what="not ready")
            mode["now"] = "ok"
            await wait_until(lambda: ready_in_registry(r, ns, "rd-1", True), what="ready again")
            await wait_until(lambda: readyz_says(probes), what="/readyz 200 again")

        # A check that hangs: timed out, then (its thread still running) not run twice.
        mode["now"] = "hang"
        await wait_until(lambda: ready_in_registry(r, ns, "rd-1", False), what="timed out")

        async def timeout_logged() -> bool:
            # The flip's log line follows its registry write: wait for it, not just read.
            flips = [m for m in caplog.messages if "not ready, routing avoids it" in m]
            return bool(flips) and flips[-1].endswith("readiness check did not answer within 0.3s")

        await wait_until(timeout_logged, what="the timeout logged as the reason")

        async def still_running() -> bool:
            _, body = probes.ready()
            return "readiness check still running" in str(body)

        await wait_until(still_running, what="the hung thread is waited for, not doubled")
        mode["now"] = "ok"
        release.set()
        await wait_until(lambda: ready_in_registry(r, ns, "rd-1", True), what="ready after")
        assert probes.live() == (200, {"status": "ok", "agents": 1})
        app.stop()
    # each flip logged once, however many checks ran meanwhile (one per 50 ms)
    assert sum("not ready, routing avoids it" in m for m in caplog.messages) == 3
    assert sum("ready again: routable" in m for m in caplog.messages) == 3


async def test_an_async_check_and_a_pause_held_against_a_passing_check(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    app = echo_agent("rd-2")
    up = {"db": True}

    @app.readiness
    async def db() -> bool:
        await anyio.lowlevel.checkpoint()
        return up["db"]

    app.set_ready(False)  # before run: it starts paused
    started = threading.Event()
    probes = health.Health([app])
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: app.run(redis_url=redis_url, namespace=ns, ready_event=started, **FAST)
        )
        await anyio.to_thread.run_sync(started.wait, 30)
        assert started.is_set()
        assert await ready_in_registry(r, ns, "rd-2", False)
        assert await readyz_says(probes, "paused by set_ready(False)")
        # Paused and failing: both said; the check passing again does not end the pause.
        up["db"] = False
        await wait_until(
            lambda: readyz_says(
                probes, "paused by set_ready(False)", "readiness check returned False"
            ),
            what="both reasons",
        )
        up["db"] = True
        await wait_until(lambda: readyz_says(probes, "paused by set_ready(False)"), what="pause")
        assert await ready_in_registry(r, ns, "rd-2", False)
        # Resumed from another thread: written at once, not at the next tick only.
        await anyio.to_thread.run_sync(app.set_ready, True)
        await wait_until(lambda: ready_in_registry(r, ns, "rd-2", True), what="resumed")
        # /readyz follows the agent's own note of that write, made once Redis has answered
        # it: a loaded run can read the registry in between.
        await wait_until(lambda: readyz_says(probes), what="/readyz ready")
        app.stop()
    # stopped: nothing to judge for liveness, not ready
    assert probes.live() == (200, {"status": "ok", "agents": 0})
    assert probes.ready() == (503, {"status": "not ready", "why": {"rd-2": ["not running"]}})


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as f:
            return f.status, json.loads(f.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def aget(url: str) -> tuple[int, dict[str, Any]]:
    return await anyio.to_thread.run_sync(_get, url)


async def test_healthz_fails_while_the_event_loop_is_blocked(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    app = Agent("rd-3", capabilities=["rd.block"])

    @app.handler("rd.block")
    async def block(payload: Any, ctx: Context) -> Any:
        time.sleep(2.0)  # noqa: ASYNC251 - a bug that blocks the event loop
        return "done"

    srv = health.serve(0, "127.0.0.1", health.Health([app]))
    base = f"http://127.0.0.1:{srv.server_port}"
    seen: list[tuple[int, dict[str, Any]]] = []
    stop_polling = threading.Event()

    def poll() -> None:  # from a thread: the test's event loop is the blocked one
        while not stop_polling.is_set():
            seen.append(_get(base + "/healthz"))
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    try:
        async with anyio.create_task_group() as tg:
            opts = {**FAST, "lease_s": 3.0, "evict_after_s": 6.0}
            tg.start_soon(lambda: app.run(redis_url=redis_url, namespace=ns, stall_s=0.5, **opts))
            await wait_until(lambda: ready_in_registry(r, ns, "rd-3", True), what="ready")
            assert await aget(base + "/healthz") == (200, {"status": "ok", "agents": 1})

            async def readyz_200() -> bool:  # noted by the agent once Redis answered it
                return await aget(base + "/readyz") == (200, {"status": "ready", "agents": 1})

            await wait_until(readyz_200, what="/readyz 200")
            poller.start()
            async with Client(redis_url=redis_url, namespace=ns) as c:
                assert await c.request("rd.block", {}, timeout_s=30) == "done"
            await wait_until(lambda: _healthy_again(seen), what="/healthz 200 after the block")
            app.stop()
    finally:
        stop_polling.set()
        if poller.is_alive():
            poller.join(10)
        srv.shutdown()
    failing = [body for code, body in seen if code == 503]
    assert failing, seen
    why = failing[0]["why"]["rd-3"]
    assert len(why) == 1 and why[0].startswith("event loop made no progress for "), failing[0]


async def _healthy_again(seen: list[tuple[int, dict[str, Any]]]) -> bool:
    return any(c == 503 for c, _ in seen) and seen[-1][0] == 200


async def test_the_metrics_port_still_serves_metrics_and_refuses_writes_to_probes() -> None:
    srv = health.serve(0, "127.0.0.1")
    base = f"http://127.0.0.1:{srv.server_port}"

    def metrics() -> bytes:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as f:
            return bytes(f.read())

    def post() -> int:
        req = urllib.request.Request(base + "/readyz", data=b"x", method="POST")
        try:
            urllib.request.urlopen(req, timeout=5)
        except urllib.error.HTTPError as e:
            return e.code
        return 200

    try:
        assert b"# TYPE reach_inbox_depth gauge" in await anyio.to_thread.run_sync(metrics)
        # no agent given yet: not ready, alive
        assert await aget(base + "/readyz") == (
            503,
            {"status": "not ready", "why": {"process": ["starting: no agent yet"]}},
        )
        assert await aget(base + "/healthz") == (200, {"status": "ok", "agents": 0})
        assert await anyio.to_thread.run_sync(post) == 405
    finally:
        srv.shutdown()

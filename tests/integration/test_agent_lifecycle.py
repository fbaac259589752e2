"""The agent shell as real `reach worker` processes: leases, SIGKILL, blocked and wedged
event loops, SIGTERM drain, SIGSTOP past eviction."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import anyio
import pytest

from reach.client import Client
from reach.connection import connect
from reach.registry import Registry
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_lifecycle")
    yield w
    w.stop_all()


async def state_of(reg: Registry, agent_id: str) -> str:
    a = await reg.get(agent_id)
    return "gone" if a is None else ("ready" if a.state == "active" and a.ready else a.state)


async def test_sigkill_goes_probation_then_evicted(
    workers: Workers, redis_url: str, ns: str
) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)
    p = workers.start("plain")
    await wait_until(lambda: _is(reg, "plain-1", "ready"))
    assert await reg.agent_ids("test.plain") == ["plain-1"]
    p.send_signal(signal.SIGKILL)
    p.wait()
    seen: list[str] = []

    async def evicted() -> bool:
        await reg.sweep(owner="test")  # the worker was the only sweeper
        s = await state_of(reg, "plain-1")
        if not seen or seen[-1] != s:
            seen.append(s)
        return s == "evicted"

    await wait_until(evicted)
    assert seen[-2:] == ["probation", "evicted"], seen
    assert await reg.agent_ids("test.plain") == []
    assert await reg.agent_ids("test.other") == []
    assert dict(await reg.capabilities()) == {}
    types = [e.type for e in await reg.recent_events(20)]
    assert types[-2:] == ["unstable", "evicted"]
    await r.aclose()


async def _is(reg: Registry, agent_id: str, want: str) -> bool:
    return await state_of(reg, agent_id) == want


async def _watch_until(reg: Registry, agent_id: str, done: anyio.Event, states: set[str]) -> None:
    while not done.is_set():
        await reg.sweep(owner="test")
        states.add(await state_of(reg, agent_id))
        await anyio.sleep(0.02)


async def test_blocked_loop_for_twice_the_lease_keeps_the_agent(
    workers: Workers, redis_url: str, ns: str
) -> None:
    """Heartbeats come from a thread: a handler blocking the loop 2x lease costs nothing."""
    r = await connect(redis_url)
    reg = Registry(r, ns)
    workers.start("blocker", "--stall-s", "5")
    await wait_until(lambda: _is(reg, "blocker-1", "ready"))
    states: set[str] = set()
    done = anyio.Event()
    async with Client(redis_url=redis_url, namespace=ns) as c, anyio.create_task_group() as tg:
        tg.start_soon(_watch_until, reg, "blocker-1", done, states)
        assert await c.request("test.block", {"seconds": 0.6}, timeout_s=20) == "unblocked"
        done.set()
    assert states == {"ready"}, states
    await r.aclose()


async def test_wedged_loop_stops_heartbeats_and_is_evicted(
    workers: Workers, redis_url: str, ns: str
) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)
    p = workers.start("blocker", "--stall-s", "0.5")
    await wait_until(lambda: _is(reg, "blocker-1", "ready"))
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await c.send("test.block", {"seconds": 30})

        async def evicted() -> bool:
            await reg.sweep(owner="test")
            return await state_of(reg, "blocker-1") == "evicted"

        await wait_until(evicted, timeout_s=20)
    assert p.poll() is None, "the wedged process is still alive, only evicted"
    await r.aclose()


async def test_sigterm_drains_and_deregisters(workers: Workers, redis_url: str, ns: str) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)
    p = workers.start("blocker", "--stall-s", "5")
    await wait_until(lambda: _is(reg, "blocker-1", "ready"))
    async with Client(redis_url=redis_url, namespace=ns) as c, anyio.create_task_group() as tg:
        result: list[str] = []

        async def call() -> None:
            result.append(await c.request("test.block", {"seconds": 0.5}, timeout_s=20))

        tg.start_soon(call)

        async def running() -> bool:
            a = await reg.get("blocker-1")
            pending = await r.xpending(c.keys.inbox("blocker-1", "normal"), "reach")
            return bool(a and a.inflight) or bool(pending["pending"])

        await wait_until(running)
        p.send_signal(signal.SIGTERM)
    assert result == ["unblocked"], "in-flight work finished during the drain"
    assert p.wait(timeout=20) == 0
    assert await reg.get("blocker-1") is None
    types = [e.type for e in await reg.recent_events(10)]
    assert "draining" in types and types[-1] == "deregistered"
    await r.aclose()


async def test_operator_drain_makes_the_worker_leave(
    workers: Workers, redis_url: str, ns: str
) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)
    p = workers.start("plain")
    await wait_until(lambda: _is(reg, "plain-1", "ready"))
    assert await reg.drain("plain-1") == 1
    assert p.wait(timeout=20) == 0
    assert await reg.get("plain-1") is None
    await r.aclose()


async def test_stopped_past_eviction_re_registers_on_resume(
    workers: Workers, redis_url: str, ns: str
) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)
    p = workers.start("plain")
    await wait_until(lambda: _is(reg, "plain-1", "ready"))
    before = await reg.get("plain-1")
    os.kill(p.pid, signal.SIGSTOP)
    try:

        async def evicted() -> bool:
            await reg.sweep(owner="test")
            return await state_of(reg, "plain-1") == "evicted"

        await wait_until(evicted)
    finally:
        os.kill(p.pid, signal.SIGCONT)
    await wait_until(lambda: _is(reg, "plain-1", "ready"))
    after = await reg.get("plain-1")
    assert before is not None and after is not None
    assert after.instance_id == before.instance_id  # the same process came back
    assert await reg.agent_ids("test.plain") == ["plain-1"]
    await r.aclose()


async def test_restart_with_same_id_replaces_and_old_version_is_stale(
    workers: Workers, redis_url: str, ns: str
) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)
    first = workers.start("plain")
    await wait_until(lambda: _is(reg, "plain-1", "ready"))
    v1 = (await reg.get("plain-1")).version  # type: ignore[union-attr]
    os.kill(first.pid, signal.SIGSTOP)
    try:
        workers.start("plain")  # same agent_id, newer version

        async def replaced() -> bool:
            a = await reg.get("plain-1")
            return bool(a and a.version > v1 and a.ready)

        await wait_until(replaced)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    # The old process learns from its next heartbeat that it is stale, and stops.
    assert first.wait(timeout=20) == 0
    a = await reg.get("plain-1")
    assert a is not None and a.version > v1 and a.state == "active"
    await r.aclose()


async def test_same_agent_id_started_twice_keeps_the_newer(
    workers: Workers, redis_url: str, ns: str
) -> None:
    """A rolling restart with overlap: the older process is fenced as stale and stops; its
    shutdown drain must not mark the newer registration as draining (issue 9, item 3: it
    did, and both processes stopped, leaving no worker)."""
    r = await connect(redis_url)
    reg = Registry(r, ns)
    older = workers.start("plain")
    await wait_until(lambda: _is(reg, "plain-1", "ready"))
    first = await reg.get("plain-1")
    assert first is not None
    newer = workers.start("plain")  # same agent_id, newer version

    async def replaced() -> bool:
        a = await reg.get("plain-1")
        return bool(a and a.instance_id != first.instance_id and a.ready)

    await wait_until(replaced)
    second = await reg.get("plain-1")
    assert second is not None and second.version > first.version
    # The older learns from its next heartbeat that it is stale, drains itself and stops.
    assert older.wait(timeout=20) == 0
    # Its drain ran before it exited: had it touched the newer record, the flag is set now.
    a = await reg.get("plain-1")
    assert a is not None
    assert (a.instance_id, a.state, a.ready, a.draining) == (
        second.instance_id,
        "active",
        True,
        False,
    )
    drained = [e for e in await reg.recent_events(50) if e.type == "draining"]
    assert drained == [], drained
    async with Client(redis_url=redis_url, namespace=ns) as c:
        for i in range(5):
            assert await c.request("test.plain", {"n": i}, timeout_s=20) == {"n": i}
    assert newer.poll() is None, "the newer process still runs"
    a = await reg.get("plain-1")
    assert a is not None and a.instance_id == second.instance_id and a.routable
    await r.aclose()


async def test_a_stop_before_the_run_has_started_is_not_lost(redis_url: str, ns: str) -> None:
    """`reach worker` turns its first SIGTERM into ``agent.stop()``; a signal that came
    while the agent was still starting (before its runtime existed: the start-up checks,
    a slow import under load) was dropped, and the worker then served on, never drained
    (seen in a long rolling-deploy run: a worker SIGTERMed while it started served 130 s
    more). The stop is kept: the run stops as soon as it has started, and leaves."""
    from reach import Agent, Context

    app = Agent("early-stop", capabilities=["test.early"])

    @app.handler("test.early")
    async def early(payload: object, ctx: Context) -> object:
        return payload

    app.stop()
    with anyio.fail_after(30):
        await app.run(
            redis_url=redis_url,
            namespace=ns,
            handle_signals=False,
            heartbeat_s=0.1,
            lease_s=0.3,
            evict_after_s=0.6,
        )
    r = await connect(redis_url)
    try:
        assert await Registry(r, ns).get("early-stop") is None, "left the registry"
    finally:
        await r.aclose()
    # A stop is for the run it was meant for: the next run serves until stopped again.
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run(redis_url=redis_url, namespace=ns, handle_signals=False))
        async with Client(redis_url=redis_url, namespace=ns) as c:

            async def answered() -> bool:
                try:
                    return bool(await c.request("test.early", 7, timeout_s=5) == 7)
                except Exception:  # noqa: BLE001 - not registered yet
                    c.invalidate()
                    return False

            await wait_until(answered, what="the next run serving")
        app.stop()

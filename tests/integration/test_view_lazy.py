"""The registry view's cost follows changes and the capabilities a process calls (issue 12,
item 1): it holds only the capabilities asked for, events keep them fresh, one cheap check
finds lost events and re-reads only what it holds, load figures are re-read only for the
capabilities in use, and a client that never routes never reads the registry."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.registry import Registry
from reach.view import RegistryView
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

A = "text.summarize"
B = "code.review"


def ids(agents: list[Any]) -> list[str]:
    return [a.agent_id for a in agents]


async def test_only_the_capabilities_asked_for_are_loaded(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    await register(reg, "a1", [A], ready=True)
    await register(reg, "ab", [A, B], ready=True)
    for i in range(20):
        await register(reg, f"b{i}", [B], ready=True)
    view = RegistryView(reg, refresh_s=60.0)
    assert view.capabilities == [] and view.agent_ids == []
    assert ids((await view.candidates(A))[0]) == ["a1", "ab"]
    assert view.capabilities == [A]
    assert view.agent_ids == ["a1", "ab"]  # not the 20 agents of the other capability
    assert len((await view.candidates(B))[0]) == 21
    assert view.capabilities == sorted([A, B])


async def test_events_keep_the_held_capabilities_fresh_without_reloads(
    r: AnyRedis, ns: str
) -> None:
    reg = Registry(r, ns)
    _, inst1, _ = await register(reg, "a1", [A], ready=True)
    view = RegistryView(reg, refresh_s=0.05, max_staleness_s=60.0, busy_s=0.0)
    loads: list[list[str]] = []
    real = view._load

    async def counting(caps: list[str]) -> None:
        loads.append(list(caps))
        await real(caps)

    view._load = counting  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(view.run)
        assert ids((await view.candidates(A))[0]) == ["a1"]
        v0 = view.version
        _, inst2, _ = await register(reg, "a2", [A], ready=True)
        await register(reg, "b1", [B], ready=True)

        async def two() -> bool:
            return ids((await view.candidates(A))[0]) == ["a1", "a2"]

        await wait_until(two, what="a registration seen through the events")
        assert view.version > v0
        assert "b1" not in view.agent_ids  # of a capability not asked for
        await reg.mark_ready("a1", instance_id=inst1, ready=False)

        async def unready() -> bool:
            return not (await view.candidates(A))[0][0].ready

        await wait_until(unready, what="readiness seen through the events")
        assert await reg.deregister("a2", instance_id=inst2) == 1

        async def one() -> bool:
            return ids((await view.candidates(A))[0]) == ["a1"]

        await wait_until(one, what="a deregistration seen through the events")
        tg.cancel_scope.cancel()
    assert loads == [[A]]  # one load at the first ask; the rest came from events
    assert view.resyncs == 0


async def test_lost_events_make_the_check_re_read_what_the_view_holds(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    await register(reg, "a1", [A], ready=True)
    view = RegistryView(reg, refresh_s=60.0)
    await view.candidates(A)
    await view._check()
    assert view.resyncs == 0
    # Trimmed before the view read it: the event of a2's registration is gone.
    await register(reg, "a2", [A], ready=True)
    await r.execute_command("XTRIM", reg.keys.events, "MAXLEN", 0)
    await view._check()  # the stream is ahead: may be events in flight
    assert view.agent_ids == ["a1"] and view.resyncs == 0
    await view._check()  # still short of what the last check saw: lost
    assert view.resyncs == 1
    assert ids((await view.candidates(A))[0]) == ["a1", "a2"]
    await view._check()
    assert view.resyncs == 1  # caught up
    # The stream went back (deleted; or a failover lost its end): re-read at once.
    await register(reg, "a3", [A], ready=True)
    await r.delete(reg.keys.events)
    await view._check()
    assert view.resyncs == 2
    assert ids((await view.candidates(A))[0]) == ["a1", "a2", "a3"]


async def test_the_running_check_recovers_from_a_deleted_stream(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    await register(reg, "a1", [A], ready=True)
    view = RegistryView(reg, refresh_s=0.05, max_staleness_s=60.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(view.run)
        await view.candidates(A)
        # An agent registered while the events of it were lost.
        await register(reg, "a2", [A], ready=True)
        await r.delete(reg.keys.events)
        await register(reg, "a3", [A], ready=True)

        async def all_three() -> bool:
            return ids((await view.candidates(A))[0]) == ["a1", "a2", "a3"]

        await wait_until(all_three, what="the check to re-read the capability")
        tg.cancel_scope.cancel()


async def test_load_figures_are_re_read_only_for_capabilities_in_use(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    _, inst, version = await register(reg, "a1", [A], ready=True)
    view = RegistryView(reg, refresh_s=0.01, busy_s=30.0)
    await view.candidates(A)
    v0 = view.version
    await reg.heartbeat("a1", instance_id=inst, version=version, queue_depth=7, inflight=2)
    view._caps[A].used_at -= 60.0  # not asked for in a minute: its figures are left
    view._caps[A].loaded_at -= 1.0
    await view._refresh_figures()
    assert view._agents["a1"].queue_depth == 0
    view._caps[A].used_at = time.monotonic()  # in use: re-read
    await view._refresh_figures()
    assert view._agents["a1"].queue_depth == 7 and view._agents["a1"].inflight == 2
    assert view.version == v0  # load figures do not change the routing version


async def test_a_capability_not_asked_for_is_dropped(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    await register(reg, "a1", [A], ready=True)
    await register(reg, "b1", [B], ready=True)
    gone: list[str] = []
    view = RegistryView(reg, refresh_s=60.0, unload_s=600.0, on_gone=gone.append)
    await view.candidates(A)
    await view.candidates(B)
    view._caps[B].used_at -= 601.0
    await view._refresh_figures()
    assert view.capabilities == [A] and view.agent_ids == ["a1"] and gone == ["b1"]
    assert ids((await view.candidates(B))[0]) == ["b1"]  # asking again loads it


async def test_a_client_that_never_routes_never_reads_the_registry(
    fresh_redis: RedisServer, ns: str
) -> None:
    r = await connect(fresh_redis.url)
    try:
        reg = Registry(r, ns)
        for i in range(50):
            await register(reg, f"a{i}", [A], ready=True)

        async def registry_reads() -> int:
            stats = await r.info("commandstats")
            names = ("smembers", "hgetall", "xread", "xinfo|stream", "zrange", "xrevrange")
            return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in names)

        async with Client(redis_url=fresh_redis.url, namespace=ns) as c:
            before = await registry_reads()
            await anyio.sleep(1.5)  # a window in which an eager view would have read
            assert await registry_reads() == before
            assert not c.view._running and c.view.capabilities == []
            assert len(await c.eligible(A)) == 50  # the first routing loads and starts it
            await wait_until(lambda: _true(c.view._running), what="the view's tasks")
            await register(reg, "late", [A], ready=True)

            async def late() -> bool:
                return "late" in ids(await c.eligible(A))

            await wait_until(late, what="a registration through the started tail")
    finally:
        await r.aclose()


async def _true(value: bool) -> bool:
    return value

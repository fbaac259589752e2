"""The console's feed of registry events: an event that lands right after the console
started, before its first read of the stream, is shown (docs/web.md, ``/events``)."""

from __future__ import annotations

import anyio
import pytest

from reach.connection import AnyRedis
from reach.registry import Registry
from reach.web.live import Monitor
from tests.support.registry_helpers import register

pytestmark = pytest.mark.anyio


async def test_an_agent_registering_as_the_console_starts_is_in_its_feed(
    r: AnyRedis, ns: str
) -> None:
    monitor = Monitor(r, ns, interval_s=0.1)
    await monitor.prime()  # the namespace has no event yet
    # Between the start and the feed's first read: a read from "$" would never see it.
    await register(Registry(r, ns), "late-1", ["late.cap"])
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        with anyio.fail_after(10):
            while not any(e.agent_id == "late-1" for e in monitor.events):
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    assert next(e.type for e in monitor.events if e.agent_id == "late-1") == "registered"


async def test_reach_events_follow_starts_from_the_newest_event(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    assert await reg.events_position() == "0-0"
    await register(reg, "a-1", ["a.cap"])
    pos = await reg.events_position()
    assert pos == (await reg.recent_events(1))[-1].id
    await register(reg, "b-1", ["b.cap"])
    new = await reg.tail_events(last_id=pos, block_ms=100)
    assert [e.agent_id for e in new] == ["b-1"]

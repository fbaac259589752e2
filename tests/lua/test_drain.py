"""drain.lua through Registry.drain: codes 1 (now draining), 2 (already), 0 (UnknownAgent)."""

from __future__ import annotations

import pytest

import reach
from reach.connection import AnyRedis
from reach.registry import Registry
from tests.registry_helpers import LONG_EVICT_MS, register, wait_until

pytestmark = pytest.mark.anyio


async def test_drain_sets_flag_and_event(reg: Registry, r: AnyRedis) -> None:
    _, inst, version = await register(reg, "a1", ["c"], ready=True)
    assert await reg.drain("a1") == 1
    a = await reg.get("a1")
    assert a is not None and a.draining and a.ready and a.state == "active"
    assert not a.routable
    assert int(await r.hget(reg.keys.agent("a1"), "draining_ms")) >= a.registered_ms
    # still listed (in-flight work finishes), and still in its capability set
    assert await reg.agent_ids("c") == ["a1"]
    assert [x.draining for x in await reg.agents("c")] == [True]
    events = [(e.type, e.agent_id, e.instance_id) for e in await reg.events()]
    assert events[-1] == ("draining", "a1", inst)
    # the agent hears about it on its next heartbeat
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (1, True)


async def test_drain_twice_returns_2(reg: Registry) -> None:
    await register(reg, "a1")
    assert await reg.drain("a1") == 1
    assert await reg.drain("a1") == 2
    assert [e.type for e in await reg.events()] == ["registered", "draining"]


async def test_unknown_agent_raises(reg: Registry, r: AnyRedis) -> None:
    with pytest.raises(reach.UnknownAgent, match="ghost"):
        await reg.drain("ghost")
    assert await r.exists(reg.keys.agent("ghost")) == 0


async def test_probation_agent_can_be_drained(reg: Registry) -> None:
    await register(reg, "a1", lease_ms=1, evict_after_ms=LONG_EVICT_MS)

    async def probation() -> bool:
        return (await reg.sweep()).probation == 1

    await wait_until(probation, what="probation")
    assert await reg.drain("a1") == 1


async def test_evicted_agent_raises(reg: Registry) -> None:
    await register(reg, "a1", lease_ms=1, evict_after_ms=1)

    async def evicted() -> bool:
        return "a1" in (await reg.sweep(shadow_ttl_ms=60_000)).evicted

    await wait_until(evicted, what="eviction")
    with pytest.raises(reach.UnknownAgent):
        await reg.drain("a1")
    a = await reg.get("a1")
    assert a is not None and not a.draining


async def test_reregister_clears_draining(reg: Registry) -> None:
    await register(reg, "a1")
    await reg.drain("a1")
    await register(reg, "a1")
    a = await reg.get("a1")
    assert a is not None and not a.draining

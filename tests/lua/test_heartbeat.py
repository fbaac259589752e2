"""heartbeat.lua through Registry.heartbeat: codes 1 (renewed), 2 (recovered), 0, -1."""

from __future__ import annotations

import pytest

from reach.connection import AnyRedis
from reach.registry import Registry
from tests.registry_helpers import (
    LONG_EVICT_MS,
    assert_consistent,
    new_version,
    register,
    wait_until,
)

pytestmark = pytest.mark.anyio


async def _state(reg: Registry, agent_id: str) -> str | None:
    a = await reg.get(agent_id)
    return a.state if a else None


async def test_unknown_agent_returns_0(reg: Registry, r: AnyRedis) -> None:
    assert await reg.heartbeat("ghost", instance_id="i", version=new_version()) == (0, False)
    assert await r.exists(reg.keys.agent("ghost"), reg.keys.agents) == 0  # nothing created


async def test_renew_moves_deadline_and_stores_load(reg: Registry, r: AnyRedis) -> None:
    _, inst, version = await register(reg, "a1", ["c"], lease_ms=5000)
    before = await reg.get("a1")
    assert before is not None

    async def later_ms() -> bool:  # the server clock must tick for the deadline to move
        t = await r.time()
        return t[0] * 1000 + t[1] // 1000 > before.last_heartbeat_ms

    await wait_until(later_ms, interval_s=0.001)
    code, draining = await reg.heartbeat(
        "a1", instance_id=inst, version=version, queue_depth=7, inflight=3
    )
    assert (code, draining) == (1, False)
    a = await reg.get("a1")
    assert a is not None
    assert a.last_heartbeat_ms > before.last_heartbeat_ms
    assert (a.queue_depth, a.inflight, a.state) == (7, 3, "active")
    assert await r.zscore(reg.keys.agents, "a1") == a.last_heartbeat_ms + 5000
    # an ordinary heartbeat writes no event
    assert [e.type for e in await reg.events()] == ["registered"]


async def test_draining_flag_is_reported(reg: Registry) -> None:
    _, inst, version = await register(reg, "a1")
    assert await reg.drain("a1") == 1
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (1, True)


async def test_heartbeat_in_probation_recovers_with_code_2(reg: Registry, r: AnyRedis) -> None:
    # lease of 1 ms, eviction far away: probation is reached without racing the clock
    _, inst, version = await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=LONG_EVICT_MS)

    async def in_probation() -> bool:
        await reg.sweep()
        return await _state(reg, "a1") == "probation"

    await wait_until(in_probation, what="probation")
    assert await reg.agent_ids("c") == ["a1"]  # probation keeps the capability sets

    code, draining = await reg.heartbeat("a1", instance_id=inst, version=version)
    assert (code, draining) == (2, False)
    a = await reg.get("a1")
    assert a is not None and a.state == "active"
    assert a.state_ms == a.last_heartbeat_ms
    assert await r.zscore(reg.keys.agents, "a1") == a.last_heartbeat_ms + 1
    events = [(e.type, e.agent_id, e.instance_id) for e in await reg.events()]
    assert events == [
        ("registered", "a1", inst),
        ("unstable", "a1", inst),
        ("recovered", "a1", inst),
    ]
    await assert_consistent(reg)


async def test_stale_process_gets_minus_1(reg: Registry) -> None:
    old = new_version()
    _, new_inst, new = await register(reg, "a1")
    # the older process (smaller version) learns it was replaced
    assert await reg.heartbeat("a1", instance_id="old-inst", version=old) == (-1, False)
    a = await reg.get("a1")
    assert a is not None and (a.instance_id, a.version) == (new_inst, new)
    # the current one is fine
    assert await reg.heartbeat("a1", instance_id=new_inst, version=new) == (1, False)


async def test_newer_process_than_stored_gets_0(reg: Registry) -> None:
    """A process whose registration is not the stored one (older stored) must register."""
    _, _, stored = await register(reg, "a1")
    assert await reg.heartbeat("a1", instance_id="x", version=stored + 1) == (0, False)


async def test_heartbeat_after_eviction_returns_0_then_register_works(
    reg: Registry, r: AnyRedis
) -> None:
    _, inst, version = await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=1)

    async def evicted() -> bool:
        return "a1" in (await reg.sweep(shadow_ttl_ms=LONG_EVICT_MS)).evicted

    await wait_until(evicted, what="eviction")
    shadow = await reg.get("a1")
    assert shadow is not None and shadow.state == "evicted"
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (0, False)
    # the heartbeat did not bring the shadow back to life
    shadow2 = await reg.get("a1")
    assert shadow2 is not None and shadow2.state == "evicted"
    assert shadow2.last_heartbeat_ms == shadow.last_heartbeat_ms
    assert await reg.agent_ids("c") == []

    # re-register with the same version (same process) works
    code, _, _ = await register(
        reg, "a1", ["c"], instance_id=inst, version=version, lease_ms=60_000
    )
    assert code == 2
    assert await reg.agent_ids("c") == ["a1"]
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (1, False)
    await assert_consistent(reg)


async def test_heartbeat_after_shadow_deleted_returns_0(reg: Registry) -> None:
    _, inst, version = await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=1)

    async def gone() -> bool:
        await reg.sweep(shadow_ttl_ms=1)
        return await reg.get("a1") is None and await reg.agent_ids() == []

    await wait_until(gone, what="shadow deletion")
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (0, False)
    assert await reg.get("a1") is None

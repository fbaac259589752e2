"""drain.lua through Registry.drain: codes 1 (now draining), 2 (already), 0 (UnknownAgent),
-1 (another instance owns the registration)."""

from __future__ import annotations

import pytest
import redis

import reach
from reach import scripts
from reach.connection import AnyRedis
from reach.registry import Registry
from tests.support.registry_helpers import LONG_EVICT_MS, register, wait_until

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


# -- a drain that names its instance (issue 9, item 3) and arguments (item 10) ------------


async def test_stale_instance_cannot_drain_the_newer_one(reg: Registry, r: AnyRedis) -> None:
    """The older process of a restart with overlap is fenced as stale; its shutdown drain
    must leave the newer registration alone."""
    _, old_inst, _ = await register(reg, "a1", ["c"], ready=True)
    _, new_inst, _ = await register(reg, "a1", ["c"], ready=True)
    assert await reg.drain("a1", instance_id=old_inst) == -1
    a = await reg.get("a1")
    assert a is not None and a.instance_id == new_inst and not a.draining and a.routable
    assert await r.hget(reg.keys.agent("a1"), "draining_ms") is None
    assert [e.type for e in await reg.events()] == ["registered", "replaced", "registered"]
    # the newer process may drain itself, and an operator's drain takes whatever is live
    assert await reg.drain("a1", instance_id=new_inst) == 1
    assert await reg.drain("a1") == 2


async def test_stale_instance_gets_minus_1_even_when_already_draining(reg: Registry) -> None:
    await register(reg, "a1")
    await reg.drain("a1")
    assert await reg.drain("a1", instance_id="not-me") == -1


async def test_two_argument_call_still_drains_whatever_is_live(reg: Registry, r: AnyRedis) -> None:
    """ARGV[3] is optional: callers of the two-argument form keep working."""
    await register(reg, "a1")
    k = reg.keys
    assert await scripts.call(r, "drain", [k.agent("a1"), k.events], ["a1", 100]) == 1


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["", 100], "agent_id"),
        (["a{1}", 100], "agent_id"),
        (["a1", "abc"], "events maxlen"),
        (["a1", "0"], "events maxlen"),
        (["a1", "007"], "events maxlen"),
        (["a1", "nan"], "events maxlen"),
        (["a1", 100, "i" * 257], "instance_id"),
        (["a1"], "arguments"),
        (["a1", 100, "i", "x"], "arguments"),
    ],
)
async def test_bad_arguments_are_refused(
    reg: Registry, r: AnyRedis, args: list[object], name: str
) -> None:
    await register(reg, "a1")
    k = reg.keys
    with pytest.raises(redis.ResponseError, match=f"^reach: bad {name}"):
        await scripts.call(r, "drain", [k.agent("a1"), k.events], args)
    a = await reg.get("a1")
    assert a is not None and not a.draining


async def test_record_of_another_id_is_not_drained(reg: Registry, r: AnyRedis) -> None:
    await register(reg, "a1")
    k = reg.keys
    assert await scripts.call(r, "drain", [k.agent("a1"), k.events], ["b2", 100]) == 0
    a = await reg.get("a1")
    assert a is not None and not a.draining

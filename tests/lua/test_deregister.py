"""deregister.lua through Registry.deregister: codes 1 (removed), 0 (no such agent), -1."""

from __future__ import annotations

import pytest
import redis

from reach import scripts
from reach.connection import AnyRedis
from reach.registry import Registry
from tests.support.registry_helpers import assert_consistent, register, wait_until

pytestmark = pytest.mark.anyio


async def test_deregister_removes_everything_and_returns_1(reg: Registry, r: AnyRedis) -> None:
    _, inst, version = await register(reg, "a1", ["a", "b"])
    await register(reg, "a2", ["b"])
    assert await reg.deregister("a1", instance_id=inst) == 1

    assert await reg.get("a1") is None
    assert await r.zscore(reg.keys.agents, "a1") is None
    assert await reg.agent_ids("a") == []
    assert await reg.agent_ids("b") == ["a2"]
    assert await reg.capabilities() == [("b", 1)]
    assert await r.exists(reg.keys.cap("a")) == 0
    events = [(e.type, e.agent_id, e.instance_id) for e in await reg.events()]
    assert events[-1] == ("deregistered", "a1", inst)
    # listed for the sweeper, with the time it left (Redis's clock): what a caller with a
    # stale view sends it afterwards is moved on
    assert await r.smembers(reg.keys.reroute) == {b"a1"}
    left = await r.zscore(reg.keys.left_of(0), "a1")
    now = await r.time()
    assert left is not None and abs(now[0] * 1000 + now[1] // 1000 - left) < 5000
    # the removed process learns it is no longer registered
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (0, False)
    await assert_consistent(reg)


async def test_last_agent_leaves_empty_registry(reg: Registry, r: AnyRedis) -> None:
    await register(reg, "a1", ["a", "b"])
    assert await reg.deregister("a1") == 1
    assert await reg.capabilities() == []
    assert await reg.agent_ids() == []
    assert await r.exists(reg.keys.agents, reg.keys.caps, reg.keys.cap("a")) == 0


async def test_unknown_agent_returns_0(reg: Registry) -> None:
    assert await reg.deregister("ghost") == 0
    assert await reg.deregister("ghost", instance_id="i") == 0
    assert await reg.events() == []


async def test_other_instance_is_refused_with_minus_1(reg: Registry, r: AnyRedis) -> None:
    _, inst, _ = await register(reg, "a1", ["a"])
    assert await reg.deregister("a1", instance_id="someone-else") == -1
    assert await r.exists(reg.keys.reroute, reg.keys.left_of(0)) == 0
    a = await reg.get("a1")
    assert a is not None and a.instance_id == inst
    assert await reg.agent_ids("a") == ["a1"]
    assert "deregistered" not in [e.type for e in await reg.events()]


async def test_empty_instance_removes_whatever_is_registered(reg: Registry) -> None:
    await register(reg, "a1", ["a"])
    assert await reg.deregister("a1", instance_id="") == 1
    assert await reg.get("a1") is None


async def test_deregister_an_evicted_shadow(reg: Registry, r: AnyRedis) -> None:
    _, inst, _ = await register(reg, "a1", ["a"], lease_ms=1, evict_after_ms=1)
    await register(reg, "a2", ["a"])

    async def evicted() -> bool:
        return "a1" in (await reg.sweep(shadow_ttl_ms=60_000)).evicted

    await wait_until(evicted, what="eviction")
    assert await reg.deregister("a1", instance_id=inst) == 1
    assert await reg.get("a1") is None
    assert await r.zscore(reg.keys.agents, "a1") is None
    assert await reg.capabilities() == [("a", 1)]
    await assert_consistent(reg)


async def test_expired_shadow_returns_0_and_clears_the_deadline(reg: Registry, r: AnyRedis) -> None:
    """A shadow whose TTL ran out leaves only its zset entry: deregister drops it."""
    await register(reg, "a1", ["a"], lease_ms=1, evict_after_ms=1)

    async def evicted() -> bool:
        return "a1" in (await reg.sweep(shadow_ttl_ms=1)).evicted

    await wait_until(evicted, what="eviction")

    async def hash_expired() -> bool:
        return await r.exists(reg.keys.agent("a1")) == 0

    await wait_until(hash_expired, what="shadow expiry")
    assert await r.zscore(reg.keys.agents, "a1") is not None
    assert await reg.deregister("a1") == 0
    assert await r.zscore(reg.keys.agents, "a1") is None


# -- arguments and stored records out of contract (issue 9, item 10) ---------------------


def _keys(reg: Registry, agent_id: str) -> list[str]:
    k = reg.keys
    return [
        k.agents,
        k.agent(agent_id),
        k.caps,
        k.events,
        k.cap_prefix,
        k.agent_prefix,
        k.reroute,
        k.left_of(0),
    ]


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["", "", 100], "agent_id"),
        (["a{1}", "", 100], "agent_id"),
        (["a1", "i" * 257, 100], "instance_id"),
        (["a1", "", "abc"], "events maxlen"),
        (["a1", "", "0"], "events maxlen"),
        (["a1", "", "007"], "events maxlen"),
        (["a1", ""], "arguments"),
        (["a1", "", 100, "x"], "arguments"),
        (["b2", "", 100], "agent_id"),
    ],
)
async def test_bad_arguments_are_refused_and_nothing_moves(
    reg: Registry, r: AnyRedis, args: list[object], name: str
) -> None:
    await register(reg, "a1", ["a"])
    await register(reg, "b2", ["a"])
    with pytest.raises(redis.ResponseError, match=f"^reach: bad {name}"):
        await scripts.call(r, "deregister", _keys(reg, "a1"), args)
    assert await reg.agent_ids() == ["a1", "b2"]
    assert await reg.agent_ids("a") == ["a1", "b2"]
    await assert_consistent(reg)


async def test_missing_hash_of_another_id_keeps_that_ids_deadline(
    reg: Registry, r: AnyRedis
) -> None:
    """KEYS[2] must be ARGV[1]'s hash: a call naming one agent's key and another's id would
    drop a live agent's deadline, leaving a record no sweep ever sees."""
    await register(reg, "b2", ["a"])
    with pytest.raises(redis.ResponseError, match="^reach: bad agent_id"):
        await scripts.call(r, "deregister", _keys(reg, "ghost"), ["b2", "", 100])
    assert await r.zscore(reg.keys.agents, "b2") is not None
    await assert_consistent(reg)


async def test_record_naming_another_id_is_kept(reg: Registry, r: AnyRedis) -> None:
    await register(reg, "a1", ["a"])
    await r.hset(reg.keys.agent("a1"), "agent_id", "someone-else")
    assert await reg.deregister("a1") == -1
    assert await r.exists(reg.keys.agent("a1")) == 1

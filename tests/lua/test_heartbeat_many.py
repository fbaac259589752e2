"""heartbeat_many.lua through Registry.heartbeat_many: the agents of one process renewed in
one call, each answered exactly as heartbeat.lua answers it alone (issue 12, item 3)."""

from __future__ import annotations

import pytest
import redis

from reach import scripts
from reach.connection import AnyRedis
from reach.errors import ConfigError
from reach.registry import Registry
from reach.scripts.agents import MAX_BEATS, Beat
from tests.support.registry_helpers import (
    LONG_EVICT_MS,
    assert_consistent,
    new_version,
    register,
    wait_until,
)

pytestmark = pytest.mark.anyio


async def test_every_code_in_one_call(reg: Registry, r: AnyRedis) -> None:
    """Renewed, recovered, not registered (unknown, evicted), stale, draining: in order."""
    _, i1, v1 = await register(reg, "ok", ["c"], lease_ms=5000)
    _, i2, v2 = await register(reg, "probe", ["c"], lease_ms=1, evict_after_ms=LONG_EVICT_MS)
    _, i3, v3 = await register(reg, "gone", ["c"], lease_ms=1, evict_after_ms=1)
    old = new_version()
    _, i4, v4 = await register(reg, "replaced", ["c"])
    _, i5, v5 = await register(reg, "drained", ["c"])
    assert await reg.drain("drained") == 1

    async def swept() -> bool:
        await reg.sweep(shadow_ttl_ms=LONG_EVICT_MS)
        a, b = await reg.get("probe"), await reg.get("gone")
        return bool(a and a.state == "probation" and b and b.state == "evicted")

    await wait_until(swept, what="probation and eviction")
    beats = [
        Beat("ok", i1, v1, queue_depth=7, inflight=3),
        Beat("probe", i2, v2),
        Beat("gone", i3, v3),
        Beat("ghost", "x", new_version()),
        Beat("replaced", "old-inst", old),
        Beat("drained", i5, v5),
        Beat("replaced", i4, v4),
    ]
    assert await reg.heartbeat_many(beats) == [
        (1, False),
        (2, False),
        (0, False),
        (0, False),
        (-1, False),
        (1, True),
        (1, False),
    ]
    ok = await reg.get("ok")
    assert ok is not None and (ok.queue_depth, ok.inflight, ok.state) == (7, 3, "active")
    assert await r.zscore(reg.keys.agents, "ok") == ok.last_heartbeat_ms + 5000
    probe = await reg.get("probe")
    assert probe is not None and probe.state == "active"
    gone = await reg.get("gone")
    assert gone is not None and gone.state == "evicted"  # not brought back
    assert await reg.get("ghost") is None and await r.exists(reg.keys.agent("ghost")) == 0
    assert [e.type for e in await reg.events() if e.agent_id == "probe"][-1] == "recovered"
    await assert_consistent(reg)


async def test_same_answers_as_one_heartbeat_each(reg: Registry) -> None:
    ids = [f"a{i}" for i in range(20)]
    regs = [await register(reg, a, ["c"]) for a in ids]
    beats = [Beat(a, inst, v) for a, (_, inst, v) in zip(ids, regs, strict=True)]
    many = await reg.heartbeat_many(beats)
    one = [
        await reg.heartbeat(b.agent_id, instance_id=b.instance_id, version=b.version) for b in beats
    ]
    assert many == one == [(1, False)] * 20


async def test_a_bad_agent_refuses_the_whole_call(reg: Registry, r: AnyRedis) -> None:
    _, inst, version = await register(reg, "a1", ["c"])
    before = await r.hgetall(reg.keys.agent("a1"))
    call = reg.heartbeat_many_call([Beat("a1", inst, version), Beat("a2", "i", version)])
    args = list(call.args)
    args[1 + 7 + 3] = "nan"  # the second agent's queue depth
    with pytest.raises(redis.ResponseError, match=r"^reach: bad agent 2: queue_depth"):
        await scripts.call(r, "heartbeat_many", call.keys, args)
    assert await r.hgetall(reg.keys.agent("a1")) == before  # the first was not renewed


async def test_a_key_of_another_type_refuses_the_whole_call(reg: Registry, r: AnyRedis) -> None:
    _, inst, version = await register(reg, "a1", ["c"])
    await r.set(reg.keys.agent("a2"), "not a hash")
    before = await r.hgetall(reg.keys.agent("a1"))
    with pytest.raises(ConfigError, match=r"bad KEYS\[4\]: holds a string, want a hash"):
        await reg.heartbeat_many([Beat("a1", inst, version), Beat("a2", "i", version)])
    assert await r.hgetall(reg.keys.agent("a1")) == before


@pytest.mark.parametrize("shape", ["argv-1", "argv+2", "keys-1", "none"])
async def test_wrong_shape_is_refused(reg: Registry, r: AnyRedis, shape: str) -> None:
    _, inst, version = await register(reg, "a1", ["c"])
    call = reg.heartbeat_many_call([Beat("a1", inst, version)])
    keys, args = list(call.keys), list(call.args)
    if shape == "argv-1":
        args = args[:-1]
    elif shape == "argv+2":  # one more is the optional cap_us
        args = [*args, "x", "y"]
    elif shape == "keys-1":
        keys = keys[:-1]
    else:
        keys, args = keys[:2], args[:1]
    with pytest.raises(redis.ResponseError, match="^reach: bad arguments"):
        await scripts.call(r, "heartbeat_many", keys, args)


async def test_the_number_of_agents_is_bounded(reg: Registry) -> None:
    with pytest.raises(ConfigError, match="1..1000 agents"):
        reg.heartbeat_many_call([])
    with pytest.raises(ConfigError, match="1..1000 agents"):
        reg.heartbeat_many_call([Beat(f"a{i}", "i", 1) for i in range(MAX_BEATS + 1)])
    assert (
        len(reg.heartbeat_many_call([Beat(f"a{i}", "i", 1) for i in range(MAX_BEATS)]).keys) == 1002
    )


async def test_load_figures_are_clamped(reg: Registry) -> None:
    _, inst, version = await register(reg, "a1")
    assert await reg.heartbeat_many([Beat("a1", inst, version, -5, 2**70)]) == [(1, False)]
    a = await reg.get("a1")
    assert a is not None and (a.queue_depth, a.inflight) == (0, 2**53 - 1)


async def test_cap_us_per_agent_when_every_beat_has_eight_arguments(
    reg: Registry, r: AnyRedis
) -> None:
    _, i1, v1 = await register(reg, "a1", ["c"])
    _, i2, v2 = await register(reg, "a2", ["c"])
    beats = [Beat("a1", i1, v1, cap_us="c=10"), Beat("a2", i2, v2)]  # a2: '' (deleted)
    await r.hset(reg.keys.agent("a2"), "cap_us", "c=99")
    assert [h.code for h in await reg._run(reg.heartbeat_many_call(beats))] == [1, 1]
    assert await r.hget(reg.keys.agent("a1"), "cap_us") == b"c=10"
    assert await r.hget(reg.keys.agent("a2"), "cap_us") is None
    call = reg.heartbeat_many_call([Beat("a1", i1, v1, cap_us="c=10"), Beat("a2", i2, v2)])
    args = list(call.args)
    args[-1] = "bad item"
    before = await r.hgetall(reg.keys.agent("a1"))
    with pytest.raises(redis.ResponseError, match="^reach: bad agent 2: cap_us"):
        await scripts.call(r, "heartbeat_many", list(call.keys), args)
    assert await r.hgetall(reg.keys.agent("a1")) == before

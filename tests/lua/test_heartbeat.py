"""heartbeat.lua through Registry.heartbeat: codes 1 (renewed), 2 (recovered), 0, -1."""

from __future__ import annotations

import pytest
import redis

from reach import scripts
from reach.connection import AnyRedis
from reach.registry import Registry
from tests.support.registry_helpers import (
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


# -- arguments and stored records out of contract (issue 9, items 3 and 10) ---------------


@pytest.mark.parametrize(
    ("index", "name", "value"),
    [(3, "queue_depth", v) for v in ["abc", "", "nan", "inf", "-1", "1e309", "1.5", "9" * 17]]
    + [(4, "inflight", v) for v in ["abc", "", "nan", "-inf", "-1", "1e3"]]
    + [(2, "version", v) for v in ["abc", "", "nan", "1e309", "-1"]]
    + [(0, "agent_id", v) for v in ["", "a{b}", "x" * 257]]
    + [(1, "instance_id", v) for v in ["", "i" * 257]]
    + [(5, "slots", v) for v in ["abc", "", "-1", "1.5"]]
    + [(6, "handler_us", v) for v in ["abc", "", "-1", "nan"]]
    + [(7, "events maxlen", v) for v in ["0", "abc", "", "007"]],
)
async def test_bad_argument_is_refused_and_the_record_is_untouched(
    reg: Registry, r: AnyRedis, index: int, name: str, value: str
) -> None:
    _, inst, version = await register(reg, "a1", ["c"])
    before = await r.hgetall(reg.keys.agent("a1"))
    c = reg.heartbeat_call("a1", instance_id=inst, version=version, queue_depth=1, inflight=1)
    keys, args = list(c.keys), list(c.args)
    args[index] = value
    with pytest.raises(redis.ResponseError, match=f"^reach: bad {name}"):
        await scripts.call(r, "heartbeat", keys, args)
    assert await r.hgetall(reg.keys.agent("a1")) == before
    assert await reg.get("a1") is not None


@pytest.mark.parametrize("shape", ["argv-1", "argv+2", "keys-1"])
async def test_wrong_shape_is_refused(reg: Registry, r: AnyRedis, shape: str) -> None:
    _, inst, version = await register(reg, "a1", ["c"])
    c = reg.heartbeat_call("a1", instance_id=inst, version=version, queue_depth=1, inflight=1)
    keys, args = list(c.keys), list(c.args)
    if shape == "argv-1":
        args = args[:-1]
    elif shape == "argv+2":  # one more is the optional cap_us
        args = [*args, "x", "y"]
    else:
        keys = keys[:-1]
    with pytest.raises(redis.ResponseError, match="^reach: bad arguments"):
        await scripts.call(r, "heartbeat", keys, args)


async def test_load_figures_are_clamped_not_refused(reg: Registry) -> None:
    """A heartbeat must never fail over a counter: out-of-range load figures are clamped."""
    _, inst, version = await register(reg, "a1")
    assert await reg.heartbeat(
        "a1", instance_id=inst, version=version, queue_depth=-5, inflight=2**70
    ) == (1, False)
    a = await reg.get("a1")
    assert a is not None and (a.queue_depth, a.inflight) == (0, 2**53 - 1)


async def test_same_version_of_another_instance_is_stale(reg: Registry, r: AnyRedis) -> None:
    """Two starts with the same stamp: the later registration replaced the earlier, whose
    heartbeats must not renew the newer one's lease (it is stale)."""
    version = new_version()
    _, first, _ = await register(reg, "a1", instance_id="first", version=version)
    await register(reg, "a1", instance_id="second", version=version)
    before = await r.zscore(reg.keys.agents, "a1")
    assert await reg.heartbeat("a1", instance_id=first, version=version) == (-1, False)
    a = await reg.get("a1")
    assert a is not None and a.instance_id == "second"
    assert await r.zscore(reg.keys.agents, "a1") == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lease_ms", "abc"),
        ("lease_ms", ""),
        ("lease_ms", "nan"),
        ("lease_ms", "1e400"),
        ("version", "abc"),
        ("agent_id", "someone-else"),
        ("state", "weird"),
    ],
)
async def test_unreadable_stored_record_asks_to_register_again(
    reg: Registry, r: AnyRedis, field: str, value: str
) -> None:
    """A record written behind the scripts' back: the heartbeat writes nothing and answers
    0 (register again), and registering again heals it."""
    _, inst, version = await register(reg, "a1", ["c"])
    await r.hset(reg.keys.agent("a1"), field, value)
    before = await r.hgetall(reg.keys.agent("a1"))
    zscore = await r.zscore(reg.keys.agents, "a1")
    assert await reg.heartbeat("a1", instance_id=inst, version=version, queue_depth=3) == (0, False)
    assert await r.hgetall(reg.keys.agent("a1")) == before
    assert await r.zscore(reg.keys.agents, "a1") == zscore
    code, _, _ = await register(reg, "a1", ["c"], instance_id=inst, version=version)
    assert code == 2
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (1, False)
    await assert_consistent(reg)


# -- per-capability run times (cap_us, the optional ARGV[9]) ------------------------------


async def test_cap_us_is_stored_kept_when_absent_and_deleted_when_empty(
    reg: Registry, r: AnyRedis
) -> None:
    _, inst, version = await register(reg, "a1", ["c", "d"])
    hb = {"instance_id": inst, "version": version, "handler_us": 7}
    assert (await reg.heartbeat("a1", cap_us="c=100 d.e=2500", **hb))[0] == 1
    assert await r.hget(reg.keys.agent("a1"), "cap_us") == b"c=100 d.e=2500"
    a = await reg.get("a1")
    assert a is not None and a.cap_us == {"c": 100, "d.e": 2500}
    assert (a.mean_us("c"), a.mean_us("d.e"), a.mean_us("other")) == (100, 2500, 7)
    await reg.heartbeat("a1", **hb)  # an older runtime's heartbeat: the field stays
    assert await r.hget(reg.keys.agent("a1"), "cap_us") == b"c=100 d.e=2500"
    await reg.heartbeat("a1", cap_us="", **hb)
    assert await r.hget(reg.keys.agent("a1"), "cap_us") is None


@pytest.mark.parametrize(
    "value",
    ["c", "c=", "=5", "C=5", "c=-1", "c=1.5", "c=5  d=6", " c=5", "c=5 ", "c{x}=1", "c=1e3",
     "c=" + "9" * 17, "x" * 201 + "=1", ("c=1 " * 17000).strip()],
)  # fmt: skip
async def test_a_bad_cap_us_is_refused_and_the_record_is_untouched(
    reg: Registry, r: AnyRedis, value: str
) -> None:
    _, inst, version = await register(reg, "a1", ["c"])
    before = await r.hgetall(reg.keys.agent("a1"))
    c = reg.heartbeat_call("a1", instance_id=inst, version=version, queue_depth=1, inflight=1)
    with pytest.raises(redis.ResponseError, match="^reach: bad cap_us"):
        await scripts.call(r, "heartbeat", list(c.keys), [*c.args, value])
    assert await r.hgetall(reg.keys.agent("a1")) == before

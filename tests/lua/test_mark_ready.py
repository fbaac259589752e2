"""mark_ready.lua through Registry.mark_ready: codes 1 (set), 0 (not registered), -1."""

from __future__ import annotations

import pytest
import redis

from reach import scripts
from reach.connection import AnyRedis
from reach.registry import Registry
from tests.support.registry_helpers import register, wait_until

pytestmark = pytest.mark.anyio


async def test_ready_then_unready(reg: Registry, r: AnyRedis) -> None:
    _, inst, _ = await register(reg, "a1", ["c"])
    a = await reg.get("a1")
    assert a is not None and not a.ready and not a.routable

    assert await reg.mark_ready("a1", instance_id=inst) == 1
    a = await reg.get("a1")
    assert a is not None and a.ready and a.routable and a.ready_ms >= a.registered_ms
    assert [x.agent_id for x in await reg.agents("c", ready=True)] == ["a1"]

    assert await reg.mark_ready("a1", instance_id=inst, ready=False) == 1
    a = await reg.get("a1")
    assert a is not None and not a.ready and a.ready_ms == 0
    assert await reg.agents("c", ready=True) == []

    events = [(e.type, e.instance_id) for e in await reg.events()]
    assert events == [("registered", inst), ("ready", inst), ("unready", inst)]


async def test_setting_the_same_value_again_is_a_quiet_1(reg: Registry) -> None:
    _, inst, _ = await register(reg, "a1")
    assert await reg.mark_ready("a1", instance_id=inst) == 1
    before = await reg.get("a1")
    assert await reg.mark_ready("a1", instance_id=inst) == 1
    assert await reg.mark_ready("a1", instance_id=inst, ready=False) == 1
    assert await reg.mark_ready("a1", instance_id=inst, ready=False) == 1
    assert [e.type for e in await reg.events()] == ["registered", "ready", "unready"]
    assert before is not None and before.ready


async def test_unknown_agent_returns_0(reg: Registry, r: AnyRedis) -> None:
    assert await reg.mark_ready("ghost", instance_id="i") == 0
    assert await r.exists(reg.keys.agent("ghost")) == 0


async def test_other_instance_gets_minus_1(reg: Registry) -> None:
    await register(reg, "a1")
    assert await reg.mark_ready("a1", instance_id="not-me") == -1
    a = await reg.get("a1")
    assert a is not None and not a.ready


async def test_evicted_agent_returns_0(reg: Registry) -> None:
    _, inst, _ = await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=1, ready=True)

    async def evicted() -> bool:
        return "a1" in (await reg.sweep(shadow_ttl_ms=60_000)).evicted

    await wait_until(evicted, what="eviction")
    assert await reg.mark_ready("a1", instance_id=inst) == 0
    a = await reg.get("a1")
    assert a is not None and a.state == "evicted" and not a.ready


# -- arguments out of contract (issue 9, item 10) ------------------------------------------


@pytest.mark.parametrize(
    ("index", "value", "name"),
    [
        (2, "2", "ready"),
        (2, "", "ready"),
        (2, "yes", "ready"),
        (2, "true", "ready"),
        (0, "", "agent_id"),
        (0, "a{b}", "agent_id"),
        (1, "", "instance_id"),
        (1, "i" * 257, "instance_id"),
        (3, "abc", "events maxlen"),
        (3, "0", "events maxlen"),
        (3, "007", "events maxlen"),
    ],
)
async def test_bad_argument_is_refused_and_the_record_is_untouched(
    reg: Registry, r: AnyRedis, index: int, value: str, name: str
) -> None:
    _, inst, _ = await register(reg, "a1")
    before = await r.hgetall(reg.keys.agent("a1"))
    args: list[object] = ["a1", inst, "1", 100]
    args[index] = value
    with pytest.raises(redis.ResponseError, match=f"^reach: bad {name}"):
        await scripts.call(r, "mark_ready", [reg.keys.agent("a1"), reg.keys.events], args)
    assert await r.hgetall(reg.keys.agent("a1")) == before
    assert await reg.get("a1") is not None


async def test_wrong_argument_count_is_refused(reg: Registry, r: AnyRedis) -> None:
    _, inst, _ = await register(reg, "a1")
    k = reg.keys
    for args in (["a1", inst, "1"], ["a1", inst, "1", 100, "x"]):
        with pytest.raises(redis.ResponseError, match="^reach: bad arguments"):
            await scripts.call(r, "mark_ready", [k.agent("a1"), k.events], args)


async def test_record_of_another_id_is_not_touched(reg: Registry, r: AnyRedis) -> None:
    _, inst, _ = await register(reg, "a1")
    k = reg.keys
    assert (
        await scripts.call(r, "mark_ready", [k.agent("a1"), k.events], ["b2", inst, "1", 100]) == 0
    )
    a = await reg.get("a1")
    assert a is not None and not a.ready

"""count_agents.lua through Registry.count_agents and reach.metrics.count_agents: exact
counts up to the sample size, a sample of that size above it, refusals, odd records."""

from __future__ import annotations

import pytest
import redis

from reach import metrics, scripts
from reach.connection import AnyRedis
from reach.registry import Registry
from tests.support.registry_helpers import LONG_EVICT_MS, register, wait_until

pytestmark = pytest.mark.anyio


async def _per_record(reg: Registry) -> tuple[dict[str, int], int]:
    """The counts as the records say, read one by one (what the gauges must equal)."""
    counts = {s: 0 for s in metrics.REGISTRY_STATES}
    routable = 0
    for a in await reg.agents():
        counts[a.state] += 1
        routable += a.routable
    return counts, routable


async def test_empty_namespace(reg: Registry) -> None:
    c = await reg.count_agents()
    assert (c.total, c.looked, c.active, c.probation, c.evicted, c.routable, c.other) == (
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    )
    assert c.exact
    assert c.scaled() == ({"active": 0, "probation": 0, "evicted": 0}, 0)


async def test_every_state_and_routing_counted_exactly(reg: Registry, r: AnyRedis) -> None:
    for i in range(3):
        await register(reg, f"ok{i}", ready=True)
    await register(reg, "starting")  # active, not ready
    _, inst, _ = await register(reg, "draining", ready=True)
    assert await reg.drain("draining", instance_id=inst) == 1
    await register(reg, "p1", lease_ms=1, evict_after_ms=LONG_EVICT_MS, ready=True)
    await register(reg, "e1", lease_ms=1, evict_after_ms=1, ready=True)

    async def due() -> bool:
        t = await r.time()
        now = t[0] * 1000 + t[1] // 1000
        return len(await r.zrangebyscore(reg.keys.agents, "-inf", now - 2)) == 2

    await wait_until(due, what="two leases running out")
    swept = await reg.sweep(shadow_ttl_ms=60_000)
    assert swept.probation == 1 and swept.evicted == ["e1"]

    c = await reg.count_agents()
    assert (c.total, c.looked, c.other) == (7, 7, 0)
    assert (c.active, c.probation, c.evicted, c.routable) == (5, 1, 1, 3)
    want = ({"active": 5, "probation": 1, "evicted": 1}, 3)
    assert c.scaled() == want == await _per_record(reg)
    assert await metrics.count_agents(r, reg.keys) == want


async def test_a_bigger_namespace_is_sampled_and_scaled(reg: Registry, r: AnyRedis) -> None:
    for i in range(40):
        await register(reg, f"a{i:02}", ready=True)
    for i in range(10):
        await register(reg, f"s{i:02}")  # not ready: active, not routable

    c = await reg.count_agents(sample=20)
    assert (c.total, c.looked) == (50, 20) and not c.exact
    assert c.active == 20  # every record looked at is active
    counts, routable = c.scaled()
    assert counts == {"active": 50, "probation": 0, "evicted": 0}
    assert routable == round(c.routable * 50 / 20)
    # the sample is of distinct agents: its routable share is that of 20 agents of 50
    assert 10 <= c.routable <= 20

    # the metrics' count reads every record up to its sample size: exact here
    assert await metrics.count_agents(r, reg.keys) == (counts, 40)
    assert await metrics.count_agents(r, reg.keys, sample=50) == (counts, 40)


async def test_the_sample_is_uniform_over_many_counts(reg: Registry) -> None:
    for i in range(30):
        await register(reg, f"a{i:02}", ready=(i < 15))
    seen = [(await reg.count_agents(sample=10)).routable for _ in range(60)]
    mean = sum(seen) / len(seen)
    # hypergeometric: mean 5, sd ~1.4 per draw, ~0.18 for the mean of 60
    assert 4.0 < mean < 6.0
    assert len(set(seen)) > 1  # a sample, not the same 10 agents every time


async def test_ids_without_a_readable_record_are_other(reg: Registry, r: AnyRedis) -> None:
    await register(reg, "a1", ready=True)
    await register(reg, "a2", ready=True)
    await r.delete(reg.keys.agent("a1"))  # behind the scripts' back: the id stays in the zset
    await register(reg, "a3", ready=True)
    await r.delete(reg.keys.agent("a3"))
    await r.set(reg.keys.agent("a3"), "not a hash")
    c = await reg.count_agents()
    assert (c.total, c.looked, c.active, c.routable, c.other) == (3, 3, 1, 1, 2)
    assert c.scaled() == ({"active": 1, "probation": 0, "evicted": 0}, 1)


@pytest.mark.parametrize("sample", ["0", "01", "100001", "-1", "1e3", "", "x"])
async def test_bad_sample_is_refused(reg: Registry, r: AnyRedis, sample: str) -> None:
    k = reg.keys
    with pytest.raises(redis.ResponseError, match="reach: bad sample"):
        await scripts.call(r, "count_agents", [k.agents, k.agent_prefix], [sample])


async def test_arity_and_key_type_are_refused(reg: Registry, r: AnyRedis) -> None:
    k = reg.keys
    with pytest.raises(redis.ResponseError, match="reach: bad arguments: want 2 KEYS and 1"):
        await scripts.call(r, "count_agents", [k.agents], ["10"])
    with pytest.raises(redis.ResponseError, match="reach: bad arguments"):
        await scripts.call(r, "count_agents", [k.agents, k.agent_prefix], ["10", "1"])
    await r.set(k.agents, "x")
    with pytest.raises(redis.ResponseError, match="reach: bad KEYS.1.: holds a string"):
        await scripts.call(r, "count_agents", [k.agents, k.agent_prefix], ["10"])


async def test_registry_refuses_a_bad_sample_before_redis(reg: Registry) -> None:
    from reach.errors import ConfigError

    for bad in (0, 100_001):
        with pytest.raises(ConfigError):
            await reg.count_agents(sample=bad)

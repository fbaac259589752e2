"""sweep.lua through Registry.sweep: lease state machine, shadows, lock, bounded events."""

from __future__ import annotations

import pytest
import redis

import reach
from reach import scripts
from reach.connection import AnyRedis
from reach.registry import Registry
from tests.support.registry_helpers import (
    LONG_EVICT_MS,
    assert_consistent,
    register,
    wait_until,
)

pytestmark = pytest.mark.anyio

LEASE_MS = 200
EVICT_AFTER_MS = 400
SHADOW_TTL_MS = 1500  # long enough for the checks after an eviction on a loaded machine


async def _state(reg: Registry, agent_id: str) -> str | None:
    a = await reg.get(agent_id)
    return a.state if a else None


async def test_nothing_due(reg: Registry) -> None:
    await register(reg, "a1")
    res = await reg.sweep()
    assert (res.locked, res.due, res.probation, res.evicted, res.deleted) == (False, 0, 0, [], 0)
    assert await _state(reg, "a1") == "active"


async def test_empty_namespace(reg: Registry) -> None:
    res = await reg.sweep(owner="x", lock_ms=1000)
    assert (res.locked, res.due) == (False, 0)


async def test_lease_transitions_at_sub_second_settings(reg: Registry, r: AnyRedis) -> None:
    """active -> probation -> (heartbeat) active -> probation -> evicted -> shadow deleted."""
    _, inst, version = await register(
        reg,
        "a1",
        ["solo", "shared"],
        lease_ms=LEASE_MS,
        evict_after_ms=EVICT_AFTER_MS,
        ready=True,
    )
    await register(reg, "keeper", ["shared"])  # long lease: stays

    async def sweep_until(state: str | None) -> list[str | None]:
        seen: list[str | None] = []

        async def reached() -> bool:
            await reg.sweep(shadow_ttl_ms=SHADOW_TTL_MS)
            s = await _state(reg, "a1")
            if not seen or seen[-1] != s:
                seen.append(s)
            return s == state

        await wait_until(reached, timeout_s=15, interval_s=0.01, what=f"state {state}")
        return seen

    # 1. no heartbeat for lease_ms: probation, still routable-by-capability (sets kept)
    assert await sweep_until("probation") == ["active", "probation"]
    a = await reg.get("a1")
    assert a is not None and a.state_ms >= a.last_heartbeat_ms + LEASE_MS
    assert await r.zscore(reg.keys.agents, "a1") == a.last_heartbeat_ms + EVICT_AFTER_MS
    assert await reg.agent_ids("solo") == ["a1"]
    assert [x.agent_id for x in await reg.agents("shared", state="probation")] == ["a1"]

    # 2. a heartbeat in probation returns to active
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (2, False)
    assert await _state(reg, "a1") == "active"

    # 3. silence again: probation, then evicted (removed from capability sets, shadow kept)
    assert await sweep_until("evicted") == ["active", "probation", "evicted"]
    shadow = await reg.get("a1")
    assert shadow is not None
    assert (shadow.state, shadow.ready, shadow.instance_id) == ("evicted", False, inst)
    assert shadow.state_ms >= shadow.last_heartbeat_ms + EVICT_AFTER_MS
    assert 0 < await r.pttl(reg.keys.agent("a1")) <= SHADOW_TTL_MS
    assert await reg.agent_ids("solo") == []
    assert await reg.agent_ids("shared") == ["keeper"]
    assert await reg.capabilities() == [("shared", 1)]
    assert [x.agent_id for x in await reg.agents(state="evicted")] == ["a1"]
    await assert_consistent(reg)

    # 4. after shadow_ttl the shadow is deleted for good
    assert await sweep_until(None) == ["evicted", None]

    async def zset_cleared() -> bool:
        await reg.sweep(shadow_ttl_ms=SHADOW_TTL_MS)
        return await r.zscore(reg.keys.agents, "a1") is None

    await wait_until(zset_cleared, what="agents zset entry removed")
    assert await reg.agent_ids() == ["keeper"]
    await assert_consistent(reg)

    mine = [e.type for e in await reg.events(count=1000) if e.agent_id == "a1"]
    assert mine == ["registered", "unstable", "recovered", "unstable", "evicted"]
    assert await _state(reg, "keeper") == "active"


async def test_sweep_result_counts_and_evicted_ids(reg: Registry, r: AnyRedis) -> None:
    await register(reg, "p1", ["c"], lease_ms=1, evict_after_ms=LONG_EVICT_MS)
    await register(reg, "e1", ["c"], lease_ms=1, evict_after_ms=1)
    await register(reg, "e2", ["c", "d"], lease_ms=1, evict_after_ms=1)
    await register(reg, "live", ["c"])

    async def all_due() -> bool:
        t = await r.time()
        now = t[0] * 1000 + t[1] // 1000
        return len(await r.zrangebyscore(reg.keys.agents, "-inf", now - 2)) == 3

    await wait_until(all_due, what="leases running out")
    res = await reg.sweep(shadow_ttl_ms=60_000)
    assert res.due == 3
    assert res.probation == 1
    assert sorted(res.evicted) == ["e1", "e2"]  # overdue past evict_after: straight to evicted
    assert res.deleted == 0
    assert await reg.agent_ids("c") == ["live", "p1"]
    assert await reg.capabilities() == [("c", 2)]
    types = sorted((e.type, e.agent_id) for e in await reg.events() if e.type != "registered")
    assert types == [("evicted", "e1"), ("evicted", "e2"), ("unstable", "p1")]
    await assert_consistent(reg)

    # a probation agent swept before its evict_after only gets its deadline moved
    assert (await reg.sweep()).due == 0
    p1 = await reg.get("p1")
    assert p1 is not None
    assert await r.zscore(reg.keys.agents, "p1") == p1.last_heartbeat_ms + LONG_EVICT_MS


async def test_batches_loop_until_nothing_due(reg: Registry, r: AnyRedis) -> None:
    for i in range(25):
        await register(reg, f"a{i:02}", ["c"], lease_ms=1, evict_after_ms=LONG_EVICT_MS)

    async def all_due() -> bool:
        t = await r.time()
        now = t[0] * 1000 + t[1] // 1000
        return len(await r.zrangebyscore(reg.keys.agents, "-inf", now - 2)) == 25

    await wait_until(all_due, what="leases running out")
    res = await reg.sweep(batch=10)
    assert (res.due, res.probation) == (25, 25)
    assert {a.state for a in await reg.agents("c")} == {"probation"}


async def test_sweeper_lock(reg: Registry, r: AnyRedis) -> None:
    await register(reg, "a1", lease_ms=1, evict_after_ms=LONG_EVICT_MS)

    res = await reg.sweep(owner="runtime-a", lock_ms=60_000)
    assert not res.locked
    assert await r.get(reg.keys.sweeper_lock) == b"runtime-a"
    assert 0 < await r.pttl(reg.keys.sweeper_lock) <= 60_000

    # another owner is kept idle and changes nothing
    res = await reg.sweep(owner="runtime-b", lock_ms=60_000)
    assert res.locked and res.due == 0
    assert await r.get(reg.keys.sweeper_lock) == b"runtime-a"

    # the holder sweeps again and renews its lock
    await r.pexpire(reg.keys.sweeper_lock, 5_000)
    res = await reg.sweep(owner="runtime-a", lock_ms=60_000)
    assert not res.locked
    assert await r.pttl(reg.keys.sweeper_lock) > 5_000

    # lock_ms=0 sweeps without looking at (or taking) the lock, e.g. `reach sweep`
    res = await reg.sweep(owner="cli", lock_ms=0)
    assert not res.locked
    assert await r.get(reg.keys.sweeper_lock) == b"runtime-a"


async def test_lock_expires_and_passes_on(reg: Registry, r: AnyRedis) -> None:
    assert not (await reg.sweep(owner="a", lock_ms=50)).locked
    assert (await reg.sweep(owner="b", lock_ms=50)).locked

    async def b_gets_it() -> bool:
        return not (await reg.sweep(owner="b", lock_ms=50)).locked

    await wait_until(b_gets_it, what="lock expiry")
    assert (await reg.sweep(owner="a", lock_ms=50)).locked


async def test_events_stream_stays_bounded(r: AnyRedis, ns: str) -> None:
    """Every script trims the events stream (MAXLEN ~ trims whole nodes: allow one node)."""
    maxlen = 5
    reg = Registry(r, ns, events_maxlen=maxlen)
    node = int((await r.config_get("stream-node-max-entries"))["stream-node-max-entries"])
    n = node * 3
    bound = maxlen + node

    async def length() -> int:
        return int(await r.xlen(reg.keys.events))

    for i in range(n):  # registered, ready, draining
        _, inst, _ = await register(reg, f"a{i}", ["c"], lease_ms=1, evict_after_ms=1)
        await reg.mark_ready(f"a{i}", instance_id=inst)
        await reg.drain(f"a{i}")
    assert 0 < await length() <= bound

    evicted: set[str] = set()

    async def all_evicted() -> bool:  # evicted
        evicted.update((await reg.sweep(shadow_ttl_ms=60_000)).evicted)
        return len(evicted) == n

    await wait_until(all_evicted, what="evictions")
    assert 0 < await length() <= bound
    assert (await reg.events(count=1000))[-1].type == "evicted"

    for i in range(n):  # deregistered
        assert await reg.deregister(f"a{i}") == 1
    assert 0 < await length() <= bound
    assert (await reg.events(count=1000))[-1].type == "deregistered"


# -- arguments and stored records out of contract (issue 9, item 10) ---------------------

THIRTY_TWO_YEARS_MS = 32 * 365 * 86_400_000


def _sweep_keys(reg: Registry) -> list[str]:
    k = reg.keys
    return [k.agents, k.caps, k.events, k.sweeper_lock, k.cap_prefix, k.agent_prefix, k.reroute]


@pytest.mark.parametrize(
    ("index", "value", "name"),
    [
        (1, str(THIRTY_TWO_YEARS_MS), "lock_ms"),
        (1, "3600001", "lock_ms"),
        (1, "-1", "lock_ms"),
        (1, "abc", "lock_ms"),
        (1, "0100", "lock_ms"),
        (1, "nan", "lock_ms"),
        (1, "", "lock_ms"),
        (0, "", "owner"),
        (2, "0", "shadow_ttl_ms"),
        (2, "inf", "shadow_ttl_ms"),
        (2, "2592000001", "shadow_ttl_ms"),
        (3, "0", "batch"),
        (3, "1e309", "batch"),
        (3, "100001", "batch"),
        (4, "0", "events maxlen"),
        (4, "x", "events maxlen"),
        (4, "007", "events maxlen"),
    ],
)
async def test_bad_argument_is_refused_before_taking_the_lock(
    reg: Registry, r: AnyRedis, index: int, value: str, name: str
) -> None:
    await register(reg, "a1", lease_ms=1, evict_after_ms=LONG_EVICT_MS)
    args: list[object] = ["owner", 1000, 60_000, 100, 100]
    args[index] = value
    with pytest.raises(redis.ResponseError, match=f"^reach: bad {name}"):
        await scripts.call(r, "sweep", _sweep_keys(reg), args)
    assert await r.exists(reg.keys.sweeper_lock) == 0
    assert await _state(reg, "a1") == "active"


async def test_registry_refuses_a_32_year_lock(reg: Registry, r: AnyRedis) -> None:
    with pytest.raises(reach.ConfigError, match="lock_ms"):
        await reg.sweep(owner="x", lock_ms=THIRTY_TWO_YEARS_MS)
    with pytest.raises(reach.ConfigError, match="shadow_ttl_ms"):
        await reg.sweep(shadow_ttl_ms=0)
    with pytest.raises(reach.ConfigError, match="batch"):
        await reg.sweep(batch=0)
    assert await r.exists(reg.keys.sweeper_lock) == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"last_heartbeat_ms": "abc"},
        {"evict_after_ms": "nan"},
        {"evict_after_ms": ""},
        {"last_heartbeat_ms": "inf"},
        {"state": "weird", "last_heartbeat_ms": "x"},
    ],
)
async def test_unreadable_timing_is_evicted_and_the_sweep_goes_on(
    reg: Registry, r: AnyRedis, fields: dict[str, str]
) -> None:
    """One record with timing fields that are not numbers must not stop every sweep of the
    namespace (the script used to fail on it, for ever): it is evicted when due."""
    await register(reg, "bad", ["c"], lease_ms=1, evict_after_ms=LONG_EVICT_MS)
    await register(reg, "slow", ["c"], lease_ms=1, evict_after_ms=LONG_EVICT_MS)
    await register(reg, "live", ["c"])
    await r.hset(reg.keys.agent("bad"), mapping=fields)

    async def swept() -> bool:
        res = await reg.sweep(shadow_ttl_ms=60_000)
        return "bad" in res.evicted or await _state(reg, "bad") == "evicted"

    await wait_until(swept, what="eviction of the bad record")

    async def slow_in_probation() -> bool:
        await reg.sweep(shadow_ttl_ms=60_000)
        return await _state(reg, "slow") == "probation"

    await wait_until(slow_in_probation, what="probation")
    assert await reg.agent_ids("c") == ["live", "slow"]
    assert await r.sismember(reg.keys.reroute, "bad")


async def test_far_future_heartbeat_cannot_keep_a_record_for_ever(
    reg: Registry, r: AnyRedis
) -> None:
    await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=1)
    await r.hset(reg.keys.agent("a1"), mapping={"last_heartbeat_ms": "1e300", "state": "probation"})

    async def due_again() -> bool:
        await reg.sweep()
        t = await r.time()
        score = await r.zscore(reg.keys.agents, "a1")
        return score is not None and score > t[0] * 1000

    await wait_until(due_again, what="a new deadline")
    t = await r.time()
    assert await r.zscore(reg.keys.agents, "a1") <= t[0] * 1000 + 2 * 86_400_000 + 1000


async def test_record_without_state_is_not_orphaned(reg: Registry, r: AnyRedis) -> None:
    """A hash missing its state field still gets evicted and deleted, not dropped from the
    agents zset while the hash stays (no sweep would ever see it again)."""
    await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=1)
    await r.hdel(reg.keys.agent("a1"), "state")

    async def evicted() -> bool:
        await reg.sweep(shadow_ttl_ms=60_000)
        return await r.hget(reg.keys.agent("a1"), "state") == b"evicted"

    await wait_until(evicted, what="eviction")
    assert await r.zscore(reg.keys.agents, "a1") is not None
    assert await reg.agent_ids("c") == []


async def test_keys_of_another_type_do_not_stop_the_sweep(reg: Registry, r: AnyRedis) -> None:
    """A capability set or an agent key of another type is passed over, not a failure of
    every sweep of the namespace."""
    await register(reg, "a1", ["c", "d"], lease_ms=1, evict_after_ms=1)
    await register(reg, "live", ["c"])
    await r.delete(reg.keys.cap("d"))
    await r.set(reg.keys.cap("d"), "not a set")
    await r.zadd(reg.keys.agents, {"strange": 1})
    await r.set(reg.keys.agent("strange"), "not a hash")

    async def evicted() -> bool:
        return "a1" in (await reg.sweep(shadow_ttl_ms=60_000)).evicted

    await wait_until(evicted, what="eviction")
    assert await r.zscore(reg.keys.agents, "strange") is None
    assert await r.get(reg.keys.agent("strange")) == b"not a hash"  # not the sweeper's to delete
    assert await reg.agent_ids("c") == ["live"]
    with pytest.raises(reach.ConfigError, match=r"KEYS\[4\]: holds a hash"):
        await r.delete(reg.keys.sweeper_lock)
        await r.hset(reg.keys.sweeper_lock, "x", "y")
        await reg.sweep(owner="o", lock_ms=1000)

"""The registry scripts on a 3-master Redis Cluster, with namespaces on every master."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.crc import key_slot

import reach
from reach import scripts
from reach.connection import AnyRedis, connect, is_cluster
from reach.keys import Keys
from reach.registry import Registry
from tests.support.cluster import SLOTS, RedisTestCluster
from tests.support.registry_helpers import (
    LONG_EVICT_MS,
    assert_consistent,
    new_version,
    register,
    wait_until,
)

pytestmark = [pytest.mark.cluster, pytest.mark.anyio]

MASTERS = 3


def _master_of(namespace: str) -> int:
    """Index of the test cluster's master that owns the namespace's registry slot."""
    slot = key_slot(Keys(namespace).agents.encode())
    return min(slot // (SLOTS // MASTERS), MASTERS - 1)


def namespaces_on_every_master() -> list[str]:
    """One fresh namespace per master (different hash slots, different nodes)."""
    base = uuid.uuid4().hex[:8]
    found: dict[int, str] = {}
    i = 0
    while len(found) < MASTERS:
        ns = f"c{base}{i}"
        found.setdefault(_master_of(ns), ns)
        i += 1
    return [found[m] for m in range(MASTERS)]


@pytest.fixture
async def rc(redis_cluster: RedisTestCluster) -> AsyncIterator[AnyRedis]:
    client = await connect(redis_cluster.url)
    assert is_cluster(client)
    yield client
    await client.aclose()


def test_namespaces_spread_over_masters() -> None:
    spaces = namespaces_on_every_master()
    slots = {key_slot(Keys(ns).agents.encode()) for ns in spaces}
    assert len(slots) == MASTERS
    assert sorted(_master_of(ns) for ns in spaces) == list(range(MASTERS))
    # every key of a registry shard shares its slot (shard 0 here: Keys' default of one
    # shard; test_registry_shards has the others); inboxes are elsewhere by design
    k = Keys(spaces[0])
    same = {k.agents, k.agent("x"), k.cap("a.b"), k.caps, k.events, k.sweeper_lock}
    assert {key_slot(x.encode()) for x in same} == {key_slot(k.agents.encode())}


@pytest.mark.parametrize("master", range(MASTERS))
async def test_registry_lifecycle_on_cluster(rc: AnyRedis, master: int) -> None:
    ns = namespaces_on_every_master()[master]
    reg = Registry(rc, ns, events_maxlen=50)

    # register + query
    code, i1, v1 = await register(
        reg, "a1", ["Text.Summarize", "code.review"], metadata={"region": "eu"}
    )
    assert code == 1
    _, i2, v2 = await register(reg, "a2", ["text.summarize"], metadata={"region": "us"})
    assert await reg.capabilities() == [("code.review", 1), ("text.summarize", 2)]
    assert await reg.mark_ready("a1", instance_id=i1) == 1
    assert [a.agent_id for a in await reg.agents("text.summarize", ready=True)] == ["a1"]
    assert [a.agent_id for a in await reg.agents("text.summarize", where={"region": "us"})] == [
        "a2"
    ]

    # heartbeat, drain
    assert await reg.heartbeat("a1", instance_id=i1, version=v1, queue_depth=2) == (1, False)
    assert await reg.drain("a2") == 1
    assert await reg.heartbeat("a2", instance_id=i2, version=v2) == (1, True)

    # stale version and re-register with other capabilities
    with pytest.raises(reach.StaleRegistration):
        await register(reg, "a1", ["x"], version=v1 - 1)
    assert (await register(reg, "a2", ["code.review"]))[0] == 2
    assert await reg.capabilities() == [("text.summarize", 1), ("code.review", 2)]

    # sweeper lock and lease transitions
    _, i3, v3 = await register(reg, "a3", ["code.review"], lease_ms=1, evict_after_ms=LONG_EVICT_MS)
    await register(reg, "a4", ["code.review"], lease_ms=1, evict_after_ms=1)
    evicted: list[str] = []

    async def sweep() -> bool:
        res = await reg.sweep(owner="me", lock_ms=60_000, shadow_ttl_ms=60_000)
        evicted.extend(res.evicted)
        return not res.locked

    assert await sweep()
    assert (await reg.sweep(owner="other", lock_ms=60_000)).locked

    async def settled() -> bool:
        assert await sweep()
        a3 = await reg.get("a3")
        return evicted == ["a4"] and a3 is not None and a3.state == "probation"

    await wait_until(settled, what="probation and eviction")
    assert await reg.heartbeat("a3", instance_id=i3, version=v3) == (2, False)
    assert sorted(await reg.agent_ids("code.review")) == ["a1", "a2", "a3"]
    a4 = await reg.get("a4")
    assert a4 is not None and a4.state == "evicted"
    await assert_consistent(reg)

    # deregister
    assert await reg.deregister("a1", instance_id=i1) == 1
    assert await reg.deregister("a1") == 0
    assert await reg.capabilities() == [("code.review", 2)]
    types = [e.type for e in await reg.events(count=100)]
    for t in ("registered", "ready", "draining", "unstable", "recovered", "evicted"):
        assert t in types, (t, types)
    assert types[-1] == "deregistered"
    await assert_consistent(reg)


async def test_namespaces_stay_apart_on_cluster(rc: AnyRedis) -> None:
    regs = [Registry(rc, ns) for ns in namespaces_on_every_master()]
    for i, reg in enumerate(regs):
        await register(reg, f"only{i}", ["shared.cap"])
    for i, reg in enumerate(regs):
        assert await reg.agent_ids("shared.cap") == [f"only{i}"]
        assert await reg.agent_ids() == [f"only{i}"]
        await assert_consistent(reg)


async def test_pipelined_heartbeats_on_cluster(rc: AnyRedis) -> None:
    """run_pipeline sends EVALSHA via execute_command: fine on a cluster, all masters."""
    ops, expected = [], []
    regs = [Registry(rc, ns) for ns in namespaces_on_every_master()]
    for reg in regs:
        for j in range(3):
            _, inst, version = await register(reg, f"p{j}", ["c"])
            call = reg.heartbeat_call(
                f"p{j}", instance_id=inst, version=version, queue_depth=j, inflight=0
            )
            ops.append(call.op())
            expected.append([1, 0])
    ops.append(
        regs[0]
        .heartbeat_call("ghost", instance_id="i", version=new_version(), queue_depth=0, inflight=0)
        .op()
    )
    expected.append([0, 0])
    assert await scripts.run_pipeline(rc, ops) == expected
    for reg in regs:
        assert [a.queue_depth for a in sorted(await reg.agents("c"), key=lambda a: a.agent_id)] == [
            0,
            1,
            2,
        ]


async def test_script_flush_on_every_master_recovers(rc: AnyRedis) -> None:
    regs = [Registry(rc, ns) for ns in namespaces_on_every_master()]
    creds = []
    for reg in regs:
        _, inst, version = await register(reg, "a", ["c"])
        creds.append((inst, version))
    await rc.script_flush()  # every primary
    for reg, (inst, version) in zip(regs, creds, strict=True):
        assert await reg.heartbeat("a", instance_id=inst, version=version) == (1, False)
    await rc.script_flush()
    ops = [
        reg.heartbeat_call("a", instance_id=inst, version=version, queue_depth=0, inflight=0).op()
        for reg, (inst, version) in zip(regs, creds, strict=True)
    ]
    assert await scripts.run_pipeline(rc, ops) == [[1, 0]] * MASTERS
    await rc.script_flush()
    for reg in regs:
        assert (await reg.sweep(owner="x", lock_ms=1000)).due == 0
        assert await reg.deregister("a") == 1
        await assert_consistent(reg)

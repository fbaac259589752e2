"""The script cache is lost on SCRIPT FLUSH and on every restart: calls must reload it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis

from reach import scripts
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.registry import Registry
from reach.scripts.agents import Heartbeat
from reach.scripts.codes import HeartbeatCode, RegisterCode
from tests.support.registry_helpers import assert_consistent, new_version, register, wait_until

pytestmark = pytest.mark.anyio

ALL = ("register", "heartbeat", "deregister", "mark_ready", "drain", "sweep")


@pytest.fixture
async def fr(fresh_redis: RedisServer) -> AsyncIterator[AnyRedis]:
    client = await connect(fresh_redis.url)
    yield client
    await client.aclose()


async def _cached(r: AnyRedis) -> list[bool]:
    return [bool(x) for x in await r.script_exists(*(scripts.script(n).sha for n in ALL))]


async def test_every_call_recovers_after_script_flush(fr: AnyRedis, ns: str) -> None:
    reg = Registry(fr, ns)
    assert await _cached(fr) == [False] * len(ALL)

    async def flushed() -> None:
        await fr.script_flush()
        assert not any(await _cached(fr))

    await flushed()
    _, inst, version = await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=60_000)
    await flushed()
    assert await reg.mark_ready("a1", instance_id=inst) == 1
    await flushed()
    assert (await reg.sweep(owner="o", lock_ms=1000)).locked is False
    await flushed()
    assert await reg.heartbeat("a1", instance_id=inst, version=version) in ((1, False), (2, False))
    await flushed()
    assert await reg.drain("a1") == 1
    await flushed()
    assert await reg.deregister("a1", instance_id=inst) == 1
    assert (await _cached(fr))[ALL.index("deregister")]
    assert [e.type for e in await reg.events()][-1] == "deregistered"


async def test_calls_work_after_redis_restart(
    fresh_redis: RedisServer, fr: AnyRedis, ns: str
) -> None:
    reg = Registry(fr, ns)
    _, inst, version = await register(reg, "a1", ["c"], ready=True)
    await register(reg, "a2", ["c", "d"])
    await reg.heartbeat("a1", instance_id=inst, version=version)
    assert any(await _cached(fr))

    fresh_redis.restart()  # SIGKILL + start: the AOF keeps the data, the script cache is gone

    async def reachable() -> bool:  # the client's old connection is dead: let it reconnect
        try:
            return bool(await fr.ping())
        except redis.ConnectionError:
            return False

    await wait_until(reachable, what="reconnection")
    assert not any(await _cached(fr))
    # the registry survived, and every script reloads on first use
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (1, False)
    assert [a.agent_id for a in await reg.agents("c", ready=True)] == ["a1"]
    assert await reg.capabilities() == [("d", 1), ("c", 2)]
    assert await reg.drain("a2") == 1
    assert (await reg.sweep(owner="o", lock_ms=1000)).due == 0
    assert await reg.mark_ready("a1", instance_id=inst, ready=False) == 1
    assert await reg.deregister("a2") == 1
    code, _, _ = await register(reg, "a3", ["d"])
    assert code == 1
    await assert_consistent(reg)


async def test_same_client_survives_restart_without_explicit_ping(
    fresh_redis: RedisServer, fr: AnyRedis, ns: str
) -> None:
    """redis-py retries a call on a dropped connection; NOSCRIPT is handled behind it."""
    reg = Registry(fr, ns)
    _, inst, version = await register(reg, "a1", ["c"])
    fresh_redis.restart()
    assert await reg.heartbeat("a1", instance_id=inst, version=version) == (1, False)


async def test_run_pipeline_recovers_noscript(
    fresh_redis: RedisServer, fr: AnyRedis, ns: str
) -> None:
    reg = Registry(fr, ns)
    creds = {}
    for a in ("a1", "a2", "a3"):
        _, inst, version = await register(reg, a, ["c"])
        creds[a] = (inst, version)
    counter = f"{ns}:plain-counter"

    def ops(depth: int) -> list[scripts.Op]:
        out = [
            reg.heartbeat_call(a, instance_id=i, version=v, queue_depth=depth, inflight=0).op()
            for a, (i, v) in creds.items()
        ]
        out.insert(1, ("INCR", counter))  # a plain command must not run twice
        out.append(
            reg.heartbeat_call(
                "ghost", instance_id="x", version=new_version(), queue_depth=0, inflight=0
            ).op()
        )
        return out

    await fr.script_flush()
    res = await scripts.run_pipeline(fr, ops(5))
    assert res == [[1, 0], 1, [1, 0], [1, 0], [0, 0]]
    assert [a.queue_depth for a in await reg.agents("c")] == [5, 5, 5]
    assert all(await _cached(fr))  # load_all loaded every script

    fresh_redis.restart()

    async def reachable() -> bool:
        try:
            return bool(await fr.ping())
        except redis.ConnectionError:
            return False

    await wait_until(reachable, what="reconnection")
    assert not any(await _cached(fr))
    res = await scripts.run_pipeline(fr, ops(9))
    assert res == [[1, 0], 2, [1, 0], [1, 0], [0, 0]]
    assert int(await fr.get(counter)) == 2
    assert [a.queue_depth for a in await reg.agents("c")] == [9, 9, 9]

    # errors other than NOSCRIPT come back in place, not raised, and are not retried
    await fr.script_flush()
    res = await scripts.run_pipeline(
        fr, [("INCR", counter), ("HGET", counter, "x"), reg.scripts.drain("a1").op()]
    )
    assert res[0] == 3 and isinstance(res[1], redis.ResponseError) and res[2] == 1
    assert int(await fr.get(counter)) == 3


def test_sync_call_recovers_after_flush_and_restart(fresh_redis: RedisServer, ns: str) -> None:
    """scripts.call_sync (the heartbeat thread's path) reloads on NOSCRIPT too."""
    r = redis.Redis.from_url(fresh_redis.url)
    try:
        reg = Registry(r, ns)
        version = new_version()
        registration = reg.register_call(
            "s1",
            instance_id="i",
            version=version,
            capabilities=["c"],
            lease_ms=60_000,
            evict_after_ms=120_000,
        )
        assert registration.run_sync(r).code is RegisterCode.NEW
        hb = reg.heartbeat_call("s1", instance_id="i", version=version, queue_depth=0, inflight=0)
        r.script_flush()
        assert hb.run_sync(r) == Heartbeat(HeartbeatCode.RENEWED)
        fresh_redis.restart()
        for _ in range(50):  # reconnect
            try:
                r.ping()
                break
            except redis.ConnectionError:
                continue
        assert hb.run_sync(r) == Heartbeat(HeartbeatCode.RENEWED)
    finally:
        r.close()

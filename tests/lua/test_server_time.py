"""server_time.lua through its typed call and Registry.measure_clock: Redis's TIME, read on
the node of the registry's slot; on a Cluster through the auto-pipeline's connection to that
node, no other; any other number of KEYS or ARGV refused."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.crc import key_slot

from reach import scripts
from reach._autopipe import AutoPipeline
from reach.clock import Clock
from reach.connection import AnyRedis, connect
from reach.registry import Registry
from tests.support.cluster import RedisTestCluster, master_of_slot

pytestmark = pytest.mark.anyio


async def test_it_answers_what_time_answers(reg: Registry, r: AnyRedis) -> None:
    before = await r.time()
    sec, usec = await reg.scripts.server_time().run(r)
    after = await r.time()
    assert 0 <= usec < 1_000_000
    assert before <= (sec, usec) <= after


async def test_measure_clock_finds_a_host_30_s_ahead(reg: Registry) -> None:
    clock = Clock(local=lambda: time.time() + 30)
    skew = await reg.measure_clock(clock)
    assert skew is not None and skew == pytest.approx(-30, abs=0.5)
    assert clock.offset_ms == pytest.approx(-30_000, abs=500) and clock.measured == 1


async def test_any_other_arity_is_refused(reg: Registry, r: AnyRedis) -> None:
    k = reg.keys
    for keys, args, got in (
        ([], [], "0 and 0"),
        ([k.agents], ["1"], "1 and 1"),
        ([k.agents, k.events], [], "2 and 0"),
    ):
        with pytest.raises(
            redis.ResponseError, match=f"reach: bad arguments: want 1 KEYS and 0 ARGV, got {got}"
        ):
            await scripts.call(r, "server_time", keys, args)


async def _per_node(cluster: RedisTestCluster, what: str) -> list[Any]:
    """Per master: ``evalsha`` calls so far (INFO commandstats), or the connections named
    ``what`` (CLIENT LIST)."""
    out: list[Any] = []
    for n in cluster.nodes:
        node: Any = aredis.Redis(port=n.port)
        try:
            if what == "evalsha":
                stats = await node.info("commandstats")
                out.append(int(stats.get("cmdstat_evalsha", {}).get("calls", 0)))
            else:
                listed = await node.execute_command("CLIENT LIST")
                out.append(len([c for c in listed if c.get("name") == what]))
        finally:
            await node.aclose()
    return out


@pytest.mark.cluster
async def test_on_a_cluster_it_reads_the_registry_masters_clock_on_its_connection(
    redis_cluster: RedisTestCluster, ns: str
) -> None:
    auto = AutoPipeline(await connect(redis_cluster.url, client_name=f"t-clock-{ns}"))
    try:
        reg = Registry(auto, ns)
        home = master_of_slot(key_slot(reg.keys.agents.encode()))
        calls = await _per_node(redis_cluster, "evalsha")
        clock = Clock(local=lambda: time.time() - 30)
        skew = await reg.measure_clock(clock)
        assert skew is not None and skew == pytest.approx(30, abs=0.5)  # measured, not None
        more = [
            b - a for a, b in zip(calls, await _per_node(redis_cluster, "evalsha"), strict=True)
        ]
        assert more[home] >= 1 and sum(more) == more[home], more  # the registry's node only
        # no connection of its own: what a GET of the registry's key leaves (the
        # auto-pipeline's one to that node; redis-py's COMMAND connection on the URL's node)
        held = await _per_node(redis_cluster, f"t-clock-{ns}")
        assert held[home] == 1, held
        await auto.get(reg.keys.agents)
        assert await _per_node(redis_cluster, f"t-clock-{ns}") == held
    finally:
        await auto.aclose()

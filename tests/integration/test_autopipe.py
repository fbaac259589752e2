"""Auto-pipelining (reach._autopipe): what concurrent tasks issue in one loop turn goes out
as one pipeline, each caller gets its own reply or its own error, a lone command is not
held back, NOSCRIPT is recovered, and the connections stay few whatever the concurrency.
Counts (batches, commands, connections), never timings."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import anyio
import pytest
from redis import exceptions as rexc

from reach._autopipe import AutoPipeline
from reach.connection import AnyRedis, RedisLike, connect, pool_connections
from reach.scripts import Call, script
from tests.support.cluster import RedisTestCluster

pytestmark = pytest.mark.anyio


@pytest.fixture
async def auto(redis_url: str) -> AsyncIterator[AutoPipeline]:
    client = await connect(redis_url)
    a = AutoPipeline(client)
    yield a
    await a.aclose()


def test_it_offers_every_method_of_the_protocol() -> None:
    names = [n for n, m in vars(RedisLike).items() if inspect.isfunction(m) and n[0] != "_"]
    missing = [n for n in names if n not in vars(AutoPipeline)]
    assert not missing, f"AutoPipeline lacks {missing}: batch it or pass it through"


async def test_commands_of_one_turn_go_out_in_one_pipeline(auto: AutoPipeline, ns: str) -> None:
    key = f"{ns}:k"
    await auto.set(key, "v")
    before = auto.batches
    replies = await asyncio.gather(*(auto.get(key) for _ in range(100)))
    assert replies == [b"v"] * 100
    assert auto.batches - before == 1


async def test_a_lone_command_goes_out_alone_at_the_end_of_the_turn(auto: AutoPipeline) -> None:
    before = auto.batches, auto.commands
    assert await auto.ping() is True  # passed through
    assert await auto.set("lone", 1)
    assert (auto.batches, auto.commands) == (before[0] + 1, before[1] + 1)
    # Sent without the loop going idle first: nothing but the end of the turn is awaited.
    loop = asyncio.get_running_loop()
    turns = 0

    def tick() -> None:
        nonlocal turns
        turns += 1
        loop.call_soon(tick)

    loop.call_soon(tick)
    await auto.get("lone")
    assert turns < 50  # a few turns (flush, the write, the read), no timer


async def test_each_caller_gets_its_own_error(auto: AutoPipeline, ns: str) -> None:
    await auto.rpush(f"{ns}:list", "x")
    await auto.set(f"{ns}:s", "v")
    results = await asyncio.gather(
        auto.get(f"{ns}:s"),
        auto.get(f"{ns}:list"),  # WRONGTYPE: an error reply
        auto.set(f"{ns}:t", object()),  # redis-py cannot encode it: refused before the write
        auto.hset(f"{ns}:h", mapping={}),  # refused as it is queued
        auto.get(f"{ns}:s"),
        return_exceptions=True,
    )
    assert results[0] == results[4] == b"v"
    assert isinstance(results[1], rexc.ResponseError) and "WRONGTYPE" in str(results[1])
    assert isinstance(results[2], rexc.DataError)
    assert isinstance(results[3], rexc.DataError)


async def test_noscript_in_a_batch_is_recovered(auto: AutoPipeline, r: AnyRedis, ns: str) -> None:
    # A script of reach's own, absent from the server's cache (a restart, a failover).
    call = Call("drop_inbox", (f"{ns}:a", f"{ns}:b", f"{ns}:c"), (), lambda x: x)
    await r.execute_command("SCRIPT", "FLUSH")
    assert not (await r.execute_command("SCRIPT", "EXISTS", script("drop_inbox").sha))[0]
    replies = await asyncio.gather(*(call.run(auto) for _ in range(20)), auto.get(f"{ns}:x"))
    assert replies[:20] == [replies[0]] * 20 and replies[20] is None
    assert (await r.execute_command("SCRIPT", "EXISTS", script("drop_inbox").sha))[0]


async def test_a_caller_cancelled_before_the_write_sends_nothing(
    auto: AutoPipeline, r: AnyRedis, ns: str
) -> None:
    key = f"{ns}:cancelled"
    task = asyncio.get_running_loop().create_task(auto.execute_command("INCRBY", key, 1))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await auto.get(key)  # the next batch has gone out
    assert await r.get(key) is None


async def test_explicit_pipelines_join_the_batch(auto: AutoPipeline, ns: str) -> None:
    before = auto.batches
    pipe = auto.pipeline(transaction=False)
    pipe.set(f"{ns}:p", "1").get(f"{ns}:p").rpush(f"{ns}:p", "x")
    other = auto.get(f"{ns}:p")
    got, alone = await asyncio.gather(pipe.execute(raise_on_error=False), other)
    assert got[0] is True and got[1] == b"1" and isinstance(got[2], rexc.ResponseError)
    assert alone == b"1"
    assert auto.batches - before == 1
    pipe.get(f"{ns}:p").rpush(f"{ns}:p", "x")
    with pytest.raises(rexc.ResponseError, match="WRONGTYPE"):
        await pipe.execute()


async def test_blocking_reads_pass_through(auto: AutoPipeline, ns: str) -> None:
    key = f"{ns}:stream"
    before = auto.batches

    async def add_later() -> None:
        await anyio.sleep(0.05)
        await auto.xadd(key, {"f": "v"})

    async with anyio.create_task_group() as tg:
        tg.start_soon(add_later)
        res = await auto.xread({key: "$"}, block=2000)
    assert res and res[0][1][0][1] == {b"f": b"v"}
    assert auto.batches - before == 1  # the XADD; the blocking read went on its own


async def test_ten_thousand_concurrent_commands_use_a_few_connections(
    redis_url: str, ns: str
) -> None:
    client = await connect(redis_url, max_connections=64)
    auto = AutoPipeline(client, max_pipelines=4, max_batch=256)
    try:
        key = f"{ns}:n"
        results = await asyncio.gather(
            *(auto.execute_command("INCRBY", key, 1) for _ in range(10_000))
        )
        assert sorted(results) == list(range(1, 10_001))
        assert pool_connections(client) <= 4
        assert auto.batches <= 10_000 // 256 + 8
    finally:
        await auto.aclose()


async def test_on_a_cluster_a_batch_spans_slots_and_recovers_noscript(
    redis_cluster: RedisTestCluster, ns: str
) -> None:
    client = await connect(redis_cluster.url)
    auto = AutoPipeline(client)
    try:
        keys = [f"{ns}:{i}" for i in range(200)]  # spread over every node's slots
        await asyncio.gather(*(auto.set(k, k) for k in keys))
        assert await asyncio.gather(*(auto.get(k) for k in keys)) == [k.encode() for k in keys]
        assert await auto.delete(*keys) == 200  # several slots: the Cluster client splits it
        for node in client.get_primaries():  # type: ignore[attr-defined]
            await client.execute_command("SCRIPT", "FLUSH", target_nodes=node)
        calls = [
            Call("drop_inbox", (f"{{{ns}:{i}}}:a", f"{{{ns}:{i}}}:b", f"{{{ns}:{i}}}:c"), (), int)
            for i in range(30)
        ]
        replies = await asyncio.gather(*(c.run(auto) for c in calls))
        assert replies == [replies[0]] * 30 and isinstance(replies[0], int)
    finally:
        await auto.aclose()

"""Auto-pipelining (reach._autopipe): what concurrent tasks issue in one loop turn goes out
as one pipeline, each caller gets its own reply or its own error, a lone command is not
held back, NOSCRIPT is recovered, and the connections stay few whatever the concurrency.
Counts (batches, commands, connections), never timings."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis
from redis import exceptions as rexc

from reach._autopipe import IDLE_RELEASE_S, AutoPipeline
from reach.connection import AnyRedis, RedisLike, connect, pool_connections
from reach.embedded import RedisServer
from reach.scripts import Call, script
from tests.support.cluster import RedisTestCluster
from tests.support.sentinel import RedisTestSentinel

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
    """The first, with nothing in flight, is written at once (see the next test); the
    other 99 of the turn go out together."""
    key = f"{ns}:k"
    await auto.set(key, "v")
    before = auto.batches, auto.commands
    replies = await asyncio.gather(*(auto.get(key) for _ in range(100)))
    assert replies == [b"v"] * 100
    assert (auto.batches - before[0], auto.commands - before[1]) == (2, 100)


async def test_a_command_with_nothing_in_flight_is_written_in_its_callers_turn(
    auto: AutoPipeline, ns: str
) -> None:
    """No wake-up of the writer task first (an event-loop turn per round trip): the
    command is on the socket when its caller's step ends. With a command in flight, the
    next waits for the writer, which sends what the turn queued together."""
    await auto.set(f"{ns}:k", "v")
    sent = auto.batches
    first = asyncio.ensure_future(auto.get(f"{ns}:k"))
    await asyncio.sleep(0)  # the task's step ran; the writer task has not run since
    assert auto.batches == sent + 1
    second = asyncio.ensure_future(auto.get(f"{ns}:k"))
    await asyncio.sleep(0)
    assert auto.batches == sent + 1  # the first is in flight: the writer sends it
    assert await first == b"v" and await second == b"v"
    assert auto.batches == sent + 2


async def test_a_lone_command_goes_out_alone_at_the_end_of_the_turn(auto: AutoPipeline) -> None:
    before = auto.batches, auto.commands
    assert await auto.ping() is True  # passed through
    assert await auto.set("lone", 1)
    assert (auto.batches, auto.commands) == (before[0] + 1, before[1] + 1)
    # Sent without the loop going idle first: nothing but the end of the turn is awaited.
    # Counted until the batch goes out (not until Redis answers: a loaded machine's Redis
    # may take many turns to reply).
    sent = auto.batches
    get = asyncio.ensure_future(auto.get("lone"))
    turns = 0
    while auto.batches == sent and turns < 1000:
        await asyncio.sleep(0)
        turns += 1
    assert turns < 5, turns  # the end of this turn (and the flush task's start), no timer
    assert await get == b"1"


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


# -- the multiplexed connection (standalone, Sentinel) ------------------------------------
async def _named(r: AnyRedis, name: str) -> int:
    """Connections Redis holds now named ``name`` (CLIENT LIST)."""
    return len([c for c in await r.execute_command("CLIENT LIST") if c.get("name") == name])


async def test_thousands_of_commands_share_one_connection_each_caller_its_reply(
    redis_url: str, r: AnyRedis, ns: str
) -> None:
    client = await connect(redis_url, client_name="t-mux")
    auto = AutoPipeline(client, max_batch=128)
    assert auto.multiplexed
    try:
        n = 5000
        keys = [f"{ns}:v:{i}" for i in range(n)]
        assert all(await asyncio.gather(*(auto.set(k, f"value-{i}") for i, k in enumerate(keys))))
        # distinct values, read back in a shuffled order of callers: each gets its own
        order = list(range(n))
        order.reverse()
        got = await asyncio.gather(*(auto.get(keys[i]) for i in order))
        assert got == [f"value-{i}".encode() for i in order]
        # a mix of commands with their own reply shapes (callbacks applied per command)
        mixed = await asyncio.gather(
            *(auto.hset(f"{ns}:h:{i}", mapping={"a": i, "b": -i}) for i in range(1000)),
            *(auto.hgetall(f"{ns}:h:{i}") for i in range(1000)),
            *(auto.zadd(f"{ns}:z", {f"m{i}": i}) for i in range(1000)),
            auto.zrange(f"{ns}:z", 0, 2, withscores=True),
            auto.xadd(f"{ns}:s", {"f": "v"}),
            auto.xinfo_stream(f"{ns}:s"),
        )
        assert mixed[:1000] == [2] * 1000
        assert mixed[1000:2000] == [
            {b"a": str(i).encode(), b"b": str(-i).encode()} for i in range(1000)
        ]
        assert mixed[2000:3000] == [1] * 1000
        assert mixed[3000] == [(b"m0", 0.0), (b"m1", 1.0), (b"m2", 2.0)]
        assert isinstance(mixed[3001], bytes) and mixed[3002]["length"] == 1
        # one connection of the pool, one at Redis, whatever the concurrency
        assert pool_connections(client) == 1
        assert await _named(r, "t-mux") == 1
        assert auto.batches < 20_000 // 64
    finally:
        await auto.aclose()


async def test_error_replies_and_refusals_stay_in_place_in_a_big_burst(
    auto: AutoPipeline, ns: str
) -> None:
    await auto.rpush(f"{ns}:list", "x")
    await auto.set(f"{ns}:s", "v")
    calls = []
    for i in range(3000):
        if i % 3 == 0:
            calls.append(auto.get(f"{ns}:list"))  # WRONGTYPE
        elif i % 7 == 0:
            calls.append(auto.set(f"{ns}:bad", object()))  # refused before the write
        else:
            calls.append(auto.execute_command("ECHO", f"echo-{i}"))
    got = await asyncio.gather(*calls, return_exceptions=True)
    for i, x in enumerate(got):
        if i % 3 == 0:
            assert isinstance(x, rexc.ResponseError) and "WRONGTYPE" in str(x), (i, x)
        elif i % 7 == 0:
            assert isinstance(x, rexc.DataError), (i, x)
        else:
            assert x == f"echo-{i}".encode(), (i, x)
    assert await auto.get(f"{ns}:s") == b"v"  # the connection is in step


async def test_noscript_in_a_big_burst_reloads_on_the_same_connection(
    redis_url: str, r: AnyRedis, ns: str
) -> None:
    client = await connect(redis_url)
    auto = AutoPipeline(client, max_batch=64)
    try:
        await auto.set(f"{ns}:x", "x")
        await r.execute_command("SCRIPT", "FLUSH")
        call = Call("drop_inbox", (f"{ns}:a", f"{ns}:b", f"{ns}:c"), (), lambda x: x)
        got = await asyncio.gather(
            *(call.run(auto) for _ in range(1000)),
            *(auto.execute_command("ECHO", i) for i in range(1000)),
        )
        assert got[:1000] == [got[0]] * 1000
        assert got[1000:] == [str(i).encode() for i in range(1000)]
        assert (await r.execute_command("SCRIPT", "EXISTS", script("drop_inbox").sha))[0]
        assert pool_connections(client) == 1  # the scripts were loaded on it too
    finally:
        await auto.aclose()


async def test_callers_cancelled_before_the_write_send_nothing(
    auto: AutoPipeline, r: AnyRedis, ns: str
) -> None:
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(auto.execute_command("INCRBY", f"{ns}:c:{i}", 1)) for i in range(500)]
    for t in tasks[::2]:
        t.cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(x, asyncio.CancelledError) for x in done[::2])
    assert done[1::2] == [1] * 250
    got = await r.execute_command("MGET", *(f"{ns}:c:{i}" for i in range(500)))
    assert got[::2] == [None] * 250 and got[1::2] == [b"1"] * 250


async def test_in_flight_commands_are_bounded(redis_url: str, ns: str) -> None:
    client = await connect(redis_url)
    auto = AutoPipeline(client, max_batch=16, max_in_flight=64)
    assert auto._mux is not None
    peak = 0
    stop = False

    async def watch() -> None:
        nonlocal peak
        assert auto._mux is not None
        while not stop:
            peak = max(peak, len(auto._mux.inflight))
            await asyncio.sleep(0)

    try:
        watcher = asyncio.get_running_loop().create_task(watch())
        got = await asyncio.gather(*(auto.execute_command("ECHO", i) for i in range(5000)))
        stop = True
        await watcher
        assert got == [str(i).encode() for i in range(5000)]
        assert 16 <= peak <= 64
        assert auto.batches >= 5000 // 16
    finally:
        await auto.aclose()


async def test_redis_killed_with_calls_in_flight_every_caller_gets_an_answer(
    fresh_redis: RedisServer, ns: str
) -> None:
    client = await connect(fresh_redis.url)
    auto = AutoPipeline(client)
    outcomes: dict[str, int] = {"ok": 0, "error": 0}
    stop = asyncio.Event()
    sent = 0

    async def load(w: int) -> None:
        nonlocal sent
        i = 0
        while not stop.is_set():
            i += 1
            sent += 1
            try:
                got = await auto.execute_command("ECHO", f"{w}:{i}")
            except (rexc.ConnectionError, rexc.TimeoutError):
                outcomes["error"] += 1
                await asyncio.sleep(0.01)
            else:
                assert got == f"{w}:{i}".encode()  # never another caller's reply
                outcomes["ok"] += 1

    try:
        with anyio.fail_after(60):  # no caller may hang
            async with anyio.create_task_group() as tg:
                for w in range(200):
                    tg.start_soon(load, w)
                await asyncio.sleep(0.3)
                assert outcomes["ok"] > 0 and auto._mux is not None
                while not auto._mux.inflight:  # kill it with commands written, unanswered
                    await asyncio.sleep(0)
                await anyio.to_thread.run_sync(fresh_redis.kill)  # SIGKILL, calls in flight
                await asyncio.sleep(0.5)
                errors_while_down = outcomes["error"]
                await anyio.to_thread.run_sync(fresh_redis.start)
                ok_before = outcomes["ok"]
                with anyio.fail_after(20):
                    while outcomes["ok"] < ok_before + 1000:
                        await asyncio.sleep(0.05)
                stop.set()
        assert errors_while_down > 0
        assert outcomes["ok"] + outcomes["error"] == sent  # every call answered
        assert await auto.set(f"{ns}:after", "1") and await auto.get(f"{ns}:after") == b"1"
        assert pool_connections(client) == 1
    finally:
        await auto.aclose()


async def test_a_sentinel_failover_sends_the_commands_to_the_new_master(
    redis_sentinel: RedisTestSentinel, ns: str
) -> None:
    client = await connect(redis_sentinel.url)
    auto = AutoPipeline(client)
    assert auto.multiplexed
    outcomes: dict[str, int] = {"ok": 0, "error": 0}
    stop = asyncio.Event()
    sent = 0

    async def load(w: int) -> None:
        nonlocal sent
        i = 0
        while not stop.is_set():
            i += 1
            sent += 1
            try:
                got = await auto.execute_command("ECHO", f"{w}:{i}")
            except (rexc.ConnectionError, rexc.TimeoutError):
                outcomes["error"] += 1
                await asyncio.sleep(0.05)
            else:
                assert got == f"{w}:{i}".encode()
                outcomes["ok"] += 1
            await asyncio.sleep(0.01)

    try:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for w in range(50):
                    tg.start_soon(load, w)
                await asyncio.sleep(0.3)
                old = await anyio.to_thread.run_sync(redis_sentinel.kill_master)
                new = await anyio.to_thread.run_sync(redis_sentinel.wait_failover, old)
                ok_before = outcomes["ok"]
                with anyio.fail_after(30):
                    while outcomes["ok"] < ok_before + 500:
                        await asyncio.sleep(0.05)
                stop.set()
        assert outcomes["ok"] + outcomes["error"] == sent  # every call answered
        # the multiplexed connection now talks to the promoted replica
        role = await auto.execute_command("ROLE")
        assert role[0] in (b"master", "master")
        assert await auto.set(f"{ns}:k", "v")
        mux = auto._mux
        assert mux is not None and mux.conn.port == new
        assert pool_connections(client) == 1
    finally:
        await auto.aclose()


async def test_multiplex_false_keeps_the_pipelines(redis_url: str, ns: str) -> None:
    client = await connect(redis_url)
    auto = AutoPipeline(client, multiplex=False, max_pipelines=2)
    try:
        assert not auto.multiplexed
        got = await asyncio.gather(*(auto.execute_command("ECHO", i) for i in range(2000)))
        assert got == [str(i).encode() for i in range(2000)]
        assert pool_connections(client) <= 2
    finally:
        await auto.aclose()


async def test_a_reply_slower_than_the_socket_timeout_fails_its_callers_not_forever(
    fresh_redis: RedisServer, ns: str
) -> None:
    # A script busy for 1.2 s on a connection whose replies may take 0.4 s: the commands in
    # flight behind it are retried once (the Retry policy: retry_on_timeout), then get the
    # TimeoutError; none waits for ever, and the connection serves again afterwards.
    client = await connect(f"{fresh_redis.url}?socket_timeout=0.4")
    auto = AutoPipeline(client)
    busy = "local t = redis.call('TIME'); local s = t[1] + t[2] / 1e6 " + (
        "repeat local n = redis.call('TIME') until n[1] + n[2] / 1e6 - s > 1.2 return 1"
    )
    try:
        assert await auto.set(f"{ns}:k", "v")
        with anyio.fail_after(20):
            got = await asyncio.gather(
                auto.eval(busy, 0),
                *(auto.get(f"{ns}:k") for _ in range(100)),
                return_exceptions=True,
            )
        assert isinstance(got[0], rexc.TimeoutError)
        assert all(x == b"v" or isinstance(x, rexc.TimeoutError) for x in got[1:]), got
        with anyio.fail_after(20):
            while True:  # the server may still run the resent script
                try:
                    assert await auto.get(f"{ns}:k") == b"v"
                    break
                except (rexc.TimeoutError, rexc.ResponseError):
                    await asyncio.sleep(0.2)
        assert pool_connections(client) == 1
    finally:
        await auto.aclose()


async def test_an_idle_connection_goes_back_to_the_pool(redis_url: str, ns: str) -> None:
    # A Client over a shared client only drains its auto-pipeline: an idle one must not
    # keep a connection (or tasks) for ever.
    client = await connect(redis_url)
    pool = client.connection_pool  # type: ignore[attr-defined]
    auto = AutoPipeline(client)
    try:
        assert await auto.set(f"{ns}:k", "v")
        assert len(pool._in_use_connections) == 1
        await asyncio.sleep(IDLE_RELEASE_S + 0.5)
        mux = auto._mux
        assert mux is not None and mux.conn is None and mux.reader is None
        assert mux.writer is not None and mux.writer.done()
        assert len(pool._in_use_connections) == 0 and pool_connections(client) == 1
        # taken again by the next command
        assert await asyncio.gather(*(auto.get(f"{ns}:k") for _ in range(100))) == [b"v"] * 100
        assert len(pool._in_use_connections) == 1 and pool_connections(client) == 1
    finally:
        await auto.aclose()


async def test_a_graceful_sentinel_failover_moves_the_held_connection(
    redis_sentinel: RedisTestSentinel, ns: str
) -> None:
    # SENTINEL FAILOVER leaves the old master up: the connection, held while commands keep
    # coming (never idle long enough to go back to the pool), must still move to the new
    # master within seconds.
    d = redis_sentinel
    client = await connect(d.url)
    auto = AutoPipeline(client)
    sentinel = aredis.Redis(port=d.sentinels[0].port)
    try:
        assert await auto.set(f"{ns}:before", 1)
        old = d.master.port
        await sentinel.execute_command("SENTINEL", "FAILOVER", d.service)  # type: ignore[no-untyped-call]
        new = await anyio.to_thread.run_sync(lambda: d.wait_failover(old, timeout_s=20))
        newc = aredis.Redis(port=new)
        try:
            i = 0
            with anyio.fail_after(10):
                while True:
                    i += 1
                    try:
                        await auto.set(f"{ns}:w{i}", 1)
                    except (rexc.ConnectionError, rexc.TimeoutError):
                        pass
                    if await newc.exists(f"{ns}:w{i}"):
                        break
                    await asyncio.sleep(0.05)  # never idle for IDLE_RELEASE_S
            assert auto._mux is not None and auto._mux.conn.port == new
        finally:
            await newc.aclose()
    finally:
        await sentinel.aclose()
        await auto.aclose()


def test_one_auto_pipeline_in_a_second_event_loop_does_not_hang(redis_url: str, ns: str) -> None:
    # redis-py's connections belong to the event loop that opened them, so a client kept
    # across asyncio.run() calls fails in the next loop (pipelines too): each call there
    # must still get an answer or an error, not wait on the first loop's tasks.
    holder: list[AutoPipeline] = []

    async def first() -> Any:
        holder.append(AutoPipeline(await connect(redis_url)))
        return await asyncio.gather(*(holder[0].set(f"{ns}:{i}", 1) for i in range(50)))

    assert asyncio.run(first()) == [True] * 50

    async def second() -> list[Any]:
        return await asyncio.gather(
            *(holder[0].get(f"{ns}:{i}") for i in range(50)), return_exceptions=True
        )

    got = asyncio.run(asyncio.wait_for(second(), 10))
    assert len(got) == 50 and all(x == b"1" or isinstance(x, Exception) for x in got)

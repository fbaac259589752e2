"""The Client under load and under attack (issue 9, items 4, 5, 6, 7 and 12).

* many calls at once share a bounded number of connections (no "Too many connections");
* ``result()`` of a reply the reader already holds;
* an agent's ``max_queue`` is exact, however many senders race for it;
* replies nobody waits for are bounded, and no reply entry or reply key can stop the
  reader;
* a Redis outage is a few log lines, not ten a second.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY
from redis import exceptions as rexc

from reach import Agent, Context
from reach.client import Client, NotStarted
from reach.connection import (
    AnyRedis,
    ConnectionsExhausted,
    connect,
    pool_connections,
    unreachable,
)
from reach.embedded import RedisServer
from reach.envelope import Reply, encode, encode_payload
from reach.errors import Overloaded, ReachError, RedisUnavailable
from reach.keys import Keys
from reach.registry import Registry
from tests.support.agents_messaging import serving, wait_eligible
from tests.support.cluster import RedisTestCluster
from tests.support.registry_helpers import register
from tests.support.sentinel import RedisTestSentinel
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio


def echo_agent(agent_id: str = "echo-h1") -> Agent:
    app = Agent(agent_id, capabilities=["test.echo"])

    @app.handler("test.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return payload

    return app


async def named_connections(r: AnyRedis, name: str) -> int:
    """Connections Redis has open under the client name ``name`` (one server)."""
    return sum(1 for c in await r.client_list() if c.get("name") == name)


def reply_entry(msg_id: str, result: Any = "ok") -> dict[str, bytes]:
    return {"r": encode(Reply(msg_id=msg_id, status="succeeded", result=encode_payload(result)))}


# -- item 4: any number of calls, a bounded number of connections --------------------------
async def test_hundreds_of_requests_at_once_share_a_bounded_pool(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, echo_agent(), concurrency=64) as warm:
        assert warm is not None
        async with Client(
            redis_url=redis_url, namespace=ns, max_connections=8, client_id="many-1"
        ) as client:
            await wait_eligible(client, "test.echo", ["echo-h1"])
            peak = 0
            done = anyio.Event()

            async def watch() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, await named_connections(r, f"reach:{ns}:many-1"))
                    await anyio.sleep(0.01)

            results: dict[int, Any] = {}

            async def one(i: int) -> None:
                results[i] = await client.request("test.echo", i, timeout_s=60)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                async with anyio.create_task_group() as calls:
                    for i in range(300):
                        calls.start_soon(one, i)
                    for i in range(300, 400):  # and fire-and-forget sends beside them
                        calls.start_soon(client.send, "test.echo", i)
                done.set()
            assert results == {i: i for i in range(300)}
            assert 1 <= peak <= 8
            assert pool_connections(client.redis) <= 8


async def test_callers_cancelled_while_waiting_for_a_connection_lose_no_turn(
    redis_url: str, ns: str
) -> None:
    r = await connect(redis_url, max_connections=2)
    key = Keys(ns).effects("waiting")
    try:
        done = 0

        async def one(i: int) -> None:
            nonlocal done
            # two in three give up after a few ms, most of them while queued
            with anyio.move_on_after(None if i % 3 == 0 else (i % 7) * 0.001):
                await r.incr(key)
                done += 1

        async with anyio.create_task_group() as tg:
            for i in range(2_000):
                tg.start_soon(one, i)
        assert 0 < done < 2_000 and int(await r.get(key) or 0) >= done  # some were cancelled
        with anyio.fail_after(10):  # nobody is left waiting for a turn that never comes
            async with anyio.create_task_group() as tg:
                for _ in range(200):
                    tg.start_soon(r.incr, key)
        assert pool_connections(r) <= 2
        assert not r.connection_pool._waiters
    finally:
        await r.aclose()


async def test_a_pool_that_stays_busy_is_not_reported_as_an_unreachable_redis(
    redis_url: str, ns: str
) -> None:
    r = await connect(redis_url, max_connections=1)
    try:
        r.connection_pool.timeout = 0.2  # the real wait is a generous POOL_WAIT_S
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: r.xread({Keys(ns).events: "$"}, block=1500))  # holds it
            await anyio.sleep(0.1)
            with pytest.raises(rexc.ConnectionError) as caught:
                await r.ping()
        err = unreachable(redis_url, caught.value)
        assert isinstance(err, ConnectionsExhausted) and isinstance(err, RedisUnavailable)
        assert "Cannot reach" not in str(err) and "max_connections" in str(err)
    finally:
        await r.aclose()
    err = unreachable(redis_url, rexc.MaxConnectionsError("Too many connections"))
    assert isinstance(err, ConnectionsExhausted)
    assert "Cannot reach" in str(unreachable(redis_url, rexc.ConnectionError("refused")))


async def test_a_cluster_client_waits_for_a_connection_instead_of_failing(
    redis_cluster: RedisTestCluster,
) -> None:
    rc = await connect(redis_cluster.url, max_connections=4)
    try:
        k = Keys("tcl" + uuid.uuid4().hex[:8])

        async def one(i: int) -> None:
            await rc.incr(k.effects(f"n{i % 7}"))
            pipe = rc.pipeline(transaction=False)
            pipe.incr(k.effects(f"p{i % 5}"))
            pipe.incr(k.effects(f"q{i % 3}"))
            await pipe.execute()

        async with anyio.create_task_group() as tg:
            for i in range(500):
                tg.start_soon(one, i)
        totals = [int(await rc.get(k.effects(f"n{j}")) or 0) for j in range(7)]
        assert sum(totals) == 500
        for node in rc.get_nodes():
            assert len(node._connections) <= 4
    finally:
        await rc.aclose()


async def test_a_sentinel_client_waits_for_a_connection_instead_of_failing(
    redis_sentinel: RedisTestSentinel,
) -> None:
    rs = await connect(redis_sentinel.url, max_connections=3, client_name="sentinel-pool")
    try:
        k = Keys("ts" + uuid.uuid4().hex[:8])

        async def one(i: int) -> None:
            await rs.incr(k.effects("n"))

        async with anyio.create_task_group() as tg:
            for i in range(300):
                tg.start_soon(one, i)
        assert int(await rs.get(k.effects("n"))) == 300
        assert pool_connections(rs) <= 3
        assert await named_connections(rs, "sentinel-pool") <= 3
    finally:
        await rs.aclose()


# -- item 5: result() of a reply the reader already holds ----------------------------------
async def test_result_of_a_reply_already_read(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, echo_agent(), client_id="res-1") as client:
        assert await client.request("test.echo", 1) == 1  # the reader runs
        env = client.build("test.echo", {"x": 1})  # a reply wanted, nobody waiting yet
        await client.deliver(env)
        await wait_until(lambda: _has(client, env.msg_id), what="the reply read")
        assert await client.result(env.msg_id, timeout_s=5) == {"x": 1}
        # answered: deleted from the stream with the next batch
        await wait_until(
            lambda: _stream_lacks(r, Keys(ns).replies("res-1"), env.msg_id),
            what="the answered reply deleted",
        )


async def _has(client: Client, msg_id: str) -> bool:
    return msg_id in client._replies


async def _stream_lacks(r: AnyRedis, key: str, msg_id: str) -> bool:
    return all(msg_id.encode() not in f[b"r"] for _, f in await r.xrange(key))


# -- item 6: an exact queue bound ----------------------------------------------------------
@pytest.fixture
async def bounded_agents(redis_url: str, ns: str, r: AnyRedis) -> AsyncIterator[Registry]:
    """A registry where the tests register agents that never read their inbox."""
    yield Registry(r, ns)


async def fire_sends(client: Client, n: int, **kw: Any) -> tuple[list[str], list[Exception]]:
    sent: list[str] = []
    refused: list[Exception] = []

    async def one(i: int) -> None:
        try:
            sent.append(await client.send("test.bounded", {"i": i}, **kw))
        except Overloaded as e:
            refused.append(e)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return sent, refused


async def test_max_queue_is_exact_under_concurrent_sends(
    redis_url: str, ns: str, r: AnyRedis, bounded_agents: Registry
) -> None:
    n = 40
    await register(bounded_agents, "full-1", ["test.bounded"], ready=True, max_queue=n)
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.bounded", ["full-1"])
        sent, refused = await fire_sends(client, 5 * n)
        assert len(sent) == n and len(refused) == 4 * n
        assert sum([await r.xlen(s) for s in Keys(ns).inboxes("full-1")]) == n
        assert "full-1 40/40" in str(refused[0]) and "Back off" in str(refused[0])
        # a refused message left no trace: only the accepted ones have a task record
        statuses = {(await client.task(m)).status for m in sent}
        assert statuses == {"pending"}


async def test_a_full_agent_passes_the_message_to_another_one(
    redis_url: str, ns: str, r: AnyRedis, bounded_agents: Registry
) -> None:
    await register(bounded_agents, "full-a", ["test.bounded"], ready=True, max_queue=10)
    await register(bounded_agents, "full-b", ["test.bounded"], ready=True, max_queue=30)
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.bounded", ["full-a", "full-b"])
        sent, refused = await fire_sends(client, 100, priority="high")
        assert len(sent) == 40 and len(refused) == 60
        assert await r.xlen(Keys(ns).inbox("full-a", "high")) == 10
        assert await r.xlen(Keys(ns).inbox("full-b", "high")) == 30
        msg = str(refused[-1])
        assert "full-a 10/10" in msg and "full-b 30/30" in msg
        # a direct send to a full agent has nowhere else to go
        with pytest.raises(Overloaded, match="full-a 10/10"):
            await client.send("test.bounded", 1, target="full-a")


async def test_max_queue_is_exact_on_a_cluster(redis_cluster: RedisTestCluster) -> None:
    ns = "tcl" + uuid.uuid4().hex[:8]
    rc = await connect(redis_cluster.url)
    try:
        await register(Registry(rc, ns), "full-c", ["test.bounded"], ready=True, max_queue=25)
        async with Client(redis_url=redis_cluster.url, namespace=ns) as client:
            await wait_eligible(client, "test.bounded", ["full-c"])
            sent, refused = await fire_sends(client, 100)
            assert len(sent) == 25 and len(refused) == 75
            assert sum([await rc.xlen(s) for s in Keys(ns).inboxes("full-c")]) == 25
            assert {(await client.task(m)).status for m in sent} == {"pending"}
    finally:
        await rc.aclose()


# -- item 7: unsolicited replies are bounded; no entry stops the reader --------------------
DROPPED = "reach_client_replies_dropped_total"


async def test_replies_to_messages_never_sent_are_dropped_and_deleted(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    # A flood of replies this client never asked for costs it no memory: each is dropped,
    # counted and deleted from the stream as it is read (issue 13, item 5).
    key = Keys(ns).replies("flood-0")
    async with (
        serving(redis_url, ns, echo_agent()) as _,
        Client(redis_url=redis_url, namespace=ns, client_id="flood-0") as client,
    ):
        assert await client.request("test.echo", "warm") == "warm"
        before = REGISTRY.get_sample_value(DROPPED, {"reason": "not_sent"}) or 0.0
        last = None
        for start in range(0, 20_000, 2_000):
            pipe = r.pipeline(transaction=False)
            for i in range(start, start + 2_000):
                pipe.xadd(key, reply_entry(f"stray-{i}"))
            last = (await pipe.execute())[-1]
        await wait_until(lambda: _caught_up(client, last), timeout_s=60, what="reader caught up")
        assert client._reader.strays == client.stray_replies == 20_000
        after = REGISTRY.get_sample_value(DROPPED, {"reason": "not_sent"})
        assert after == before + 20_000
        assert not client._replies and not client._unclaimed
        await wait_until(lambda: _xlen_at_most(r, key, 0), timeout_s=30, what="strays deleted")
        assert await client.request("test.echo", "still") == "still"


async def test_unclaimed_replies_are_bounded(redis_url: str, ns: str, r: AnyRedis) -> None:
    # Replies to messages this client did send, read before anyone asks for them (a
    # result() to come), are kept for result(), at most max_unclaimed_replies of them.
    key = Keys(ns).replies("flood-1")
    async with (
        serving(redis_url, ns, echo_agent()) as _,
        Client(
            redis_url=redis_url, namespace=ns, client_id="flood-1", max_unclaimed_replies=500
        ) as client,
    ):
        assert await client.request("test.echo", "warm") == "warm"
        for i in range(30_000):  # as deliver() notes a message sent with reply_to
            client._reader.sent(f"stray-{i}")
        last = None
        for start in range(0, 30_000, 2_000):
            pipe = r.pipeline(transaction=False)
            for i in range(start, start + 2_000):
                pipe.xadd(key, reply_entry(f"stray-{i}"))
            last = (await pipe.execute())[-1]
        await wait_until(lambda: _caught_up(client, last), timeout_s=60, what="reader caught up")
        assert len(client._replies) <= 500 and len(client._unclaimed) <= 500
        # the newest are kept (for result()), the dropped ones deleted from the stream
        assert "stray-29999" in client._replies and "stray-0" not in client._replies
        await wait_until(
            lambda: _xlen_at_most(r, key, 600), timeout_s=30, what="dropped replies deleted"
        )
        assert await client.result("stray-29999", timeout_s=5) == "ok"
        assert await client.request("test.echo", "still") == "still"


async def test_unsolicited_replies_expire(redis_url: str, ns: str, r: AnyRedis) -> None:
    key = Keys(ns).replies("stale-1")
    async with (
        serving(redis_url, ns, echo_agent()) as _,
        Client(
            redis_url=redis_url, namespace=ns, client_id="stale-1", unclaimed_reply_ttl_s=0.3
        ) as client,
    ):
        assert await client.request("test.echo", 1) == 1
        for i in range(10):
            client._reader.sent(f"old-{i}")
            await r.xadd(key, reply_entry(f"old-{i}"))
        await wait_until(lambda: _has(client, "old-9"), what="the replies read")
        await wait_until(lambda: _none_kept(client), timeout_s=10, what="unclaimed replies gone")
        await wait_until(lambda: _xlen_at_most(r, key, 0), timeout_s=10, what="deleted")


async def _caught_up(client: Client, last: Any) -> bool:
    return bool(client._last_reply_id == last)


async def _xlen_at_most(r: AnyRedis, key: str, n: int) -> bool:
    return bool(await r.xlen(key) <= n)


async def _none_kept(client: Client) -> bool:
    return not client._replies and not client._unclaimed


HOSTILE_REPLIES: list[dict[str, Any]] = [
    {"r": b"\xff\xfe not msgpack"},
    {"other": b"no r field"},
    {"r": b""},
    {"r": encode({"msg_id": 5, "status": ["x"]})},  # wrong types
    {"r": encode([1, 2, 3])},
    {"r": b"\x91" * 100_000 + b"\xc0"},  # nested 100,000 levels deep
]


async def test_hostile_reply_entries_are_dropped_and_the_reader_goes_on(
    redis_url: str, ns: str, r: AnyRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="reach.client")
    key = Keys(ns).replies("hostile-1")
    async with serving(redis_url, ns, echo_agent(), client_id="hostile-1") as client:
        assert await client.request("test.echo", 0) == 0
        for fields in HOSTILE_REPLIES:
            await r.xadd(key, fields)
        client._reader.sent("after-the-garbage")  # as if this client had sent it
        await r.xadd(key, reply_entry("after-the-garbage", 7))
        assert await client.result("after-the-garbage", timeout_s=10) == 7
        for i in range(1, 4):
            assert await client.request("test.echo", i) == i
        dropped = [m for m in caplog.messages if "unreadable reply entry" in m]
        assert len(dropped) == len(HOSTILE_REPLIES)
        await wait_until(lambda: _xlen_at_most(r, key, 0), what="garbage deleted")


async def test_a_reply_key_of_the_wrong_type_does_not_kill_the_reader(
    redis_url: str, ns: str, r: AnyRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="reach.client")
    key = Keys(ns).replies("wrongtype-1")
    async with serving(redis_url, ns, echo_agent(), client_id="wrongtype-1") as client:
        assert await client.request("test.echo", 1) == 1
        await r.delete(key)
        await r.set(key, "not a stream")
        await wait_until(lambda: _logged(caplog, "WRONGTYPE"), what="the failed read logged")
        await r.delete(key)
        assert await client.request("test.echo", 2, timeout_s=10) == 2
        assert not client._outage.down
        lines = [m for m in caplog.messages if "reading its replies" in m]
        assert len(lines) == 2, lines  # failed, works again


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in m for m in caplog.messages)


# -- item 12: an outage is a few lines -----------------------------------------------------
async def test_a_redis_outage_is_a_few_log_lines(
    fresh_redis: RedisServer, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reach")
    async with Client(redis_url=fresh_redis.url, namespace=ns, client_id="outage-1") as client:
        client._ensure_reader()
        await anyio.sleep(0.2)  # the reader's first read is in flight
        fresh_redis.kill()
        await wait_until(lambda: _down(client), what="the client saw the outage")
        await anyio.sleep(3.0)  # the outage itself
        await anyio.to_thread.run_sync(fresh_redis.start)
        await wait_until(lambda: _up(client), timeout_s=30, what="the client saw it back")
    mine = [r.getMessage() for r in caplog.records if r.name == "reach.client"]
    assert len(mine) == 2, mine
    assert "reading its replies failed" in mine[0]
    assert "reading its replies works again after" in mine[1]


async def _down(client: Client) -> bool:
    return client._outage.down


async def _up(client: Client) -> bool:
    return not client._outage.down


async def test_a_client_used_before_it_starts_says_how_to_start_it() -> None:
    c = Client(redis_url="redis://127.0.0.1:1", namespace="unstarted")
    with pytest.raises(NotStarted, match="async with reach.Client") as ei:
        await c.send("text.summarize", {})
    assert isinstance(ei.value, ReachError) and isinstance(ei.value, RuntimeError)
    with pytest.raises(NotStarted):
        c._ensure_reader()

"""Client.send_many and Client.request_many (issue 11, item 2): routed per message, the
inbox writes of a batch in one pipeline, each message's error in its own place; standalone
and Cluster, bounded and unbounded inboxes."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from redis.exceptions import ResponseError

from reach import Agent, Context
from reach._sending.delivery import SEND_CHUNK
from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.envelope import decode_envelope, scoped_key
from reach.errors import (
    ConfigError,
    NoAgentAvailable,
    Overloaded,
    PayloadTooLarge,
    RemoteError,
)
from reach.keys import Keys
from reach.registry import Registry
from tests.support.agents_messaging import bump, effects, serving, wait_eligible
from tests.support.cluster import RedisTestCluster
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio


def batch_app(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=["test.batch"])

    @app.handler("test.batch")
    async def handle(payload: Any, ctx: Context) -> dict[str, Any]:
        await bump(ctx, "batch")
        if isinstance(payload, int) and payload % 7 == 3:
            raise ValueError(f"no {payload}")
        return {"n": payload, "agent": ctx.agent_id}

    return app


async def handled(r: AnyRedis, ns: str, n: int) -> dict[str, int]:
    async def enough() -> dict[str, int] | None:
        done = await effects(r, ns, "batch")
        return done if sum(done.values()) >= n else None

    return await wait_until(enough, timeout_s=30, what=f"{n} messages handled")


async def test_send_many_routes_each_message_and_reports_each_error(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, batch_app("b-1"), batch_app("b-2")) as client:
        client.max_payload_bytes = 10_000
        before = client.commands.batches
        payloads: list[Any] = [i * 7 for i in range(40)]  # none fails in the handler
        payloads[5] = "x" * (client.max_payload_bytes + 1)  # too large: not sent
        out = await client.send_many("test.batch", payloads, priority="high")
        writes = client.commands.batches - before
        assert isinstance(out[5], PayloadTooLarge)
        sent = [x for i, x in enumerate(out) if i != 5]
        assert all(isinstance(x, str) for x in sent) and len(set(sent)) == 39
        # The 39 sends went out together, one call per agent, not one write each: the
        # quotas' and splits' read and the two calls are at most four writes (a burst's
        # first command goes out alone when nothing is in flight, reach._autopipe.mux), and
        # a view refresh may add one.
        assert writes <= 5
        done = await handled(r, ns, 39)
        assert set(done) == set(sent) and set(done.values()) == {1}
        statuses = {(await client.task(m)).status for m in sent if isinstance(m, str)}
        assert statuses == {"succeeded"}


async def test_send_many_spreads_the_messages_over_the_agents(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    reg = Registry(r, ns)
    for agent_id in ("idle-a", "idle-b"):  # agents that never read their inbox
        await register(reg, agent_id, ["test.idle"], ready=True)
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.idle", ["idle-a", "idle-b"])
        out = await client.send_many("test.idle", range(100))
        assert all(isinstance(x, str) for x in out)
        keys = Keys(ns)
        depth = {a: await r.xlen(keys.inbox(a, "normal")) for a in ("idle-a", "idle-b")}
        assert sum(depth.values()) == 100 and all(depth.values()), depth


async def test_request_many_returns_each_result_or_error_in_order(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, batch_app("b-1"), batch_app("b-2")) as client:
        out = await client.request_many("test.batch", range(30), timeout_s=30)
        for i, x in enumerate(out):
            if i % 7 == 3:
                assert isinstance(x, RemoteError) and f"no {i}" in str(x)
            else:
                assert x["n"] == i
        assert {x["agent"] for x in out if isinstance(x, dict)} == {"b-1", "b-2"}
        assert not client._events  # every call is over
        # and a lone request afterwards is answered as ever
        assert (await client.request("test.batch", 1))["n"] == 1


async def test_idempotency_keys_are_per_message(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, batch_app("b-1")) as client:
        keys = [f"k{i}" for i in range(10)]
        payloads = [i * 7 for i in range(10)]  # none fails in the handler
        first = await client.request_many("test.batch", payloads, idempotency_keys=keys)
        again = await client.request_many("test.batch", payloads, idempotency_keys=keys)
        assert [x["n"] for x in first] == [x["n"] for x in again] == payloads
        assert set((await effects(r, ns, "batch")).values()) == {1}  # each key handled once
        with pytest.raises(ConfigError, match="one key"):
            await client.send_many("test.batch", range(3), idempotency_keys=["a"])
        with pytest.raises(ConfigError, match="idempotency_keys"):
            await client.send_many("test.batch", range(3), idempotency_key="a")
        with pytest.raises(ConfigError, match="priority"):
            await client.send_many("test.batch", range(3), priority="urgent")
        assert await client.send_many("test.batch", []) == []


async def test_no_agent_is_an_error_per_message(redis_url: str, ns: str) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        out = await client.send_many("test.nobody", range(3))
        assert len(out) == 3 and all(isinstance(x, NoAgentAvailable) for x in out)
        out = await client.request_many("test.nobody", range(3), timeout_s=5)
        assert all(isinstance(x, NoAgentAvailable) for x in out)
        assert not client._events


async def test_full_inboxes_refuse_exactly_their_bound(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    reg = Registry(r, ns)
    await register(reg, "full-a", ["test.bounded"], ready=True, max_queue=10)
    await register(reg, "full-b", ["test.bounded"], ready=True, max_queue=30)
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.bounded", ["full-a", "full-b"])
        out = await client.send_many("test.bounded", range(100))
        sent = [x for x in out if isinstance(x, str)]
        refused = [x for x in out if isinstance(x, Overloaded)]
        assert len(sent) == 40 and len(refused) == 60
        keys = Keys(ns)
        assert await r.xlen(keys.inbox("full-a", "normal")) == 10
        assert await r.xlen(keys.inbox("full-b", "normal")) == 30
        assert {(await client.task(m)).status for m in sent} == {"pending"}


async def test_a_batch_of_many_chunks_keeps_order_bounds_and_errors_per_message(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    """More messages than one chunk (SEND_CHUNK: the next chunk is encoded while Redis runs
    the one before): the inbox holds them in the order given, each fresh record claimed at
    send, the bound refuses exactly the messages past it wherever the chunks split, and a
    message whose record key holds the wrong type fails alone."""
    n = 3 * SEND_CHUNK + 5
    reg = Registry(r, ns)
    _, instance, _ = await register(reg, "chunky", ["test.chunks"], ready=True)
    await register(reg, "bounded", ["test.bounded"], ready=True, max_queue=SEND_CHUNK + 7)
    keys = Keys(ns)
    idem = [f"k{i}" for i in range(n)]
    await r.set(keys.idem(scoped_key("test.chunks", idem[SEND_CHUNK + 1])), "not a hash")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.chunks", ["chunky"])
        await wait_eligible(client, "test.bounded", ["bounded"])
        out = await client.send_many("test.chunks", range(n))
        assert all(isinstance(x, str) for x in out)
        inbox = keys.inbox("chunky", "normal")
        entries = await r.xrange(inbox)
        assert [decode_envelope(f[b"e"]).msg_id for _, f in entries] == out  # in order
        assert {f[b"c"] for _, f in entries} == {f"chunky/{instance}".encode()}
        await r.delete(inbox)
        out = await client.send_many("test.chunks", range(n), idempotency_keys=idem)
        bad = out[SEND_CHUNK + 1]
        assert isinstance(bad, ResponseError) and "want a hash" in str(bad), bad
        sent = [x for i, x in enumerate(out) if i != SEND_CHUNK + 1]
        assert all(isinstance(x, str) for x in sent), [x for x in sent if not isinstance(x, str)]
        entries = await r.xrange(inbox)
        assert sorted(decode_envelope(f[b"e"]).msg_id for _, f in entries) == sorted(sent)
        out = await client.send_many("test.bounded", range(n))
        assert all(isinstance(x, str) for x in out[: SEND_CHUNK + 7])
        assert all(isinstance(x, Overloaded) for x in out[SEND_CHUNK + 7 :])
        assert await r.xlen(keys.inbox("bounded", "normal")) == SEND_CHUNK + 7


@pytest.mark.cluster
async def test_send_many_and_request_many_on_a_cluster(redis_cluster: RedisTestCluster) -> None:
    ns = "tbc" + uuid.uuid4().hex[:8]
    url = redis_cluster.url
    rc = await connect(url)
    try:
        await register(Registry(rc, ns), "full-c", ["test.bounded"], ready=True, max_queue=25)
        async with serving(url, ns, batch_app("c-1"), batch_app("c-2")) as client:
            out = await client.request_many("test.batch", range(40), timeout_s=30)
            assert [x["n"] for x in out if isinstance(x, dict)] == [
                i for i in range(40) if i % 7 != 3
            ]
            sent = await client.send_many("test.batch", [7 * i for i in range(40)])
            assert all(isinstance(x, str) for x in sent)

            async def all_succeeded() -> bool:
                got = {(await client.task(m)).status for m in sent if isinstance(m, str)}
                return got == {"succeeded"}

            await wait_until(all_succeeded, timeout_s=30, what="the sends handled")
            await wait_eligible(client, "test.bounded", ["full-c"])
            bounded = await client.send_many("test.bounded", range(60), idempotency_keys=None)
            ok = [x for x in bounded if isinstance(x, str)]
            assert len(ok) == 25 and sum(isinstance(x, Overloaded) for x in bounded) == 35
            assert {(await client.task(m)).status for m in ok} == {"pending"}
    finally:
        await rc.aclose()

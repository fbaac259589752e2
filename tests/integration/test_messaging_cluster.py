"""The whole send → consume → ack → reply path on the 3-master test cluster, and across a
SIGKILL + restart of a Redis with AOF.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import reach
from reach import Agent, Context
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.keys import GROUP, Keys
from tests.support.agents_messaging import Gate, bump, effects, serving, wait_status, wait_until
from tests.support.cluster import RedisTestCluster

pytestmark = pytest.mark.anyio


def echo_app(agent_id: str, gate: Gate | None = None) -> Agent:
    app = Agent(agent_id, capabilities=["test.echo", "test.flaky", "test.hold"])

    @app.handler("test.echo")
    async def echo(payload: Any, ctx: Context) -> dict[str, Any]:
        await bump(ctx, "echo")
        return {"echo": payload, "agent": ctx.agent_id}

    @app.handler("test.flaky")
    async def flaky(payload: Any, ctx: Context) -> int:
        if await bump(ctx, "flaky") == 1:
            raise RuntimeError("first attempt fails")
        return int(ctx.attempt)

    @app.handler("test.hold")
    async def hold(payload: Any, ctx: Context) -> str:
        assert gate is not None
        await gate.hold()
        await bump(ctx, "hold")
        return "held"

    return app


async def inbox_settled(r: AnyRedis, ns: str, agent_ids: list[str]) -> bool:
    keys = Keys(ns)
    for a in agent_ids:
        for k in keys.inboxes(a):
            if await r.xlen(k) or int((await r.xpending(k, GROUP))["pending"]):
                return False
    return True


@pytest.mark.cluster
async def test_send_consume_ack_reply_on_a_cluster(
    redis_cluster: RedisTestCluster, ns: str
) -> None:
    url = redis_cluster.url
    r = await connect(url)
    agents = [echo_app("c-agent-1"), echo_app("c-agent-2")]
    try:
        async with serving(url, ns, *agents) as client:
            results = []
            async with anyio.create_task_group() as tg:

                async def one(i: int) -> None:
                    results.append(
                        await client.request(
                            "test.echo", i, timeout_s=15, priority=("high", "normal", "low")[i % 3]
                        )
                    )

                for i in range(30):
                    tg.start_soon(one, i)
            assert sorted(x["echo"] for x in results) == list(range(30))
            assert {x["agent"] for x in results} == {"c-agent-1", "c-agent-2"}

            # fire-and-forget + status, a retry through the delayed set, an idempotent repeat
            msg_id = await client.send("test.echo", "ff")
            await wait_status(client, msg_id, "succeeded")
            assert await client.request("test.flaky", None, timeout_s=15) == 2
            a = await client.request("test.echo", "k", idempotency_key="c-key", timeout_s=15)
            b = await client.request("test.echo", "k", idempotency_key="c-key", timeout_s=15)
            assert a == b
            with pytest.raises(reach.NoAgentAvailable):
                await client.request("test.nobody", None, timeout_s=2)
            await wait_until(
                lambda: inbox_settled(r, ns, ["c-agent-1", "c-agent-2"]), what="inboxes empty"
            )
        counts = await effects(r, ns, "echo")
        assert len(counts) == 32 and set(counts.values()) == {1}
        assert counts["c-key"] == 1
    finally:
        await r.aclose()


async def test_messages_survive_a_redis_restart_with_aof(fresh_redis: RedisServer, ns: str) -> None:
    url = fresh_redis.url
    gate = Gate()
    app = echo_app("aof-1", gate)
    async with serving(url, ns, app, concurrency=1) as client:
        out: dict[str, Any] = {}
        held = client.build("test.hold", None, timeout_s=40)
        queued = client.build("test.echo", "sent before the restart", timeout_s=40)

        async def call(name: str, env: Any) -> None:
            out[name] = await client.call(env)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "held", held)
            await gate.entered.wait()  # the only slot is busy: `queued` waits in the inbox
            tg.start_soon(call, "queued", queued)
            await wait_status(client, queued.msg_id, "pending")

            await anyio.to_thread.run_sync(fresh_redis.restart)  # SIGKILL, start again (AOF)
            gate.open()
        assert out == {
            "held": "held",
            "queued": {"echo": "sent before the restart", "agent": "aof-1"},
        }

        # new traffic flows after the restart
        assert (await client.request("test.echo", "after", timeout_s=20))["echo"] == "after"
        assert await client.request("test.flaky", None, timeout_s=20) == 2
        r = await connect(url)
        try:
            await wait_until(lambda: inbox_settled(r, ns, ["aof-1"]), what="inbox empty")
            echo = await effects(r, ns, "echo")
            assert echo[queued.msg_id] == 1 and set(echo.values()) == {1}
            assert await effects(r, ns, "hold") == {held.msg_id: 1}
        finally:
            await r.aclose()

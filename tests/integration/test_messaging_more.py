"""More of issue 3: a restarted caller fetches earlier results; oversized entries at the
consumer; a late duplicate of a completed message does not undo its status."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import reach
from reach import Agent, Context
from reach.client import Client
from reach.envelope import encode
from reach.keys import Keys
from reach.sweeper import expire
from tests.support.agents_messaging import serving, wait_until

pytestmark = pytest.mark.anyio


def echo(agent_id: str = "echo-m") -> Agent:
    app = Agent(agent_id, capabilities=["more.echo"])

    @app.handler("more.echo")
    async def handle(payload: Any, ctx: Context) -> Any:
        return {"echo": payload}

    return app


async def test_a_restarted_caller_gets_results_of_earlier_messages(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, echo()) as c:
        # A caller that sends, then goes away before the reply is read...
        async with Client(redis_url=redis_url, namespace=ns, client_id="caller-7") as gone:
            env = gone.build("more.echo", 41)
            await gone.deliver(env)
        sent = await c.send("more.echo", 42)
        # ... and comes back with the same client id: the reply waited in its stream.
        async with Client(redis_url=redis_url, namespace=ns, client_id="caller-7") as back:
            assert await back.result(env.msg_id, timeout_s=10) == {"echo": 41}
            # A fire-and-forget send has its outcome in the task record.
            assert await back.result(sent, timeout_s=10) == {"echo": 42}
            with pytest.raises(reach.DeadlineExceeded):
                await back.result("no-such-message", timeout_s=0.3)


async def test_oversized_entry_is_dead_lettered_by_the_consumer(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, echo(), max_envelope_bytes=10_000) as c:
        keys = Keys(ns)
        big = c.build("more.echo", "x" * 20_000)  # the client's own limit is 1 MiB
        await c.redis.xadd(keys.inbox("echo-m", "normal"), {"e": encode(big)})
        dead = await wait_until(lambda: c.redis.xrange(keys.dlq("_malformed")), what="dead letter")
        assert dead[0][1][b"reason"] == b"too_large"
        assert await c.request("more.echo", 1, timeout_s=10) == {"echo": 1}  # it goes on
        assert await c.redis.xlen(keys.inbox("echo-m", "normal")) == 0


async def test_late_duplicate_of_a_completed_message_keeps_its_status(
    redis_url: str, ns: str
) -> None:
    async with serving(redis_url, ns, echo()) as c:
        keys = Keys(ns)
        assert await c.request("more.echo", 5, idempotency_key="k-5", timeout_s=10) == {"echo": 5}
        dup = c.build("more.echo", 5, idempotency_key="k-5", timeout_s=0.01)
        await anyio.sleep(0.02)  # its deadline passes while it waits somewhere
        await expire(c.redis, keys, dup, reason="expired", error="deadline passed while parked")
        assert await c.redis.hget(keys.idem(dup.key), "status") == b"succeeded"
        assert await c.redis.xlen(keys.dlq("more.echo")) == 0


async def test_pending_entry_deleted_under_the_consumer_is_cleared(
    redis_url: str, ns: str, r: Any
) -> None:
    """A pending entry whose stream entry was deleted (moved by the sweeper while its
    agent held it) leaves only a pending reference: the pending scan clears it."""
    keys = Keys(ns)
    inbox = keys.inbox("echo-m", "low")
    await r.xgroup_create(inbox, "reach", id="0", mkstream=True)
    entry = await r.xadd(inbox, {"e": b"about to vanish"})
    # Read it as the agent's consumer (now pending for echo-m), then delete the entry.
    await r.xreadgroup("reach", "echo-m", {inbox: ">"}, count=1)
    await r.xdel(inbox, entry)
    assert (await r.xpending(inbox, "reach"))["pending"] == 1
    async with serving(redis_url, ns, echo(), pending_scan_s=0.2) as c:

        async def cleared() -> bool:
            return (await c.redis.xpending(inbox, "reach"))["pending"] == 0

        await wait_until(cleared, what="the ghost pending entry cleared")
        assert await c.redis.xlen(keys.dlq("_malformed")) == 0  # not a dead letter
        assert await c.request("more.echo", 2, timeout_s=10) == {"echo": 2}

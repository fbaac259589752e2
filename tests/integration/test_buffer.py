"""A Client's outage buffer against a real Redis that goes away: its bounds raise at once,
a held request is told at its deadline, pending_local() lists what waits, and what was
held is sent when Redis is back (an in-process agent handles it)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import anyio
import pytest

from reach import Agent, Client, Context, DeadlineExceeded, PendingLocal, RedisUnavailable
from reach.embedded import RedisServer
from reach.keys import Keys
from tests.support.agents_messaging import FAST, wait_eligible

pytestmark = pytest.mark.anyio

CAP = "test.held"


async def test_bounds_deadline_and_listing_while_redis_is_away(
    fresh_redis: RedisServer, ns: str
) -> None:
    async with Client(
        redis_url=fresh_redis.url, namespace=ns, buffer_max_messages=4, buffer_max_age_s=60
    ) as c:
        await c.registry.get("nobody")  # connected
        assert c.pending_local() == []
        await anyio.to_thread.run_sync(fresh_redis.kill)
        t0 = now = time.time()
        ids = [await c.send(CAP, {"i": i}, timeout_s=30) for i in range(3)]
        recs = c.pending_local()
        assert [r.msg_id for r in recs] == ids
        r0 = recs[0]
        assert isinstance(r0, PendingLocal) and r0.capability == CAP and not r0.reply
        assert t0 * 1000 - 1000 <= r0.queued_ms <= time.time() * 1000
        assert r0.deadline_ms == r0.expires_ms and r0.deadline_ms >= now * 1000 + 29_000

        # A held request counts too; it is told at its deadline, and leaves the buffer.
        t = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="never sent"):
            await c.request(CAP, {"i": "r"}, timeout_s=0.5)
        assert 0.4 <= time.monotonic() - t < 5
        assert len(c.pending_local()) == 3

        await c.send(CAP, {"i": 3})  # the 4th: the bound
        t = time.monotonic()
        with pytest.raises(RedisUnavailable, match="buffer_max_messages=4"):
            await c.send(CAP, {"i": 4})
        assert time.monotonic() - t < 0.5, "over the bound: raised at once"
        assert len(c.pending_local()) == 4


async def test_held_sends_and_a_waiting_request_go_through_once_redis_is_back(
    fresh_redis: RedisServer, ns: str
) -> None:
    seen: list[int] = []
    agent = Agent("held-1", capabilities=[CAP])

    @agent.handler(CAP)
    async def handle(payload: dict[str, int], ctx: Context) -> int:
        seen.append(payload["i"])
        return payload["i"] * 10

    # Leases long enough for the outage: the agent stays live in the registry.
    opts = {**FAST, "heartbeat_s": 1.0, "lease_s": 20.0, "evict_after_s": 40.0}
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: agent.run(redis_url=fresh_redis.url, namespace=ns, **opts))
        async with Client(redis_url=fresh_redis.url, namespace=ns) as c:
            await wait_eligible(c, CAP, ["held-1"])
            assert await c.request(CAP, {"i": 0}, timeout_s=10) == 0
            await anyio.to_thread.run_sync(fresh_redis.kill)
            for i in range(1, 6):
                await c.send(CAP, {"i": i})
            answer: list[int] = []

            async def ask() -> None:
                answer.append(await c.request(CAP, {"i": 6}, timeout_s=30))

            tg.start_soon(ask)
            with anyio.fail_after(10):
                while len(c.pending_local()) < 6:
                    await anyio.sleep(0.01)
            assert [r.reply for r in c.pending_local()] == [False] * 5 + [True]
            await anyio.to_thread.run_sync(fresh_redis.start)
            with anyio.fail_after(60):
                while not answer or len(seen) < 7:
                    await anyio.sleep(0.02)
            assert answer == [60]
            assert c.pending_local() == []
        agent.stop()
    assert seen == [0, 1, 2, 3, 4, 5, 6]


async def test_a_write_that_landed_before_the_drop_runs_once(
    fresh_redis: RedisServer, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops after the write reached Redis, before its answer: the client
    holds the message and writes it again (same msg_id, same key), and the agent runs it
    once; the request is answered once."""
    runs: Counter[str] = Counter()
    agent = Agent("dup-1", capabilities=[CAP])

    @agent.handler(CAP)
    async def handle(payload: dict[str, int], ctx: Context) -> int:
        runs[ctx.msg_id] += 1
        return payload["i"]

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: agent.run(redis_url=fresh_redis.url, namespace=ns, **FAST))
        async with Client(redis_url=fresh_redis.url, namespace=ns) as c:
            await wait_eligible(c, CAP, ["dup-1"])
            # The inbox write both send paths make (the full one and the plain send's fast
            # one, reach._sending): it lands, then the connection drops before its answer.
            coalescer = c._delivery.coalescer
            assert coalescer is not None
            real = coalescer.send
            written: list[str] = []

            async def landed_then_dropped(d: Any) -> Any:
                await real(d)
                written.append(d.message.msg_id)
                raise RedisUnavailable("Cannot reach Redis (the connection dropped after a write)")

            monkeypatch.setattr(coalescer, "send", landed_then_dropped)
            sent = await c.send(CAP, {"i": 1})
            with anyio.fail_after(30):  # flushed: the request goes the direct way too
                while c.pending_local():
                    await anyio.sleep(0.01)
            answer = await c.request(CAP, {"i": 2}, timeout_s=30)
            assert answer == 2
            asked = [m for m in written if m != sent]
            assert written == [sent, *asked] and len(asked) == 1
            assert c._buffer.flushed == 2, "both written a second time, from the buffer"
            r = c.redis
            with anyio.fail_after(30):  # every copy read and settled (entries deleted)
                while sum([await r.xlen(k) for k in Keys(ns).inboxes("dup-1")]) or (
                    (await c.task(sent)).status != "succeeded"
                ):
                    await anyio.sleep(0.02)
        agent.stop()
    assert runs == {sent: 1, asked[0]: 1}

"""Coalesced single sends (reach._sending.coalesce.Coalescer, issue 11): the first send of an
event-loop turn goes out at once as its own send.lua call, the others of the same turn as
one batch-form call per agent; each caller gets its own answer or its own error; a caller
cancelled before its turn ended sends nothing. Counted by Redis (script calls, entries),
never timed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis import exceptions as rexc

from reach._autopipe import AutoPipeline
from reach._sending.coalesce import SENDS_IN_FLIGHT, Coalescer
from reach.connection import AnyRedis, connect
from reach.envelope import Envelope, encode, new_id
from reach.keys import Keys
from reach.scripts import inbox

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


@pytest.fixture
async def commands(redis_url: str) -> AsyncIterator[AutoPipeline]:
    a = AutoPipeline(await connect(redis_url))
    yield a
    await a.aclose()


def delivery(agent_id: str = "co-1", *, max_queue: int = 0) -> inbox.Delivery:
    env = Envelope(msg_id=new_id(), capability="co.work", payload=b"\x01")
    return inbox.Delivery(inbox.Message.of(env, encode(env)), agent_id, "normal", max_queue)


async def script_calls(r: AnyRedis) -> int:
    stats = await r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_sends_of_one_turn_go_out_as_one_call_per_agent_after_the_first(
    commands: AutoPipeline, r: AnyRedis, ns: str
) -> None:
    keys = Keys(ns)
    co = Coalescer(commands, keys, ttl_ms=TTL_MS)
    await co.send(delivery())  # loads the script; a lone send is one call
    before = await script_calls(r)
    items = [delivery("co-1") for _ in range(60)] + [delivery("co-2") for _ in range(40)]
    sent = await asyncio.gather(*(co.send(d) for d in items))
    # the first alone, then one batch call for each of the two agents
    assert await script_calls(r) - before == 3
    assert all(isinstance(s, inbox.Sent) and s.entry_id and not s.refused for s in sent)
    # entry ids are per stream: distinct within each agent's inbox
    assert len({(d.agent_id, s.entry_id) for d, s in zip(items, sent, strict=True)}) == 100
    assert await r.xlen(keys.inbox("co-1", "normal")) == 61
    assert await r.xlen(keys.inbox("co-2", "normal")) == 40
    # each message's record is marked pending, as a lone send marks it
    for d in items[:3] + items[-3:]:
        assert await r.hget(keys.idem(d.message.key), "status") == b"pending"


async def test_a_bad_record_fails_only_its_own_caller(
    commands: AutoPipeline, r: AnyRedis, ns: str
) -> None:
    keys = Keys(ns)
    co = Coalescer(commands, keys, ttl_ms=TTL_MS)
    items = [delivery() for _ in range(10)]
    await r.set(keys.idem(items[5].message.key), "not a hash")  # written behind reach's back
    out = await asyncio.gather(*(co.send(d) for d in items), return_exceptions=True)
    assert isinstance(out[5], rexc.ResponseError)
    assert all(isinstance(x, inbox.Sent) for i, x in enumerate(out) if i != 5)
    assert await r.xlen(keys.inbox("co-1", "normal")) == 9


async def test_the_bound_is_kept_for_coalesced_sends(
    commands: AutoPipeline, r: AnyRedis, ns: str
) -> None:
    keys = Keys(ns)
    co = Coalescer(commands, keys, ttl_ms=TTL_MS)
    out = await asyncio.gather(*(co.send(delivery(max_queue=5)) for _ in range(12)))
    assert sum(1 for s in out if not s.refused) == 5
    assert all(s.depth == 5 for s in out if s.refused)
    assert await r.xlen(keys.inbox("co-1", "normal")) == 5


async def test_a_caller_cancelled_within_its_turn_sends_nothing(
    commands: AutoPipeline, r: AnyRedis, ns: str
) -> None:
    keys = Keys(ns)
    co = Coalescer(commands, keys, ttl_ms=TTL_MS)
    tasks = [asyncio.ensure_future(co.send(delivery())) for _ in range(5)]
    await asyncio.sleep(0)  # each task has queued its message (the first: sent at once)
    tasks[3].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert tasks[3].cancelled()
    assert await r.xlen(keys.inbox("co-1", "normal")) == 4


async def test_sends_issued_while_calls_are_in_flight_wait_and_go_out_as_one_batch(
    commands: AutoPipeline, r: AnyRedis, ns: str
) -> None:
    """With SENDS_IN_FLIGHT calls awaiting Redis (held here by CLIENT PAUSE: scripts wait
    under a WRITE pause), later sends queue, in any number of turns, and go out as one call
    once a call returns: the batches grow with the load instead of being cut at each turn."""
    keys = Keys(ns)
    co = Coalescer(commands, keys, ttl_ms=TTL_MS)
    await co.send(delivery())  # loads the script
    before = await script_calls(r)
    await r.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
    try:
        first = [asyncio.ensure_future(co.send(delivery())) for _ in range(3)]
        while co._in_flight < SENDS_IN_FLIGHT:  # the first alone, the other two as a batch
            await asyncio.sleep(0)
        later: list[asyncio.Future[inbox.Sent]] = []
        for _ in range(5):  # five turns, two sends each, all while both calls wait
            later += [asyncio.ensure_future(co.send(delivery())) for _ in range(2)]
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        assert co._in_flight == SENDS_IN_FLIGHT
        assert len(co._group) == 10
    finally:
        await r.execute_command("CLIENT", "UNPAUSE")
    sent = await asyncio.gather(*first, *later)
    assert all(not s.refused for s in sent)
    # the first alone, the next two together, then the ten queued ones in one call
    assert await script_calls(r) - before == 3
    assert await r.xlen(keys.inbox("co-1", "normal")) == 14

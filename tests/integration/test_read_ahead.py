"""Read-ahead (``RuntimeOptions.prefetch``, issue 11): while handlers are quick, a worker
reads and claims up to ``prefetch`` entries beyond its free handler slots, so the next
batch's read and claim overlap the running handlers; when handlers are slow (a claimed
entry would wait too long for a slot, its claim lease running), or with ``prefetch=0``, it
reads only what its free slots can start. Counted in Redis: the entries the agent has read
and not settled (the consumer group's pending entries) while every handler slot is held.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from reach import Agent, Context
from reach.connection import AnyRedis
from reach.keys import GROUP, Keys
from tests.support.agents_messaging import bump, effects, serving, wait_until

pytestmark = pytest.mark.anyio

CONCURRENCY = 2
HELD = 20


def gated_agent(gate: anyio.Event, entered: list[int]) -> Agent:
    app = Agent("ahead-1", capabilities=["ahead.work"])

    @app.handler("ahead.work")
    async def handle(payload: Any, ctx: Context) -> None:
        if payload == "slow":
            await anyio.sleep(0.2)  # the workload: a handler that takes 0.2 s
        elif payload == "hold":
            entered.append(1)
            await gate.wait()
        await bump(ctx, "ahead")

    return app


async def read_not_settled(r: AnyRedis, ns: str) -> int:
    """Entries of the agent's inboxes read by it and not settled yet."""
    total = 0
    for key in Keys(ns).inboxes("ahead-1"):
        if await r.exists(key):
            total += int((await r.xpending(key, GROUP))["pending"])
    return total


@pytest.mark.parametrize(
    ("warm_up", "prefetch", "ahead"),
    [
        ("quick", 4, True),  # quick handlers: up to 4 read and claimed ahead
        ("slow", 4, False),  # 0.2 s handlers: a claim would wait too long for a slot
        ("quick", 0, False),  # read-ahead off
    ],
)
async def test_a_worker_reads_ahead_only_while_its_handlers_are_quick(
    redis_url: str, ns: str, warm_up: str, prefetch: int, ahead: bool
) -> None:
    # Read ahead in chunks of half the prefetch at least (not an entry per finished
    # handler), so while the slots are held it stops somewhere in (2 + 4 - 2, 2 + 4].
    least = CONCURRENCY + prefetch - prefetch // 2 + 1 if ahead else CONCURRENCY
    gate = anyio.Event()
    entered: list[int] = []
    agent = gated_agent(gate, entered)
    async with serving(redis_url, ns, agent, concurrency=CONCURRENCY, prefetch=prefetch) as client:
        for _ in range(3):  # the handlers' recent run time, which read-ahead is judged by
            await client.request("ahead.work", warm_up, timeout_s=20)
        for _ in range(HELD):
            await client.send("ahead.work", "hold")

        async def slots_held() -> bool:
            return len(entered) >= CONCURRENCY

        await wait_until(slots_held, what="every handler slot held")
        await wait_until(lambda: _at_least(client.redis, ns, least), what=f"{least} entries read")
        # A negative check: nothing more may be read while the slots are held. The
        # consumer waits for a slot here, so a bug would show within a loop turn or two.
        await anyio.sleep(0.3)
        read = await read_not_settled(client.redis, ns)
        if ahead:
            assert least <= read <= CONCURRENCY + prefetch, read
        else:
            assert read == CONCURRENCY
        assert len(entered) == CONCURRENCY
        gate.set()
        await wait_until(
            lambda: _handled(client.redis, ns, 3 + HELD), timeout_s=30, what="all handled"
        )
        done = await effects(client.redis, ns, "ahead")
        assert len(done) == 3 + HELD and set(done.values()) == {1}  # each exactly once


async def _at_least(r: AnyRedis, ns: str, n: int) -> bool:
    return await read_not_settled(r, ns) >= n


async def _handled(r: AnyRedis, ns: str, n: int) -> bool:
    return sum((await effects(r, ns, "ahead")).values()) >= n

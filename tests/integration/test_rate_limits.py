"""Rate limits per capability (issue 14, item 4): set by an operator, taken by every worker
from one GCRA state in Redis before a batch starts, so the handlers of a capability start
no more often than the limit however many callers and agents there are. Messages over the
limit wait in the delayed set (their attempt not counted) and all run, once each."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from reach import Agent, Context
from reach.keys import Keys
from reach.limits import parse_limit, set_limit
from tests.support.agents_messaging import bump, effects, serving

pytestmark = pytest.mark.anyio

CAP = "rl.work"
RATE = 20  # starts per second
CALLERS, EACH = 20, 3


def limited_agent(agent_id: str, starts: list[float]) -> Agent:
    app = Agent(agent_id, capabilities=[CAP])

    @app.handler(CAP)
    async def work(payload: Any, ctx: Context) -> Any:
        starts.append(time.monotonic())
        await bump(ctx, "rl")
        return payload

    return app


async def test_twenty_callers_over_two_agents_keep_to_the_limit(redis_url: str, ns: str) -> None:
    starts: list[float] = []
    agents = [limited_agent("rl-1", starts), limited_agent("rl-2", starts)]
    async with serving(redis_url, ns, *agents) as client:
        await set_limit(client.redis, Keys(ns), CAP, parse_limit(f"{RATE}/s"))
        await anyio.sleep(1.1)  # every worker has read the limit (they re-read each second)
        starts.clear()

        async def caller(c: int) -> None:
            for i in range(EACH):
                assert await client.request(CAP, [c, i], timeout_s=60) == [c, i]

        async with anyio.create_task_group() as tg:
            for c in range(CALLERS):
                tg.start_soon(caller, c)
        n = CALLERS * EACH
        done = await effects(client.redis, ns, "rl")
        assert len(done) == n and set(done.values()) == {1}  # every message, once
    assert len(starts) == n
    starts.sort()
    # In any one-second window: at most RATE + 1 starts (GCRA with a burst of 1), plus one
    # for the few ms between a start's token and its handler's first line.
    worst = max(sum(1 for t in starts[i:] if t < s + 1.0) for i, s in enumerate(starts))
    assert worst <= RATE + 2, worst
    # and the limit did hold them back: 60 starts at 20/s take about 3 s, not a burst
    assert starts[-1] - starts[0] >= (n - 1) / RATE - 0.5


async def test_a_capability_without_a_limit_takes_nothing(redis_url: str, ns: str) -> None:
    # Another capability's limit is no limit for this one: its messages never meet
    # rate_limit.lua (which would leave the limit's state behind) and never wait.
    starts: list[float] = []
    async with serving(redis_url, ns, limited_agent("rl-3", starts)) as client:
        k = Keys(ns)
        await set_limit(client.redis, k, "rl.other", parse_limit("1/m"))
        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(client.request, CAP, i)
        assert len(starts) == 60
        assert await client.redis.exists(k.rate_state(CAP), k.rate_state("rl.other")) == 0
        assert await client.redis.zcard(k.delayed) == 0

"""The agent of the scheduled-send tests (in-process, and ``reach worker
tests.support.agents_schedule:app`` in a child process).

``sch.work`` counts each run in Redis (``Keys(ns).effects('work')``, field = the message's
idempotency key: its msg_id) and notes when it ran (``effects('ran_ms')``, epoch ms), so a
test sees that a scheduled send ran once, and not before its due time.
"""

from __future__ import annotations

import time
from typing import Any

from reach import Agent, Context
from tests.support.agents_messaging import bump

CAP = "sch.work"


def make(agent_id: str = "sch-1") -> Agent:
    agent = Agent(agent_id, capabilities=[CAP])

    @agent.handler(CAP)
    async def work(payload: Any, ctx: Context) -> Any:
        ran_ms = int(time.time() * 1000)
        await ctx.redis.hsetnx(ctx.keys.effects("ran_ms"), ctx.idempotency_key, ran_ms)
        await bump(ctx, "work")
        return payload

    return agent


def app() -> Agent:
    return make()

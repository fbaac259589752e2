"""Agents run by the recovery tests as real `reach worker` processes."""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context

EFFECT = """
if redis.call('HSETNX', KEYS[1], 'done:' .. ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'effects', 1)
end
redis.call('HINCRBY', KEYS[1], 'runs:' .. ARGV[1], 1)
return 1
"""


def _worker(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=["rec.work"])

    @app.handler("rec.work")
    async def work(payload: dict[str, Any], ctx: Context) -> str:
        await anyio.sleep(float(payload.get("sleep_s", 0)))
        # The side effect, made once per idempotency key (the documented pattern).
        await ctx.redis.eval(EFFECT, 1, ctx.keys.effects("rec"), ctx.idempotency_key, ctx.fence)
        return ctx.agent_id

    return app


def w1() -> Agent:
    return _worker("rec-1")


def w2() -> Agent:
    return _worker("rec-2")

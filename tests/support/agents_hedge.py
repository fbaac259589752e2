"""Agents for the hedging tests (``reach worker tests.support.agents_hedge:NAME``).

``hedge.lookup`` is declared idempotent by every agent here: ``stalled`` takes 60 s,
``quick`` answers at once, ``broken`` raises. ``hedge.charge`` (``charger``) is not
declared idempotent. Each handler counts its start (``hedge.started``), end
(``hedge.finished``) and cancellation (``hedge.cancelled``) per agent.
"""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context

LOOKUP = "hedge.lookup"
CHARGE = "hedge.charge"


async def _count(ctx: Context, what: str) -> None:
    await ctx.redis.hincrby(ctx.keys.effects(f"hedge.{what}"), ctx.agent_id, 1)


def _agent(agent_id: str, *, sleep_s: float = 0, fail: bool = False) -> Agent:
    app = Agent(agent_id, capabilities=[LOOKUP, CHARGE])

    async def run(payload: Any, ctx: Context) -> Any:
        await _count(ctx, "started")
        try:
            await anyio.sleep(sleep_s)
        except BaseException:
            with anyio.CancelScope(shield=True):  # the cut cancels every later await too
                await _count(ctx, "cancelled")
            raise
        if fail:
            raise RuntimeError(f"{agent_id} is broken")
        await _count(ctx, "finished")
        return {"agent": agent_id, "q": payload}

    app.handler(LOOKUP, idempotent=True)(run)
    app.handler(CHARGE)(run)
    return app


def stalled() -> Agent:
    return _agent("stalled", sleep_s=60)


def quick() -> Agent:
    return _agent("quick")


def broken() -> Agent:
    return _agent("broken", fail=True)

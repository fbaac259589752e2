"""Agents with durable steps (``ctx.step``), run by tests/integration/test_steps.py as real
`reach worker` processes.

``steps.order`` charges, then ships, each a step whose outside effect is counted in an
effects hash (field: the idempotency key): ``steps.charge`` and ``steps.ship``. Its payload
steers it: ``hold_on`` names an agent on which the handler stops between the two steps
(counted in ``steps.between``, then it waits until its process is killed);
``fail_attempt`` makes that attempt raise between the two steps.
"""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context
from tests.support.agents_messaging import bump

CAP = "steps.order"


async def charge(ctx: Context, cents: int) -> dict[str, Any]:
    """The outside effect of the first step: counted, and answered with who made it."""
    await bump(ctx, "steps.charge")
    return {"charged": cents, "by": ctx.agent_id, "attempt": ctx.attempt}


async def ship(ctx: Context) -> str:
    await bump(ctx, "steps.ship")
    return f"shipped by {ctx.agent_id}"


def _agent(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=[CAP])

    @app.handler(CAP)
    async def order(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        receipt = await ctx.step("charge", charge, ctx, payload["cents"])
        if payload.get("hold_on") == ctx.agent_id:
            await bump(ctx, "steps.between")
            await anyio.sleep_forever()  # the test SIGKILLs this process here
        if payload.get("fail_attempt") == ctx.attempt:
            raise RuntimeError(f"failing between the steps on attempt {ctx.attempt}, as asked")
        shipped = await ctx.step("ship", ship, ctx)
        return {
            "receipt": receipt,
            "shipped": shipped,
            "agent": ctx.agent_id,
            "attempt": ctx.attempt,
        }

    return app


def steps_a() -> Agent:
    return _agent("steps-a")


def steps_b() -> Agent:
    return _agent("steps-b")

"""Agents that ask for human input (``ctx.ask``), run by tests/integration/test_ask.py and
tests/cli/test_answer_cmd.py as real `reach worker` processes.

``ask.refund`` asks whether to refund ``payload["order"]`` (its ``timeout_s``, default 60)
and returns the answer with the agent that got it; on :class:`reach.AskTimeout` it returns
what the error said. Counted per idempotency key: ``ask.started`` (each run), ``ask.answered``
(each run that got an answer). ``hold_on`` names an agent on which the handler stops after
its answer (counted in ``ask.held``, then it waits until its process is killed).
``ask.twice`` asks two questions in order. ``ask.echo`` answers at once (its payload).
"""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, AskTimeout, Context
from tests.support.agents_messaging import bump

REFUND, TWICE, ECHO = "ask.refund", "ask.twice", "ask.echo"


def _agent(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=[REFUND, TWICE, ECHO])

    @app.handler(REFUND)
    async def refund(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        await bump(ctx, "ask.started")
        try:
            answer = await ctx.ask(
                f"Refund order {payload['order']}?", timeout_s=payload.get("timeout_s", 60)
            )
        except AskTimeout as e:
            return {"timed_out": str(e), "agent": ctx.agent_id}
        await bump(ctx, "ask.answered")
        if payload.get("hold_on") == ctx.agent_id:
            await bump(ctx, "ask.held")
            await anyio.sleep_forever()  # the test SIGKILLs this process here
        return {"answer": answer, "agent": ctx.agent_id}

    @app.handler(TWICE)
    async def twice(payload: dict[str, Any], ctx: Context) -> list[Any]:
        first = await ctx.ask("First: which colour?", timeout_s=60)
        second = await ctx.ask(f"Second: how many {first} ones?", timeout_s=60)
        return [first, second]

    @app.handler(ECHO)
    async def echo(payload: Any, ctx: Context) -> Any:
        return payload

    return app


def ask_a() -> Agent:
    return _agent("ask-a")


def ask_b() -> Agent:
    return _agent("ask-b")

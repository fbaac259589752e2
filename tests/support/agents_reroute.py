"""Agents run by the reroute tests (``reroute_after_s``) as real `reach worker` processes.

``stall`` and ``spare`` serve ``route.stall`` and ``route.stall_adv`` (the same handler; the
agents advertise ``reroute_after_s`` 0.5 for the second). A message whose payload holds
``{"hold": true}`` keeps its slot until the test sets the release key; every message
counts one side effect per idempotency key (which agent ran it, how often).
"""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context

CAPS = ["route.stall", "route.stall_adv"]


def release_key(ctx: Context) -> str:
    return ctx.keys.effects("release")


def _agent(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=CAPS, metadata={"reroute_after_s": {"route.stall_adv": 0.5}})

    async def run(payload: dict[str, Any], ctx: Context) -> str:
        await ctx.redis.hincrby(ctx.keys.effects("runs"), ctx.idempotency_key, 1)
        await ctx.redis.hset(ctx.keys.effects("ran_on"), ctx.idempotency_key, ctx.agent_id)
        if payload.get("hold"):
            with anyio.fail_after(60):  # held by the test until it lets go
                while not await ctx.redis.exists(release_key(ctx)):
                    await anyio.sleep(0.02)
        return ctx.agent_id

    app.handler("route.stall")(run)
    app.handler("route.stall_adv")(run)
    return app


def stall() -> Agent:
    """Run with ``--concurrency 1``: one held message stalls it."""
    return _agent("stall")


def spare() -> Agent:
    return _agent("spare")

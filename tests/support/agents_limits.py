"""Agents run as real `reach worker` processes by the rate-limit tests.

``lim1`` and ``lim2`` serve ``rl.proc`` (no limit of their own: the operator's limit on the
capability applies to both processes together) and ``rl.own`` (each declares
``rate="4/s"``: a limit per agent). Each handler start is recorded with its wall-clock time
in a list, so the test counts starts per one-second window across the processes.
"""

from __future__ import annotations

import time
from typing import Any

from reach import Agent, Context


def _worker(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=["rl.proc", "rl.own"])

    @app.handler("rl.proc")
    async def proc(payload: Any, ctx: Context) -> Any:
        await ctx.redis.rpush(ctx.keys.effects("rl.proc.starts"), f"{time.time():.6f}")
        return payload

    @app.handler("rl.own", rate="4/s")
    async def own(payload: Any, ctx: Context) -> Any:
        await ctx.redis.rpush(
            ctx.keys.effects("rl.own.starts"), f"{ctx.agent_id} {time.time():.6f}"
        )
        return payload

    return app


def lim1() -> Agent:
    return _worker("lim-1")


def lim2() -> Agent:
    return _worker("lim-2")

"""Agents run by the hardening and fuzzing tests as real `reach worker` processes.

``h1``, ``h2``, ``h3`` serve ``hard.echo`` (answers and counts one side effect per
idempotency key), ``hard.fail`` (always raises: the retry path) and ``hard.slow`` (holds
its key for ``sleep_s``: a second copy of the key then finds it busy).
"""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context

CAPS = ["hard.echo", "hard.fail", "hard.slow"]


def _worker(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=CAPS)

    @app.handler("hard.echo")
    async def echo(payload: Any, ctx: Context) -> dict[str, Any]:
        await ctx.redis.hincrby(ctx.keys.effects("hard"), ctx.idempotency_key, 1)
        return {"echo": payload, "agent": ctx.agent_id}

    @app.handler("hard.fail")
    async def fail(payload: Any, ctx: Context) -> None:
        raise RuntimeError(f"failing on purpose (attempt {ctx.attempt})")

    @app.handler("hard.slow")
    async def slow(payload: dict[str, Any], ctx: Context) -> str:
        await anyio.sleep(float(payload.get("sleep_s", 1)))
        return ctx.agent_id

    return app


def h1() -> Agent:
    return _worker("h1")


def h2() -> Agent:
    return _worker("h2")


def h3() -> Agent:
    return _worker("h3")

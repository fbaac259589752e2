"""Agents run by the lifecycle tests as real `reach worker` processes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

from reach import Agent, Context, Reject
from tests.support.agents_messaging import bump


def blocker() -> Agent:
    """An agent whose handler blocks the event loop (time.sleep in async code) for a while."""
    app = Agent("blocker-1", capabilities=["test.block"], metadata={"region": "eu"})

    @app.handler("test.block")
    async def block(payload: dict[str, Any], ctx: Context) -> str:
        time.sleep(float(payload["seconds"]))  # noqa: ASYNC251 - deliberately blocks the loop
        return "unblocked"

    return app


def plain() -> Agent:
    app = Agent("plain-1", capabilities=["test.plain", "test.other"], weight=3)

    @app.handler("test.plain")
    async def handle(payload: Any, ctx: Context) -> Any:
        return payload

    @app.handler("test.other")
    async def refuse(payload: Any, ctx: Context) -> Any:
        raise Reject("test.other refuses every message")

    return app


# -- drain: handlers that outlast the signal ----------------------------------------------
# Each counts its starts and finishes per message (``Keys(ns).effects``, field: the
# idempotency key) and how many of its runs overlap (a message running on two agents at
# once counts in ``drain.overlap``), so a test can tell whether a drain lost an outcome or
# ran a message twice.


async def _begin(ctx: Context, name: str) -> None:
    await bump(ctx, f"{name}.started")
    await ctx.redis.hset(ctx.keys.effects(f"{name}.agent"), ctx.idempotency_key, ctx.agent_id)
    if await bump(ctx, "drain.running") > 1:
        await bump(ctx, "drain.overlap")


async def _end(ctx: Context, name: str) -> None:
    await bump(ctx, f"{name}.finished")


async def _leave(ctx: Context) -> None:
    with anyio.CancelScope(shield=True):
        await ctx.redis.hincrby(ctx.keys.effects("drain.running"), ctx.idempotency_key, -1)


def _sleeper(agent_id: str) -> Agent:
    """``test.sleep`` returns after ``seconds``; ``test.sleep_emit`` streams with
    ``ctx.emit`` (a chunk every 0.1 s for ``seconds``), ``test.sleep_gen`` is an async
    generator doing the same; ``test.sleep_plain`` is a plain function, and
    ``test.sleep_shielded`` ignores cancellation. ``test.emit_logged`` and
    ``test.gen_logged`` stream as ``sleep_emit`` and ``sleep_gen`` do but log their runs
    as ``sleep_plain`` does (in a file: no Redis call of their own, so they run on while
    Redis is away)."""
    app = Agent(
        agent_id,
        capabilities=[
            "test.sleep",
            "test.sleep_emit",
            "test.sleep_gen",
            "test.sleep_plain",
            "test.sleep_shielded",
            "test.emit_logged",
            "test.gen_logged",
        ],
    )

    @app.handler("test.sleep_shielded")
    async def sleep_shielded(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        """Ignores cancellation: it sleeps ``seconds`` in a shielded scope."""
        await _begin(ctx, "sleep_shielded")
        with anyio.CancelScope(shield=True):
            await anyio.sleep(float(payload["seconds"]))
            await _leave(ctx)
            await _end(ctx, "sleep_shielded")
        return {"agent": ctx.agent_id, "slept": payload["seconds"]}

    @app.handler("test.sleep_plain")
    def sleep_plain(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        """A plain function (run in a thread, which nothing can cancel): its runs are
        lines ``start|end <agent> <time>`` in the file ``payload["log"]``."""
        with open(payload["log"], "a") as f:
            f.write(f"start {ctx.agent_id} {time.time()}\n")
        time.sleep(float(payload["seconds"]))
        with open(payload["log"], "a") as f:
            f.write(f"end {ctx.agent_id} {time.time()}\n")
        return {"agent": ctx.agent_id, "slept": payload["seconds"]}

    @app.handler("test.sleep")
    async def sleep(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        await _begin(ctx, "sleep")
        try:
            await anyio.sleep(float(payload["seconds"]))
        finally:
            await _leave(ctx)
        await _end(ctx, "sleep")
        return {"agent": ctx.agent_id, "slept": payload["seconds"]}

    @app.handler("test.sleep_emit")
    async def sleep_emit(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        await _begin(ctx, "sleep_emit")
        try:
            for i in range(max(1, round(float(payload["seconds"]) / 0.1))):
                await ctx.emit({"i": i})
                await anyio.sleep(0.1)
        finally:
            await _leave(ctx)
        await _end(ctx, "sleep_emit")
        return {"agent": ctx.agent_id}

    @app.handler("test.sleep_gen")
    async def sleep_gen(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        await _begin(ctx, "sleep_gen")
        try:
            for i in range(max(1, round(float(payload["seconds"]) / 0.1))):
                yield {"i": i}
                await anyio.sleep(0.1)
        finally:
            await _leave(ctx)
        await _end(ctx, "sleep_gen")
        ctx.result = {"agent": ctx.agent_id}

    @app.handler("test.emit_logged")
    async def emit_logged(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        _log_run(payload, ctx, "start")
        try:
            for i in range(max(1, round(float(payload["seconds"]) / 0.1))):
                await ctx.emit({"i": i})
                await anyio.sleep(0.1)
        finally:
            _log_run(payload, ctx, "end")
        return {"agent": ctx.agent_id}

    @app.handler("test.gen_logged")
    async def gen_logged(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        _log_run(payload, ctx, "start")
        try:
            for i in range(max(1, round(float(payload["seconds"]) / 0.1))):
                yield {"i": i}
                await anyio.sleep(0.1)
        finally:
            _log_run(payload, ctx, "end")
        ctx.result = {"agent": ctx.agent_id}

    return app


def _log_run(payload: dict[str, Any], ctx: Context, what: str) -> None:
    with open(payload["log"], "a") as f:
        f.write(f"{what} {ctx.agent_id} {time.time()}\n")


def sleeper_a() -> Agent:
    return _sleeper("sleeper-a")


def sleeper_b() -> Agent:
    return _sleeper("sleeper-b")


def sleeper_c() -> Agent:
    return _sleeper("sleeper-c")

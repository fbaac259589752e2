"""Agents that call agents, for the call-graph tests (tests/integration/test_call_graphs.py).

``reach worker tests.support.agents_calls:NAME`` runs each factory in a child process; the
agent id comes from ``REACH_TEST_AGENT_ID``. Every handler counts its runs in Redis
(:func:`tests.support.agents_messaging.bump_agent`, name = the capability), so a test can
tell which handlers ran, where, and how often.
"""

from __future__ import annotations

import os
from typing import Any

import anyio

from reach import Agent, Context, HopLimitExceeded, LoopDetected, WouldDeadlock
from tests.support.agents_messaging import bump_agent
from tests.support.waiting import wait_until

CHAIN = 20  # chain.0 -> chain.1 -> ... -> chain.19


def _agent_id(default: str) -> str:
    return os.environ.get("REACH_TEST_AGENT_ID", default)


def _refusal(e: Exception) -> dict[str, Any]:
    return {"refused": type(e).__name__, "path": getattr(e, "path", ""), "error": str(e)}


def ping_agent() -> Agent:
    """``calls.a``: calls ``calls.b`` (``request``) and returns its answer."""
    app = Agent(_agent_id("a1"), capabilities=["calls.a"])

    @app.handler("calls.a")
    async def a(payload: dict[str, Any], ctx: Context) -> Any:
        await bump_agent(ctx, "calls.a")
        if payload.get("leaf"):
            return {"leaf": ctx.agent_id}
        return await ctx.client.request("calls.b", payload, timeout_s=60)

    return app


def pong_agent() -> Agent:
    """``calls.b``: calls ``calls.a`` back (A -> B -> A), as a leaf (it answers at once)
    with ``then_leaf`` in the payload; with ``catch`` it returns the refusal it got instead
    of raising it."""
    app = Agent(_agent_id("b1"), capabilities=["calls.b"])

    @app.handler("calls.b")
    async def b(payload: dict[str, Any], ctx: Context) -> Any:
        await bump_agent(ctx, "calls.b")
        try:
            inner = {**payload, "leaf": bool(payload.get("then_leaf"))}
            return await ctx.client.request("calls.a", inner, timeout_s=60)
        except LoopDetected as e:
            if payload.get("catch"):
                return _refusal(e)
            raise

    return app


def chain_agent() -> Agent:
    """``chain.0`` .. ``chain.19``: ``chain.k`` calls ``chain.k+1`` and waits (the last one
    answers); one agent serves them all (run it with a concurrency above 20)."""
    caps = [f"chain.{k}" for k in range(CHAIN)]
    app = Agent(_agent_id("chain-1"), capabilities=caps)

    def link(k: int) -> None:
        @app.handler(f"chain.{k}")
        async def step(payload: Any, ctx: Context) -> Any:
            await bump_agent(ctx, f"chain.{k}")
            if k + 1 == CHAIN:
                return {"end": k}
            return await ctx.client.request(f"chain.{k + 1}", payload, timeout_s=60)

    for k in range(CHAIN):
        link(k)
    return app


def echo_sender_agent() -> Agent:
    """``calls.ping`` and ``calls.pong`` hand one message back and forth with ``send()``,
    for ever but for the hop limit: the handler whose send is refused records the
    refusal (``calls.refused`` by agent) and stops."""
    app = Agent(_agent_id("pp-1"), capabilities=["calls.ping", "calls.pong"])

    async def bounce(ctx: Context, to: str) -> None:
        await bump_agent(ctx, ctx.capability)
        try:
            await ctx.client.send(to, {"hops": ctx.envelope.hops})
        except HopLimitExceeded as e:
            # the error first: the test reads it once it sees the refusal counted
            await ctx.redis.set(ctx.keys.effects("calls.refused.error"), str(e))
            await bump_agent(ctx, "calls.refused")

    @app.handler("calls.ping")
    async def ping(payload: Any, ctx: Context) -> None:
        await bounce(ctx, "calls.pong")

    @app.handler("calls.pong")
    async def pong(payload: Any, ctx: Context) -> None:
        await bounce(ctx, "calls.ping")

    return app


def self_agent() -> Agent:
    """``calls.self``: with ``children`` > 0 in the payload, calls ``calls.self`` that many
    times at once and returns where each child ran, or the refusal it met. A child holds
    its slot until a sibling was refused (``release`` set), so the first child cannot end
    before the others were routed."""
    app = Agent(_agent_id("s1"), capabilities=["calls.self"])

    @app.handler("calls.self")
    async def handle(payload: dict[str, Any], ctx: Context) -> Any:
        await bump_agent(ctx, "calls.self")
        release = payload.get("release", "")
        children = int(payload.get("children", 0))
        if not children:
            if release:
                key = ctx.keys.effects(release)

                async def released() -> bool:
                    return bool(await ctx.redis.exists(key))

                await wait_until(released, timeout_s=60, what="a sibling refused")
            return {"agent": ctx.agent_id}
        out: list[Any] = [None] * children
        hold = {"release": release} if release else {}

        async def child(i: int) -> None:
            try:
                out[i] = await ctx.client.request("calls.self", hold, timeout_s=60)
            except WouldDeadlock as e:
                out[i] = _refusal(e)
                if release:
                    await ctx.redis.set(ctx.keys.effects(release), 1)

        async with anyio.create_task_group() as tg:
            for i in range(children):
                tg.start_soon(child, i)
        return {"agent": ctx.agent_id, "children": out}

    return app

"""Guarded agents, for tests/integration/test_guards.py (in-process and as ``reach worker
tests.support.agents_guards:guarded_agent`` processes; the agent id comes from
``REACH_TEST_AGENT_ID``). Every handler counts its runs in Redis (:func:`bump_agent`, name
= the capability), so a test can tell whether a refused message's handler ran."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import msgspec

from reach import Agent, Context, GuardRefused, Refuse
from reach.guards import Check, Deny, OnwardCalls, Schema, Size
from tests.support.agents_messaging import bump_agent

MAX_INPUT_BYTES = 1024
INJECTION = {"ignore_instructions": r"ignore (all )?previous instructions"}
TEXT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 200}},
    "required": ["text"],
}
CAPS = [
    "guard.echo",
    "guard.schema",
    "guard.typed",
    "guard.leaky",
    "guard.custom",
    "guard.flaky",
    "guard.plain",
    "guard.caller",
    "guard.leaf",
    "guard.stream",
]


class Summary(msgspec.Struct):
    summary: str


def no_sundays(value: Any, ctx: Context) -> str | None:
    """A plain user check: a reason refuses."""
    return "closed on sundays" if value.get("day") == "sunday" else None


async def no_secrets(value: Any, ctx: Context) -> None:
    """An async user check: raising Refuse refuses, with its own rule."""
    await anyio.lowlevel.checkpoint()
    if "secret" in str(value.get("text", "")):
        raise Refuse("asks for a secret", rule="no_secret_requests")


def broken(value: Any, ctx: Context) -> None:
    """A check that fails (not a refusal): the attempt fails, and is retried."""
    raise RuntimeError("moderation service unreachable")


def guarded_agent() -> Agent:
    app = Agent(
        os.environ.get("REACH_TEST_AGENT_ID", "guarded-1"),
        capabilities=CAPS,
        guards=[Size(max_input_bytes=MAX_INPUT_BYTES)],  # every capability
    )

    @app.handler("guard.echo", guards=[Deny(INJECTION)])
    async def echo(payload: Any, ctx: Context) -> Any:
        await bump_agent(ctx, "guard.echo")
        return payload

    @app.handler("guard.schema", guards=[Schema(input=TEXT_SCHEMA)])
    async def schema(payload: Any, ctx: Context) -> Any:
        await bump_agent(ctx, "guard.schema")
        return {"chars": len(payload["text"])}

    @app.handler("guard.typed", guards=[Schema()])  # the output, from the annotation
    async def typed(payload: dict[str, Any], ctx: Context) -> Summary:
        await bump_agent(ctx, "guard.typed")
        if payload.get("misbehave"):
            return {"summary": 42}  # type: ignore[return-value]
        return Summary(payload["text"][:10])

    @app.handler("guard.leaky", guards=[Deny({"api_key": r"sk-[a-z0-9]{8,}"}, on="output")])
    async def leaky(payload: Any, ctx: Context) -> Any:
        await bump_agent(ctx, "guard.leaky")
        return {"text": f"the key is {payload['key']}"}

    @app.handler("guard.custom", guards=[no_sundays, Check(no_secrets)])
    async def custom(payload: Any, ctx: Context) -> Any:
        await bump_agent(ctx, "guard.custom")
        return "ok"

    @app.handler("guard.flaky", guards=[broken])
    async def flaky(payload: Any, ctx: Context) -> Any:
        await bump_agent(ctx, "guard.flaky")
        return "never"

    @app.handler("guard.plain", guards=[Check(no_secrets), Deny(INJECTION, on="output")])
    def plain(payload: Any, ctx: Context) -> Any:  # a plain handler: in a worker thread
        anyio.from_thread.run(bump_agent, ctx, "guard.plain")
        return payload.get("reply", "ok")

    @app.handler("guard.caller", guards=[OnwardCalls(["guard.leaf"])])
    async def caller(payload: dict[str, Any], ctx: Context) -> Any:
        await bump_agent(ctx, "guard.caller")
        how = payload.get("how", "request")
        try:
            if how == "send":
                return await ctx.client.send(payload["call"], {})
            if how == "stream":
                return [c async for c in ctx.client.stream(payload["call"], {})]
            return await ctx.client.request(payload["call"], {}, timeout_s=30)
        except GuardRefused as e:
            if payload.get("catch"):  # caught: the message is refused all the same
                return {"caught": e.rule}
            raise

    @app.handler("guard.leaf")
    async def leaf(payload: Any, ctx: Context) -> Any:
        await bump_agent(ctx, "guard.leaf")
        return "leaf"

    @app.handler("guard.stream", guards=[Deny(INJECTION, on=["chunk"])])
    async def stream(payload: dict[str, Any], ctx: Context) -> AsyncIterator[str]:
        await bump_agent(ctx, "guard.stream")
        for word in payload["words"]:
            yield word

    return app

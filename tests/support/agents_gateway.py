"""Agents of the gateway tests (tests/integration/test_gateway*.py, tests/cli/test_gateway_cmd.py,
bench/gateway_bench.py); the factories take no arguments, so ``reach worker
tests.support.agents_gateway:NAME`` runs them in a process of their own."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import anyio

import reach
from reach import Agent, Context


def echo_agent() -> Agent:
    """``gw.echo`` (the payload back, with what the handler saw) and ``gw.fail`` (a
    ``"reject"`` payload is refused, anything else raises)."""
    app = Agent(
        os.environ.get("REACH_TEST_AGENT_ID", "gw-echo-1"),
        capabilities=["gw.echo", "gw.fail"],
        card={
            "description": "Echoes what it is given.",
            "skills": [{"id": "gw.echo", "name": "Echo", "description": "Echoes the payload."}],
        },
    )

    @app.handler("gw.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return {
            "echo": payload,
            "session": ctx.session_id,
            "msg_id": ctx.msg_id,
            "caller": ctx.envelope.headers.get("a2a-caller", ""),
            "agent": ctx.agent_id,
        }

    @app.handler("gw.fail")
    async def fail(payload: Any, ctx: Context) -> Any:
        if payload == "reject":
            raise reach.Reject("not for me")
        raise ValueError("it broke")

    return app


def words_agent() -> Agent:
    """``gw.words``: streams the words of a text (its card says it takes text), then
    ``"done"``."""
    app = Agent(
        os.environ.get("REACH_TEST_AGENT_ID", "gw-words-1"),
        capabilities=["gw.words"],
        card={"defaultInputModes": ["text/plain"]},
    )

    @app.handler("gw.words")
    async def split(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        for w in str(payload).split():
            yield w
        ctx.result = "done"

    return app


def slow_agent() -> Agent:
    """``gw.slow``: sleeps the payload's seconds, then answers ``"late"``."""
    app = Agent("gw-slow-1", capabilities=["gw.slow"])

    @app.handler("gw.slow")
    async def slow(payload: Any, ctx: Context) -> Any:
        await anyio.sleep(float(payload))
        return "late"

    return app


def notes_agent() -> Agent:
    """``gw.notes``: appends the payload to its session's history and answers the history
    (what the session it was given holds, as a multi-turn agent would see it)."""
    app = Agent("gw-notes-1", capabilities=["gw.notes"])

    @app.handler("gw.notes")
    async def notes(payload: Any, ctx: Context) -> Any:
        await ctx.session.append(payload)
        return {"history": await ctx.session.history(), "session": ctx.session_id}

    return app


def flood_agent() -> Agent:
    """``gw.flood``: streams ``n`` chunks of ``size`` characters (payload ``{"n", "size"}``),
    as fast as it can, then ``"flooded"``."""
    app = Agent("gw-flood-1", capabilities=["gw.flood"])

    @app.handler("gw.flood")
    async def flood(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        chunk = "x" * int(payload["size"])
        for _ in range(int(payload["n"])):
            yield chunk
        ctx.result = "flooded"

    return app

"""Agents of the MCP tests (tests/integration/test_mcp*.py, tests/cli/test_mcp_cmd.py); the
factories take no arguments, so ``reach worker tests.support.agents_mcp:NAME`` runs each in
a process of its own."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import anyio
import msgspec

import reach
from reach import Agent, Context


class Add(msgspec.Struct):
    a: int
    b: int


class Sum(msgspec.Struct):
    total: int
    session: str
    caller: str
    signed_by: str


class Text(msgspec.Struct):
    text: str


def tools_agent() -> Agent:
    """``mcp.add`` (typed: Add -> Sum, with the session, caller header and signer it saw),
    ``mcp.words`` (streams the words of a text, then their count), ``mcp.wait`` (runs until
    cancelled, then marks ``cancelled`` under its payload's key), ``mcp.refuse`` (refuses)."""
    app = Agent(
        os.environ.get("REACH_TEST_AGENT_ID", "mcp-tools-1"),
        capabilities=["mcp.add", "mcp.words", "mcp.wait", "mcp.refuse"],
    )

    @app.handler("mcp.add", timeout_s=20)
    async def add(payload: Add, ctx: Context) -> Sum:
        return Sum(
            payload.a + payload.b,
            ctx.session_id,
            ctx.envelope.headers.get("mcp-caller", ""),
            ctx.sender or "",
        )

    @app.handler("mcp.words")
    async def words(payload: Text, ctx: Context) -> AsyncIterator[str]:
        parts = payload.text.split()
        for w in parts:
            yield w
        ctx.result = len(parts)

    @app.handler("mcp.wait")
    async def wait(payload: str, ctx: Context) -> str:
        await ctx.redis.hset(ctx.keys.effects("mcp.wait"), payload, "running")
        with anyio.move_on_after(30):
            while not ctx.cancelled:
                await anyio.sleep(0.02)
        await ctx.redis.hset(
            ctx.keys.effects("mcp.wait"), payload, "cancelled" if ctx.cancelled else "timed out"
        )
        return "done"

    @app.handler("mcp.refuse")
    async def refuse(payload: Text, ctx: Context) -> str:
        raise reach.Reject(f"will not take {payload.text!r}")

    return app


def extra_agent() -> Agent:
    """``mcp.extra``: an agent that comes and goes in the tool-list test."""
    app = Agent("mcp-extra-1", capabilities=["mcp.extra"])

    @app.handler("mcp.extra")
    async def extra(payload: Text, ctx: Context) -> str:
        return payload.text

    return app

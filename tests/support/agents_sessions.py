"""Agents of the session tier tests (tests/integration/test_session_tiers.py): a writer
served by a `reach worker` process of its own (``tests.support.agents_sessions:writer``),
the other agent that changes a session a cached reader holds."""

from __future__ import annotations

from typing import Any

from reach import Agent, Context


def writer() -> Agent:
    app = Agent("session-writer", capabilities=["t.session.write"])

    @app.handler("t.session.write")
    async def write(payload: dict[str, Any], ctx: Context) -> int:
        for k, v in payload.get("set", {}).items():
            await ctx.session.set(k, v)
        for item in payload.get("append", []):
            await ctx.session.append(item)
        return len(await ctx.session.history())

    return app

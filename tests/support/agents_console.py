"""The agent the console's message-list browser test runs as a real `reach worker`."""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context


def console_agent() -> Agent:
    """``web.echo`` returns its payload; ``web.lookup`` reads ``payload["txt"]`` (a
    KeyError without it); ``web.hold`` runs until it is cancelled (at most 60 s)."""
    app = Agent("console-1", capabilities=["web.echo", "web.lookup", "web.hold"])

    @app.handler("web.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return {"echo": payload}

    @app.handler("web.lookup")
    async def lookup(payload: dict[str, Any], ctx: Context) -> Any:
        return {"found": payload["txt"]}

    @app.handler("web.hold")
    async def hold(payload: Any, ctx: Context) -> Any:
        with anyio.move_on_after(60):
            await ctx.wait_cancelled()
        return "held"

    return app

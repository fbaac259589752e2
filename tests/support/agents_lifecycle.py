"""Agents run by the lifecycle tests as real `reach worker` processes."""

from __future__ import annotations

import time
from typing import Any

from reach import Agent, Context, Reject


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

"""An agent that exercises much of what reach writes to Redis, for `reach worker
tests.support.agents_doctor:ops_agent` (tests/integration/test_doctor.py): plain replies,
a session, a handler's own rate limit, a stream, a retry, a rejection (a dead letter) and a
handler that runs until it is cancelled."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio

import reach
from reach import Agent, Context
from tests.support.agents_messaging import bump

CAPS = ["doc.echo", "doc.session", "doc.stream", "doc.retry", "doc.reject", "doc.hold"]


def ops_agent() -> Agent:
    app = Agent("doc-ops-1", capabilities=CAPS)

    @app.handler("doc.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "echo")
        return payload

    @app.handler("doc.session", rate="1/h")  # a limit of its own: one start an hour
    async def session(payload: Any, ctx: Context) -> Any:
        await ctx.session.set("last", payload)
        return await ctx.session.append(payload)

    @app.handler("doc.stream")
    async def stream(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        for i in range(int(payload)):
            yield i

    @app.handler("doc.retry")
    async def retry(payload: Any, ctx: Context) -> Any:
        if await bump(ctx, "retry") == 1:
            raise reach.Retry("once more", delay_s=0.05)
        return "second time"

    @app.handler("doc.reject")
    async def reject(payload: Any, ctx: Context) -> Any:
        raise reach.Reject("not this one")

    @app.handler("doc.hold")
    async def hold(payload: Any, ctx: Context) -> Any:
        await anyio.sleep(120)  # until cancelled
        return "held"

    return app

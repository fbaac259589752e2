"""An agent for the signing tests, run as a real `reach worker` process (with
REACH_SECRET in its environment and --require-signed)."""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context


def w1() -> Agent:
    app = Agent("sig-1", capabilities=["sig.work"])

    @app.handler("sig.work")
    async def work(payload: dict[str, Any], ctx: Context) -> str:
        # Who ran, as whom, and how often: read by the test.
        key = ctx.keys.effects("sig")
        await anyio.sleep(float(payload.get("sleep_s", 0)))
        # The sender first: a test that sees the run sees whom it ran as.
        await ctx.redis.hset(key, f"sender:{ctx.msg_id}", ctx.sender or "<none>")
        await ctx.redis.hincrby(key, f"runs:{ctx.msg_id}", 1)
        if payload.get("fail_first") and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return ctx.sender or "<none>"

    return app

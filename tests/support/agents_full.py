"""An agent for the full-Redis tests, run as a real `reach worker` process: its handler
writes nothing to Redis, so only what the runtime writes meets a full Redis."""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context, Reject


def w1() -> Agent:
    app = Agent("full-1", capabilities=["full.work"])

    @app.handler("full.work")
    async def work(payload: dict[str, Any], ctx: Context) -> str:
        await anyio.sleep(float(payload.get("sleep_s", 0)))
        mode = payload.get("mode", "ok")
        if mode == "reject":
            raise Reject("refused on purpose")
        if mode == "fail_first" and ctx.attempt == 1:
            raise RuntimeError("the first attempt fails")
        return f"ok:{ctx.attempt}"

    return app

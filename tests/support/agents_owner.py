"""An agent whose id holds a '/' (tests/integration/test_claim_owner.py): ``own.slow``
counts one side effect per run and takes ``REACH_TEST_SLEEP_S`` seconds."""

from __future__ import annotations

import os
from typing import Any

import anyio

from reach import Agent, Context
from tests.support.agents_messaging import bump


def slow_agent() -> Agent:
    app = Agent(os.environ["REACH_TEST_AGENT_ID"], capabilities=["own.slow"])

    @app.handler("own.slow")
    async def slow(payload: Any, ctx: Context) -> Any:
        runs = await bump(ctx, "own.slow")
        await anyio.sleep(float(os.environ.get("REACH_TEST_SLEEP_S", "2")))
        return {"runs": runs, "agent": ctx.agent_id}

    return app

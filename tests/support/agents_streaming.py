"""Streaming agents for `reach worker` processes (tests/integration/test_streaming_crash.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import anyio

from reach import Agent, Context
from tests.support.agents_messaging import bump


def _streamer(agent_id: str) -> Agent:
    """``test.stream``: yields ``n`` chunks ``{"i", "pid", "start"}``; the first run of a
    message sleeps (long) after chunk ``hold_after``, so a test can SIGKILL its worker
    mid-stream; any later run streams every chunk at once. The final result names the run."""
    app = Agent(agent_id, capabilities=["test.stream"])

    @app.handler("test.stream")
    async def stream(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        start = await bump(ctx, "stream.started")
        for i in range(payload["n"]):
            yield {"i": i, "pid": os.getpid(), "start": start}
            if start == 1 and i == payload["hold_after"]:
                await anyio.sleep(60)
        ctx.result = {"start": start, "pid": os.getpid(), "agent": ctx.agent_id}

    return app


def stream_a() -> Agent:
    return _streamer("stream-a")


def stream_b() -> Agent:
    return _streamer("stream-b")

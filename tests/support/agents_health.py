"""Agents for the health tests (tests/cli/test_health_probes.py): ``flagged`` is ready
while the file named by ``REACH_TEST_UNREADY_FILE`` does not exist (its readiness check
reads it), and its ``health.pause`` handler pauses routing to its agent by hand
(``ctx.agent.set_ready(False)``) until the file named by ``REACH_TEST_RESUME_FILE``
exists, then resumes it."""

from __future__ import annotations

import os
from typing import Any

import anyio

import reach


def flagged() -> reach.Agent:
    app = reach.Agent("health-a", capabilities=["health.echo", "health.pause"])
    unready = os.environ.get("REACH_TEST_UNREADY_FILE", "")
    resume = os.environ.get("REACH_TEST_RESUME_FILE", "")

    @app.readiness
    async def dependency_up() -> bool:
        return not (unready and os.path.exists(unready))

    @app.handler("health.echo")
    async def echo(payload: Any, ctx: reach.Context) -> Any:
        return ctx.agent_id

    @app.handler("health.pause")
    async def pause(payload: Any, ctx: reach.Context) -> Any:
        ctx.agent.set_ready(False)
        while not (resume and os.path.exists(resume)):
            await anyio.sleep(0.02)
        ctx.agent.set_ready(True)
        return "resumed"

    return app

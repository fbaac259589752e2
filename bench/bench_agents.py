"""Agents used by the benchmarks (run as `reach worker bench.bench_agents:NAME`)."""

from __future__ import annotations

from typing import Any

from reach.runtime import Agent, Context


def noop() -> Agent:
    app = Agent("bench-1", capabilities=["bench.noop"])

    @app.handler("bench.noop")
    async def handle(payload: Any, ctx: Context) -> Any:
        return payload

    return app

"""Agents run by the routing tests as real `reach worker` processes."""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context


def _echo(
    agent_id: str,
    *,
    weight: float = 1,
    delay_s: float = 0.0,
    fail: bool = False,
    region: str = "eu",
    max_queue: int = 0,
) -> Agent:
    app = Agent(
        agent_id,
        capabilities=["route.echo"],
        weight=weight,
        metadata={"region": region},
        max_queue=max_queue,
    )

    @app.handler("route.echo")
    async def echo(payload: Any, ctx: Context) -> str:
        if delay_s:
            await anyio.sleep(delay_s)
        if fail:
            raise RuntimeError(f"{agent_id} is broken")
        return ctx.agent_id

    return app


def heavy() -> Agent:
    return _echo("heavy", weight=4)


def light() -> Agent:
    return _echo("light", weight=1, region="us")


def fast() -> Agent:
    return _echo("fast")


def slow() -> Agent:
    return _echo("slow", delay_s=0.05)


def broken() -> Agent:
    return _echo("broken", fail=True)


def ring_a() -> Agent:
    return _echo("ring-a")


def ring_b() -> Agent:
    return _echo("ring-b")


def ring_c() -> Agent:
    return _echo("ring-c")


def bounded() -> Agent:
    return _echo("bounded", delay_s=0.3, max_queue=2)


def cap_small() -> Agent:
    """Run with ``--concurrency 2`` beside :func:`cap_big` (capacity routing)."""
    return _echo("cap-small", delay_s=0.4)


def cap_big() -> Agent:
    """Run with ``--concurrency 16`` beside :func:`cap_small`."""
    return _echo("cap-big", delay_s=0.4)


def cost_fast() -> Agent:
    """Run with ``--concurrency 2`` beside :func:`cost_slow` (cost-aware routing)."""
    return _echo("cost-fast", delay_s=0.1)


def cost_slow() -> Agent:
    """Twice as slow as :func:`cost_fast`, the same slots."""
    return _echo("cost-slow", delay_s=0.2)

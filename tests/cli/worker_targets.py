"""Things `reach worker MODULE:ATTR` may be pointed at by mistake (and one good factory)."""

from __future__ import annotations

from typing import Any

from reach import Agent, Context

app = Agent("targets-1", capabilities=["test.targets"])
NOT_AN_AGENT = 42


@app.handler("test.targets")
def handler_function(payload: Any, ctx: Context) -> Any:
    """A handler: what a user may point the worker at instead of the Agent."""
    return payload


async def async_handler(payload: Any, ctx: Context) -> Any:
    return payload


def factory_of_a_string() -> str:
    return "not an agent"


def factory() -> Agent:
    return app

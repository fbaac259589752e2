"""Agents with hostile handlers, run as real `reach worker` processes.

``x1``, ``x2``, ``x3`` serve:

* ``hostile.echo`` - answers (the probe that a worker still serves);
* ``hostile.raise`` / ``hostile.raise_sync`` / ``hostile.raise_stream`` - raise the
  exception named by ``payload["exc"]`` (one of :data:`EXCEPTIONS`: ``BaseException``
  subclasses a handler has no business raising) from an async handler, a plain one (run
  in a thread) and an async generator (after one chunk); each run is counted per
  idempotency key in the ``hostile`` effects hash;
* ``hostile.block`` - blocks the event loop (``time.sleep`` inside an async handler) for
  ``payload["sleep_s"]``, counting each start first.

``typed`` serves ``typed.dict`` (``payload: dict``), ``typed.struct`` (a msgspec Struct),
``typed.typeddict`` and ``typed.dataclass``, each counting its runs like the above.
``half`` declares a capability it has no handler for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any, TypedDict

import anyio
import msgspec

from reach import Agent, Context

EXCEPTIONS: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
    "CancelledError": asyncio.CancelledError,
    "BaseException": BaseException,
}

CAPS = ["hostile.echo", "hostile.raise", "hostile.raise_sync", "hostile.raise_stream"]


async def _count_async(ctx: Context) -> None:
    await ctx.redis.hincrby(ctx.keys.effects("hostile"), ctx.idempotency_key, 1)


def _worker(agent_id: str, *, block: bool = False) -> Agent:
    app = Agent(agent_id, capabilities=[*CAPS, "hostile.block"] if block else CAPS)

    @app.handler("hostile.echo")
    async def echo(payload: Any, ctx: Context) -> dict[str, Any]:
        return {"echo": payload, "agent": ctx.agent_id}

    @app.handler("hostile.raise")
    async def raise_async(payload: Any, ctx: Context) -> None:
        await _count_async(ctx)
        raise EXCEPTIONS[payload["exc"]](f"raised on purpose by {ctx.agent_id}")

    @app.handler("hostile.raise_sync")
    def raise_sync(payload: Any, ctx: Context) -> None:
        anyio.from_thread.run(_count_async, ctx)
        raise EXCEPTIONS[payload["exc"]](f"raised on purpose by {ctx.agent_id}")

    @app.handler("hostile.raise_stream")
    async def raise_stream(payload: Any, ctx: Context) -> AsyncIterator[str]:
        await _count_async(ctx)
        yield "first"
        raise EXCEPTIONS[payload["exc"]](f"raised on purpose by {ctx.agent_id}")

    if block:

        @app.handler("hostile.block")
        async def block_loop(payload: Any, ctx: Context) -> str:
            await _count_async(ctx)  # counted before the loop stops
            time.sleep(float(payload["sleep_s"]))  # noqa: ASYNC251 - blocking on purpose
            return ctx.agent_id

    return app


def x1() -> Agent:
    return _worker("x1")


def x2() -> Agent:
    return _worker("x2")


def x3() -> Agent:
    return _worker("x3")


def b1() -> Agent:
    return _worker("b1", block=True)


def b2() -> Agent:
    return _worker("b2", block=True)


def b3() -> Agent:
    return _worker("b3", block=True)


class Point(msgspec.Struct):
    x: int
    y: int


class Named(TypedDict):
    name: str
    count: int


@dataclasses.dataclass
class Item:
    sku: str
    qty: int


TYPED_CAPS = ["typed.dict", "typed.struct", "typed.typeddict", "typed.dataclass"]


def typed() -> Agent:
    app = Agent("typed", capabilities=TYPED_CAPS)

    @app.handler("typed.dict")
    async def with_dict(payload: dict, ctx: Context) -> list[str]:  # type: ignore[type-arg]
        await _count_async(ctx)
        return sorted(payload.keys())

    @app.handler("typed.struct")
    async def with_struct(payload: Point, ctx: Context) -> int:
        await _count_async(ctx)
        return payload.x + payload.y

    @app.handler("typed.typeddict")
    async def with_typeddict(payload: Named, ctx: Context) -> str:
        await _count_async(ctx)
        return payload["name"] * payload["count"]

    @app.handler("typed.dataclass")
    async def with_dataclass(payload: Item, ctx: Context) -> int:
        await _count_async(ctx)
        return payload.qty

    return app


def half() -> Agent:
    app = Agent("half", capabilities=["half.done", "half.missing"])

    @app.handler("half.done")
    async def done(payload: Any, ctx: Context) -> str:
        return "done"

    return app

"""The agent of the cancellation tests (in-process, and ``reach worker
tests.support.agents_cancel:app`` in a child process).

Every handler counts what it did in Redis (``Keys(ns).effects(name)``, field = the
message's idempotency key), so a test can tell whether a cancelled message ran at all,
whether a running one saw ``ctx.cancelled`` and whether it was cut before its end:

* ``can.work``: one side effect (``work``), returns at once;
* ``can.hold``: ``started``, then waits for ``ctx.cancelled`` (or ``payload`` seconds),
  then ``saw_cancel`` (the wall-clock ms when it saw it in ``saw_ms``);
* ``can.stubborn``: ``started``, then ignores ``ctx.cancelled`` and sleeps ``payload``
  seconds, then ``finished``: a cut handler never gets there;
* ``can.stream``: emits a chunk every 10 ms until ``ctx.cancelled``;
* ``can.parent``: sends a ``can.hold`` child through ``ctx.client`` (its msg_id stored in
  ``Keys(ns).effects('child_of')`` under the parent's key), then waits for its own cancel.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

from reach import Agent, Context
from tests.support.agents_messaging import bump

CAPS = ["can.work", "can.hold", "can.stubborn", "can.parent", "can.stream"]


def make(agent_id: str = "can-1") -> Agent:
    app = Agent(agent_id, capabilities=CAPS)

    @app.handler("can.work")
    async def work(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "work")
        return payload

    @app.handler("can.hold")
    async def hold(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "started")
        with anyio.move_on_after(float(payload or 60)):
            await ctx.wait_cancelled()
        if ctx.cancelled:
            now_ms = int(time.time() * 1000)
            await ctx.redis.hset(ctx.keys.effects("saw_ms"), ctx.idempotency_key, now_ms)
            await bump(ctx, "saw_cancel")
        return "held"

    @app.handler("can.stubborn")
    async def stubborn(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "started")
        await anyio.sleep(float(payload or 60))  # ctx.cancelled ignored: cut at the grace
        await bump(ctx, "finished")
        return "finished"

    @app.handler("can.parent")
    async def parent(payload: Any, ctx: Context) -> Any:
        child = await ctx.client.send("can.hold", 60)
        await ctx.redis.hset(ctx.keys.effects("child_of"), ctx.idempotency_key, child)
        await bump(ctx, "started")
        await ctx.wait_cancelled()
        return "parent cancelled"

    @app.handler("can.stream")
    async def stream(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "started")
        i = 0
        while not ctx.cancelled:
            await ctx.emit(i)
            i += 1
            await anyio.sleep(0.01)
        await bump(ctx, "saw_cancel")
        return "stopped"

    return app


def app() -> Agent:
    """The factory ``reach worker`` runs (agent id from ``REACH_TEST_AGENT_ID``)."""
    return make(os.environ.get("REACH_TEST_AGENT_ID", "can-p"))


def preempt_app() -> Agent:
    """``pre.low`` (sleeps ``payload`` s, counts ``started``/``finished``) and ``pre.high``,
    for ``reach worker ... --preempt-after-s``."""
    app = Agent(
        os.environ.get("REACH_TEST_AGENT_ID", "pre-p"), capabilities=["pre.low", "pre.high"]
    )

    @app.handler("pre.low")
    async def low(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "started")
        await anyio.sleep(float(payload))
        await bump(ctx, "finished")
        return ctx.attempt

    @app.handler("pre.high")
    async def high(payload: Any, ctx: Context) -> Any:
        return "high"

    return app

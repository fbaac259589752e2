"""The agent of the watch tests (``reach worker tests.support.agents_watch:app``, or in
process through :func:`make`).

* ``watch.hold``: counts ``held`` (effects, field = its key), then holds its slot until
  the test opens the gate (``Keys(ns).effects('gate')``, field = the payload), and
  returns ``"held"``. Run with ``--concurrency 1``, it keeps a message sent after it
  pending for as long as the test needs.
* ``watch.steps``: waits until its own record says ``running`` (so its first progress
  report follows the running change: a message claimed at send is marked running just
  after its handler starts), then reports each ``[fraction, note]`` of its payload with
  ``ctx.progress`` and returns how many it reported.
* ``watch.fail``: waits as ``watch.steps`` does, reports 0.5, then refuses the message (``reach.Reject``): it ends dead.
"""

from __future__ import annotations

from typing import Any

import anyio

from reach import Agent, Context, Reject
from tests.support.agents_messaging import bump

CAPS = ["watch.hold", "watch.steps", "watch.fail"]
WAIT_S = 60.0


async def _until(probe: Any) -> None:
    # A worker handler has no event for a field another process writes: it looks every
    # 10 ms, within a bound, so a test that forgot its gate fails instead of hanging.
    with anyio.fail_after(WAIT_S):
        while not await probe():
            await anyio.sleep(0.01)


async def _running(ctx: Context) -> None:
    """Return once the handler's own record says ``running``."""
    record = ctx.keys.idem(ctx.envelope.key)

    async def running() -> bool:
        return await ctx.redis.hget(record, "status") == b"running"

    await _until(running)


def make(agent_id: str = "watch-1") -> Agent:
    a = Agent(agent_id, capabilities=CAPS)

    @a.handler("watch.hold")
    async def hold(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "held")

        async def opened() -> bool:
            return bool(await ctx.redis.hget(ctx.keys.effects("gate"), str(payload)))

        await _until(opened)
        return "held"

    @a.handler("watch.steps")
    async def steps(payload: Any, ctx: Context) -> Any:
        await _running(ctx)
        for fraction, note in payload:
            await ctx.progress(fraction, note)
        return len(payload)

    @a.handler("watch.fail")
    async def fail(payload: Any, ctx: Context) -> Any:
        await _running(ctx)
        await ctx.progress(0.5, "halfway")
        raise Reject("this message is refused on purpose")

    return a


def app() -> Agent:
    return make()

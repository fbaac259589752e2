"""Priority preemption (issue 14, item 3): an agent saturated with low-priority work makes
room for a high-priority message within a bounded time by cutting a low-priority run and
requeueing it (its attempt not counted); a non-preemptible handler is never cut; a message
preempted max_preempts times runs to its end (aging), so low priority completes too."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from reach import Agent, Context
from reach.connection import AnyRedis
from tests.integration.test_cancel import wait_effect
from tests.support.agents_messaging import bump, effects, serving, wait_status

pytestmark = pytest.mark.anyio


def agent() -> Agent:
    app = Agent("pre-1", capabilities=["pre.low", "pre.fixed", "pre.high"])

    @app.handler("pre.low")
    async def low(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "started")
        await anyio.sleep(float(payload))
        await bump(ctx, "finished")
        return ctx.attempt

    @app.handler("pre.fixed", preemptible=False)
    async def fixed(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "started")
        await anyio.sleep(float(payload))
        await bump(ctx, "finished")
        return ctx.attempt

    @app.handler("pre.high")
    async def high(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "high")
        return "high"

    return app


OPTS: dict[str, Any] = {"concurrency": 2, "prefetch": 0, "preempt_after_s": 0.1}


async def test_a_high_message_preempts_low_work_which_still_completes(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, agent(), max_preempts=1, **OPTS) as client:
        lows = [await client.send("pre.low", 2.0, priority="low") for _ in range(2)]
        for m in lows:
            await wait_effect(r, ns, "started", m)  # both slots taken by low work
        t0 = time.monotonic()
        assert await client.request("pre.high", None, priority="high", timeout_s=30) == "high"
        waited = time.monotonic() - t0
        assert waited < 1.5, waited  # not the 2 s a low run takes: one was cut for it
        # The preempted one went back and ran again to its end (max_preempts=1: then it
        # is no longer preemptible), its attempt not counted.
        for m in lows:
            st = await wait_status(client, m, "succeeded", timeout=30)
            assert st.attempt == 1
        started = await effects(r, ns, "started")
        assert sorted(started[m] for m in lows) == [1, 2]  # one was run twice
        assert await effects(r, ns, "finished") == {m: 1 for m in lows}


async def test_a_non_preemptible_handler_is_not_cut(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, agent(), **OPTS) as client:
        fixed = [await client.send("pre.fixed", 1.5, priority="low") for _ in range(2)]
        for m in fixed:
            await wait_effect(r, ns, "started", m)
        t0 = time.monotonic()
        assert await client.request("pre.high", None, priority="high", timeout_s=30) == "high"
        assert time.monotonic() - t0 >= 0.5  # it waited for a run to end
        started = await effects(r, ns, "started")
        assert [started[m] for m in fixed] == [1, 1]  # none was cut


async def test_without_the_option_nothing_is_preempted(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    opts = {**OPTS, "preempt_after_s": None}
    async with serving(redis_url, ns, agent(), **opts) as client:
        lows = [await client.send("pre.low", 1.5, priority="low") for _ in range(2)]
        for m in lows:
            await wait_effect(r, ns, "started", m)
        t0 = time.monotonic()
        assert await client.request("pre.high", None, priority="high", timeout_s=30) == "high"
        assert time.monotonic() - t0 >= 0.5
        assert set((await effects(r, ns, "started")).values()) == {1}

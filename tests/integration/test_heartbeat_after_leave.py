"""A heartbeat answer that comes back after its agent left is not acted on.

The heartbeat thread sends a round, the agent stops cleanly meanwhile (it leaves the
thread, then deregisters), and the round's answer comes back NOT_REGISTERED: acting on
it would register the stopped agent again, left in the registry until its lease ran out
and routed to meanwhile (a test of five agents hosted in one process saw one of them
still registered after all had stopped). Here the late answer is handed to the agent
after its clean stop, as the thread would hand it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis

from reach import Agent, Context
from reach.registry import Registry
from reach.scripts.agents import Heartbeat
from reach.scripts.codes import HeartbeatCode
from tests.support.agents_messaging import serving

pytestmark = pytest.mark.anyio


async def test_a_not_registered_answer_after_the_clean_stop_registers_nothing(
    redis_url: str, ns: str
) -> None:
    app = Agent("hb-left", capabilities=["hb.echo"])

    @app.handler("hb.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return payload

    sync: Any = redis.Redis.from_url(redis_url)
    try:
        async with serving(redis_url, ns, app) as client:
            rt = app._runtime
            assert rt is not None
            liveness = rt.readiness.liveness
            reg = Registry(client.redis, ns)
            assert await reg.get("hb-left") is not None
            liveness.stop_heartbeat()  # the clean stop's order: leave the thread...
            await liveness.leave()  # ... then deregister
            assert await reg.get("hb-left") is None
            late = Heartbeat(HeartbeatCode.NOT_REGISTERED)
            acted = await anyio.to_thread.run_sync(liveness.answered, lambda: sync, late)
            assert acted is False  # the thread stops beating for it
            assert await reg.get("hb-left") is None  # and it stays deregistered
    finally:
        sync.close()

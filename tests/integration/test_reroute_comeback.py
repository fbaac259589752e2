"""An evicted agent whose inbox the sweeper moves while a caller's view still routes to
it (it came back, or the view has not read the eviction yet): the entries placed back
into its own inbox are not moved again, and the move ends."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis
from reach.envelope import encode
from reach.keys import Keys
from reach.registry import Registry
from reach.sweeper import reroute_evicted
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_recovery")
    yield w
    w.stop_all()


async def test_a_move_into_the_evicted_agents_own_inbox_is_not_moved_again(
    workers: Workers, redis_url: str, r: AnyRedis, ns: str
) -> None:
    keys, reg = Keys(ns), Registry(r, ns)
    # A long lease: paused, the agent stays the one the Client's view routes to.
    p = workers.start("w1", "--lease-s", "60", "--evict-after-s", "120")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:

        async def up() -> bool:
            return bool(await reg.agents("rec.work", ready=True, state="active"))

        await wait_until(up, timeout_s=30, what="rec-1 ready")
        c.invalidate()
        await c.eligible("rec.work")  # the view holds rec-1 as active
        p.send_signal(signal.SIGSTOP)
        try:
            envs = [c.build("rec.work", {"sleep_s": 0}, reply=False) for _ in range(3)]
            for env in envs:
                await r.xadd(keys.inbox("rec-1", "normal"), {"e": encode(env)})
            # The record says evicted; the view has not read it (no event was written).
            await r.hset(keys.agent("rec-1"), "state", "evicted")
            await r.sadd(reg.keys.reroute_of(0), "rec-1")
            with anyio.fail_after(20):
                moved = await reroute_evicted(r, keys, c, reg)
        finally:
            p.send_signal(signal.SIGCONT)
    assert moved.rerouted == 3
    assert sum([int(await r.xlen(k)) for k in keys.inboxes("rec-1")]) == 3

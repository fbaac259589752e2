"""Scheduled sends survive every process restarting, and Redis restarting from its AOF
(issue 29, item 2): sends scheduled while a real ``reach worker`` runs are kept in Redis
only; the worker is SIGKILLed, the caller gone, Redis SIGKILLed and started again from its
AOF; a new worker process then delivers each one, once (side effects counted in Redis:
tests/support/agents_schedule.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reach import Client
from reach.connection import connect
from reach.embedded import RedisServer
from reach.keys import Keys
from tests.support.agents_messaging import effects, wait_eligible
from tests.support.agents_schedule import CAP
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

N = 20
DELAY_S = 5.0  # the restarts below happen well before: nothing is due while nobody runs


@pytest.fixture
def workers(fresh_redis: RedisServer, ns: str) -> Iterator[Workers]:
    w = Workers(fresh_redis.url, ns, "tests.support.agents_schedule")
    yield w
    w.stop_all()


async def test_scheduled_sends_survive_every_process_and_redis_restarting(
    fresh_redis: RedisServer, ns: str, workers: Workers
) -> None:
    k = Keys(ns)
    first = workers.start("app")
    async with Client(redis_url=fresh_redis.url, namespace=ns) as c:
        await wait_eligible(c, CAP, ["sch-1"], timeout=30)
        ids = [await c.send(CAP, i, delay_s=DELAY_S) for i in range(N)]
    first.kill()  # SIGKILL: the worker that would have moved them is gone
    first.wait(timeout=10)

    r = await connect(fresh_redis.url)
    try:
        assert await r.zcard(k.scheduled) == N  # nothing was due yet: all kept in Redis
        fresh_redis.restart()  # SIGKILL, then started again from the AOF
        await r.connection_pool.disconnect()
        assert await r.zcard(k.scheduled) == N
        assert await r.hlen(k.scheduled_envelopes) == N

        workers.start("app")  # a new process: it finds them and sends them when due
        async with Client(redis_url=fresh_redis.url, namespace=ns) as c:
            assert {(await c.task(m)).status for m in ids} <= {
                "scheduled",
                "pending",
                "running",
                "succeeded",
            }

            async def all_ran() -> bool:
                return len(await effects(r, ns, "work")) == N

            await wait_until(all_ran, timeout_s=60, what="every scheduled send ran")

            async def all_settled() -> bool:
                done = [(await c.task(m)).status == "succeeded" for m in ids]
                return all(done) and await r.zcard(k.scheduled) == 0

            await wait_until(all_settled, timeout_s=30, what="every scheduled send settled")
        counts = await effects(r, ns, "work")
        assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}
    finally:
        await r.aclose()

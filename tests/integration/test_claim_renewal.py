"""A handler that runs longer than its claim's lease keeps its key, with real `reach
worker` processes: its runtime renews the claim (renew.lua) while it runs, so a second
copy of the message (a resend with the same idempotency key, here to another agent) sent
after the first lease would have run out waits and replays the first run's result instead
of running beside it. Standalone Redis (one renewal call per batch) and a Redis Cluster
(one call per key)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.envelope import scoped_key
from reach.keys import Keys
from reach.registry import Registry
from tests.support.cluster import RedisTestCluster
from tests.support.draining import assert_ran_once, running, start
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

LEASE = ["--claim-lease-s", "1"]


async def _resend_past_the_lease(r: AnyRedis, url: str, ns: str) -> None:
    w = Workers(url, ns, "tests.support.agents_lifecycle")
    try:
        reg = Registry(r, ns)
        await start(w, reg, ["sleeper-a", "sleeper-b"], *LEASE)
        got: list[Any] = []
        async with Client(redis_url=url, namespace=ns) as c:

            async def call(target: str) -> None:
                got.append(
                    await c.request(
                        "test.sleep",
                        {"seconds": 4},
                        timeout_s=60,
                        idempotency_key="long-one",
                        target=target,
                    )
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "sleeper-a")
                key, agent = await running(r, ns, "sleep")
                assert agent == "sleeper-a"
                rec = Keys(ns).idem(scoped_key("test.sleep", "long-one"))  # unsigned: no identity

                async def claimed_by_the_runtime() -> bool:
                    # a claim made at send has the caller's 60 s lease until start.lua
                    # gives it the runtime's own, 10 ms into the run
                    return await r.hget(rec, "status") == b"running"

                await wait_until(claimed_by_the_runtime, what="the claim marked running")
                first = int(await r.hget(rec, "lease_until") or 0)

                async def past_the_first_lease() -> bool:
                    now_s, now_us = await r.time()  # the server's clock, as the lease's
                    return int(now_s) * 1000 + int(now_us) // 1000 > first + 200

                await wait_until(past_the_first_lease, what="the first lease over")
                assert int(await r.hget(rec, "lease_until") or 0) > first, "renewed"
                tg.start_soon(call, "sleeper-b")  # a copy, after the first lease
            assert got == [{"agent": "sleeper-a", "slept": 4}] * 2
            assert await r.hmget(rec, "status", "runs") == [b"succeeded", b"1"]
        await assert_ran_once(r, ns, "sleep", key)
    finally:
        w.stop_all()


async def test_a_handler_longer_than_its_claim_lease_keeps_its_key(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    """Failed before the claims were renewed: the copy claimed the key once the 1 s lease
    had run out and ran the message on sleeper-b beside the first run (started 2)."""
    await _resend_past_the_lease(r, redis_url, ns)


@pytest.mark.cluster
async def test_a_handler_longer_than_its_claim_lease_keeps_its_key_on_a_cluster(
    redis_cluster: RedisTestCluster, ns: str
) -> None:
    r = await connect(redis_cluster.url)
    try:
        await _resend_past_the_lease(r, redis_cluster.url, ns)
    finally:
        await r.aclose()

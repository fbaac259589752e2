"""Routing by free capacity (docs/routing.md, *Free capacity*), with real worker processes:
an agent at ``--concurrency 2`` beside one at ``--concurrency 16``, 120 requests of 0.4 s
sent at once with a 6 s deadline. Split by capacity the 18 slots drain them in ~2.7 s;
split evenly the small agent would hold 60 for 12 s and half of them would miss the
deadline while the big one idles."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import anyio
import pytest

import reach
from reach.client import Client
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_routing")
    yield w
    w.stop_all()


async def ready(c: Client, *ids: str) -> None:
    with anyio.fail_after(60):
        while True:
            c.invalidate()
            try:
                got = {a.agent_id: a for a in await c.eligible("route.echo")}
            except reach.NoAgentAvailable:
                got = {}
            if set(ids) <= set(got) and all(got[i].slots for i in ids):
                return
            await anyio.sleep(0.05)


@pytest.mark.parametrize("policy", ["weighted_rr", "least_conn"])
async def test_a_full_agent_is_passed_over_while_another_has_room(
    workers: Workers, redis_url: str, ns: str, policy: str
) -> None:
    workers.start("cap_small", "--concurrency", "2")
    workers.start("cap_big", "--concurrency", "16")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "cap-small", "cap-big")
        assert {a.agent_id: a.slots for a in await c.eligible("route.echo")} == {
            "cap-small": 2,
            "cap-big": 16,
        }
        got: Counter[str] = Counter()
        failed: list[BaseException] = []

        async def one(i: int) -> None:
            try:
                got[await c.request("route.echo", i, timeout_s=6, policy=policy)] += 1
            except reach.ReachError as e:
                failed.append(e)

        async with anyio.create_task_group() as tg:
            for i in range(120):
                tg.start_soon(one, i)
        # the heartbeats report the handlers' mean run time (the expected wait's factor)
        with anyio.fail_after(30):
            while not (big := await c.registry.get("cap-big")) or not big.handler_us:
                await anyio.sleep(0.05)
        assert 350_000 <= big.handler_us <= 3_000_000, big.handler_us
    assert failed == []
    assert sum(got.values()) == 120
    # by capacity, 2:16 -> 13.3 : 106.7 (an even split would give 60 : 60)
    assert 6 <= got["cap-small"] <= 24, got

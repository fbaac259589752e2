"""A targeted send (``target=``) that misses the client's registry view re-reads the target
from Redis once before refusing: a worker started while the Client runs is in Redis (and
in ``reach agents``) before its events reach the view."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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


def miss_events_of(c: Client, agent_id: str) -> None:
    """Make the view's event tail pass over ``agent_id``'s events: the moment between a
    registration and the view reading its event (one round trip on a standalone Redis, a
    poll period on a Cluster), made as long as the test needs."""
    view = c.view
    named = view._named

    def without(res: Any, tail: Any) -> set[str]:
        return named(res, tail) - {agent_id}

    view._named = without  # type: ignore[method-assign]


async def active_in_redis(c: Client, agent_id: str) -> None:
    with anyio.fail_after(60):
        while True:
            a = await c.registry.get(agent_id)
            if a is not None and a.routable:
                return
            await anyio.sleep(0.02)


async def test_a_worker_started_after_the_client_is_found_for_a_targeted_send(
    workers: Workers, redis_url: str, ns: str
) -> None:
    workers.start("ring_a")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await active_in_redis(c, "ring-a")
        with anyio.fail_after(30):
            while True:  # the client routes: its view holds the capability and tails events
                try:
                    assert await c.request("route.echo", 0, timeout_s=10) == "ring-a"
                    break
                except reach.NoAgentAvailable:
                    await anyio.sleep(0.05)
        miss_events_of(c, "ring-b")
        workers.start("ring_b")
        await active_in_redis(c, "ring-b")  # what `reach agents` shows
        assert "ring-b" not in {a.agent_id for a in await c.eligible("route.echo")}
        assert await c.request("route.echo", 1, target="ring-b", timeout_s=10) == "ring-b"
        # send_many with a target re-reads it the same way
        miss_events_of(c, "ring-c")
        workers.start("ring_c")
        await active_in_redis(c, "ring-c")
        sent = await c.send_many("route.echo", [1, 2], target="ring-c")
        assert all(isinstance(x, str) for x in sent), sent
        # a target that does not exist is still refused, after the one re-read
        with pytest.raises(reach.NoAgentAvailable, match="not registered"):
            await c.request("route.echo", 2, target="ring-z", timeout_s=5)

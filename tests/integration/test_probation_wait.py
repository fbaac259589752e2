"""Right after a Redis restart an agent is on probation (its lease ran out while Redis was
away) until its next heartbeat: it is not gone. A request with deadline budget waits for
it (or any agent) within its deadline instead of failing at once with NoAgentAvailable."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio
import pytest

import reach
from reach.client import Client
from reach.embedded import RedisServer
from reach.registry import Registry
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

# A heartbeat every 2 s: after the restart the agent stays on probation for up to 2 s.
SLOW_BEATS = ["--heartbeat-s", "2", "--lease-s", "2.5", "--evict-after-s", "60"]


@pytest.fixture
def workers(fresh_redis: RedisServer, ns: str) -> Iterator[Workers]:
    w = Workers(fresh_redis.url, ns, "tests.support.agents_routing")
    yield w
    w.stop_all()


async def outage(server: RedisServer) -> None:
    """SIGKILL the server, keep it away longer than the lease (2.5 s), start it again
    from its AOF on the same port."""
    server.kill()
    await anyio.sleep(3.0)  # the outage itself, not a wait for an event
    server.start()


async def state_in_view(c: Client, state: str) -> None:
    with anyio.fail_after(30):
        while True:
            try:
                agents, _ = await c.view.candidates("route.echo")
            except reach.ReachError:
                agents = []
            if any(a.state == state for a in agents):
                return
            await anyio.sleep(0.01)


async def test_requests_right_after_a_restart_wait_for_the_agent_on_probation(
    workers: Workers, fresh_redis: RedisServer, ns: str
) -> None:
    workers.start("fast", *SLOW_BEATS)
    async with Client(redis_url=fresh_redis.url, namespace=ns, slow_start_s=0) as c:
        with anyio.fail_after(60):
            while True:
                try:
                    assert await c.request("route.echo", 0, timeout_s=10) == "fast"
                    break
                except reach.NoAgentAvailable:
                    await anyio.sleep(0.05)
        await outage(fresh_redis)
        reg = Registry(c.redis, ns)
        await reg.sweep()  # what any sweeper does first: the missed lease -> probation
        agent = await reg.get("fast")
        assert agent is not None and agent.state == "probation"
        await state_in_view(c, "probation")
        got: list[object] = []
        failed: list[BaseException] = []

        async def one(i: int) -> None:
            try:
                got.append(await c.request("route.echo", i, timeout_s=10))
            except reach.ReachError as e:
                failed.append(e)

        async def batch() -> None:
            got.extend(await c.request_many("route.echo", [10, 11], timeout_s=10))

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(one, i)
            tg.start_soon(batch)
        assert failed == [], failed
        assert got == ["fast"] * 6
        assert time.monotonic() - t0 < 9  # answered once the agent heartbeat, not at the end
        # No budget to wait in: the refusal is still immediate and says why
        await outage(fresh_redis)
        await reg.sweep()
        await state_in_view(c, "probation")
        with pytest.raises(reach.NoAgentAvailable, match="probation"):
            await c.send("route.echo", 1)
        # with a fallback, the fallback answers at once (no wait up to the 10 s deadline)
        c.fallback = lambda capability, payload: "fallback"
        t0 = time.monotonic()
        assert await c.request("route.echo", 2, timeout_s=10) in ("fallback", "fast")
        assert time.monotonic() - t0 < 1.5

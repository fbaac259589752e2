"""hedge_after_s with real worker processes: a request stuck on a stalled agent is
answered by the hedge sent to another agent and the stalled copy is cancelled; a request
answered in time sends no hedge; a first copy that fails is not hedged; a capability not
declared idempotent refuses hedging before anything is sent."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from reach import ConfigError, RemoteError
from reach.client import Client
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.registry import Registry
from tests.support.agents_hedge import CHARGE, LOOKUP
from tests.support.agents_messaging import effects
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

GENEROUS_S = 60  # each call here ends long before; reaching it means it waited for a copy


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_hedge")
    yield w
    w.stop_all()


async def ready(r: AnyRedis, ns: str, *agent_ids: str) -> None:
    reg = Registry(r, ns)

    async def probe() -> bool:
        infos = [await reg.get(a) for a in agent_ids]
        return all(i is not None and i.ready for i in infos)

    await wait_until(probe, what=f"{agent_ids} ready")


async def test_a_stalled_request_is_answered_by_its_hedge_and_the_stalled_copy_cancelled(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """The first copy reaches the only agent (60 s); the hedge waits until another agent
    is eligible, goes there, answers, and the first copy is cancelled."""
    workers.start("stalled")
    await ready(r, ns, "stalled")
    got: list[object] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                with anyio.fail_after(GENEROUS_S):
                    got.append(await c.request(LOOKUP, "k1", timeout_s=120, hedge_after_s=0.3))

            tg.start_soon(ask)

            async def stalled_started() -> bool:
                return (await effects(r, ns, "hedge.started")).get("stalled") == 1

            await wait_until(stalled_started, what="the first copy running on 'stalled'")
            workers.start("quick")
        assert got == [{"agent": "quick", "q": "k1"}]

        async def stalled_cancelled() -> bool:
            return (await effects(r, ns, "hedge.cancelled")).get("stalled") == 1

        await wait_until(stalled_cancelled, what="the stalled copy cancelled")
    assert await effects(r, ns, "hedge.started") == {"stalled": 1, "quick": 1}
    assert await effects(r, ns, "hedge.finished") == {"quick": 1}


async def test_an_answer_in_time_sends_no_hedge_and_a_failure_is_not_hedged(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    workers.start("quick")
    await ready(r, ns, "quick")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        with anyio.fail_after(GENEROUS_S):
            assert await c.request(LOOKUP, "k2", hedge_after_s=30) == {"agent": "quick", "q": "k2"}
        assert await effects(r, ns, "hedge.started") == {"quick": 1}
        workers.procs["quick"].terminate()
        workers.procs["quick"].wait(timeout=30)
        workers.start("broken")
        await ready(r, ns, "broken")
        c.invalidate()
        with anyio.fail_after(GENEROUS_S), pytest.raises(RemoteError, match="broken"):
            await c.request(LOOKUP, "k3", hedge_after_s=30, max_attempts=1)
    assert (await effects(r, ns, "hedge.started")).get("broken") == 1


async def test_a_capability_not_declared_idempotent_refuses_hedging_before_sending(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    workers.start("quick")
    await ready(r, ns, "quick")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        with pytest.raises(ConfigError, match="idempotent=True"):
            await c.request(CHARGE, "k4", hedge_after_s=0.1)
        with pytest.raises(ConfigError, match="hedge_after_s"):
            await c.request(LOOKUP, "k5", hedge_after_s=0)
        with pytest.raises(ConfigError, match="target"):
            await c.request(LOOKUP, "k6", hedge_after_s=1, target="quick")
    assert await effects(r, ns, "hedge.started") == {}
    assert await r.xlen(Keys(ns).inbox("quick", "normal")) == 0

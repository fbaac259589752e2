"""Cost-aware routing with real worker processes (docs/routing.md, *Cost-aware routing*):
two agents of equal slots, one twice as slow. Once each has reported its mean run time for
the capability, a burst of requests (all placed before any answer, so this client's
in-flight counts alone cannot tell the two apart) splits about 2:1, not evenly."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import anyio
import pytest

from reach.client import Client
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

CAP = "route.echo"


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_routing")
    yield w
    w.stop_all()


async def test_the_slow_agent_gets_a_smaller_share_once_its_mean_is_known(
    workers: Workers, redis_url: str, ns: str
) -> None:
    workers.start("cost_fast", "--concurrency", "2")
    workers.start("cost_slow", "--concurrency", "2")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:

        async def both_report() -> bool:
            got = {a.agent_id: a for a in await c.registry.agents(CAP)}
            return all(
                i in got and got[i].ready and CAP in got[i].cap_us
                for i in ("cost-fast", "cost-slow")
            )

        async def warm(target: str) -> None:
            async def ready() -> bool:
                a = await c.registry.get(target)
                return a is not None and a.routable

            await wait_until(ready, timeout_s=60, what=f"{target} ready")
            for i in range(4):
                await c.request(CAP, i, target=target, timeout_s=30)

        async with anyio.create_task_group() as tg:
            tg.start_soon(warm, "cost-fast")
            tg.start_soon(warm, "cost-slow")
        await wait_until(both_report, timeout_s=60, what="both means reported")
        means = {a.agent_id: a.cap_us[CAP] for a in await c.registry.agents(CAP)}
        assert 1.5 <= means["cost-slow"] / means["cost-fast"] <= 3.0, means
        c.invalidate()  # route on the records just read
        got: Counter[str] = Counter()

        async def one(i: int) -> None:
            got[await c.request(CAP, i, timeout_s=60, policy="least_conn")] += 1

        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(one, i)
    assert sum(got.values()) == 60
    # by expected time to finish: ~40 : 20 (an even split would be 30 : 30)
    assert 12 <= got["cost-slow"] <= 25, got

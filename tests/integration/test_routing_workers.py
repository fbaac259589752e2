"""Routing across real `reach worker` processes, one test per policy and behaviour."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator

import anyio
import pytest

import reach
from reach.breaker import Breakers
from reach.client import Client
from reach.registry import Registry
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_routing")
    yield w
    w.stop_all()


async def ready(c: Client, *ids: str, timeout_s: float = 30.0) -> None:
    with anyio.fail_after(timeout_s):
        while True:
            c.invalidate()
            try:
                got = {a.agent_id for a in await c.eligible("route.echo")}
            except reach.NoAgentAvailable:
                got = set()
            if set(ids) <= got:
                return
            await anyio.sleep(0.02)


def client(url: str, ns: str, **kw: object) -> Client:
    return Client(redis_url=url, namespace=ns, slow_start_s=0, default_timeout_s=20, **kw)  # type: ignore[arg-type]


async def test_weighted_rr_splits_by_weight(workers: Workers, redis_url: str, ns: str) -> None:
    workers.start("heavy")
    workers.start("light")
    async with client(redis_url, ns) as c:
        await ready(c, "heavy", "light")
        got = Counter([await c.request("route.echo", i) for i in range(200)])
        assert got["heavy"] + got["light"] == 200
        assert 155 <= got["heavy"] <= 165, got  # 4:1 -> 160 / 40
        # where= narrows eligibility before the policy
        only_us = Counter(
            [await c.request("route.echo", i, where={"region": "us"}) for i in range(10)]
        )
        assert only_us == {"light": 10}


async def test_least_conn_gives_a_slow_agent_fewer(
    workers: Workers, redis_url: str, ns: str
) -> None:
    workers.start("fast", "--concurrency", "32")
    workers.start("slow", "--concurrency", "32")
    async with client(redis_url, ns, default_policy="least_conn") as c:
        await ready(c, "fast", "slow")
        got: Counter[str] = Counter()

        async def caller() -> None:
            for i in range(25):
                got[await c.request("route.echo", i)] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(caller)
    assert sum(got.values()) == 200
    assert got["slow"] < got["fast"] / 2, got


async def test_consistent_hash_sticks_and_remaps_only_the_dead_agents_sessions(
    workers: Workers, redis_url: str, ns: str
) -> None:
    for n in ("ring_a", "ring_b", "ring_c"):
        workers.start(n)
    sessions = [f"s{i}" for i in range(60)]
    async with client(redis_url, ns, default_policy="consistent_hash") as c:
        await ready(c, "ring-a", "ring-b", "ring-c")
        owner = {}
        for s in sessions:
            seen = {await c.request("route.echo", 1, session_id=s) for _ in range(3)}
            assert len(seen) == 1, (s, seen)
            owner[s] = seen.pop()
        assert set(owner.values()) == {"ring-a", "ring-b", "ring-c"}
        workers.procs["ring_b"].send_signal(signal.SIGKILL)
        r = c.redis
        reg = Registry(r, ns)
        with anyio.fail_after(20):
            while (a := await reg.get("ring-b")) is not None and a.state != "evicted":
                await anyio.sleep(0.05)
        c.invalidate()
        after = {s: await c.request("route.echo", 1, session_id=s) for s in sessions}
    moved = {s for s in sessions if after[s] != owner[s]}
    assert moved == {s for s in sessions if owner[s] == "ring-b"}
    assert "ring-b" not in after.values()


async def test_broadcast_reaches_every_eligible_agent(
    workers: Workers, redis_url: str, ns: str
) -> None:
    workers.start("heavy")
    workers.start("light")
    workers.start("broken")
    async with client(redis_url, ns) as c:
        await ready(c, "heavy", "light", "broken")
        out = await c.broadcast("route.echo", {"x": 1}, max_attempts=1)
    assert out["heavy"] == "heavy" and out["light"] == "light"
    assert isinstance(out["broken"], reach.RemoteError)
    assert "broken is broken" in str(out["broken"])


async def test_breaker_opens_on_a_failing_agent(workers: Workers, redis_url: str, ns: str) -> None:
    workers.start("broken")
    workers.start("fast")
    clock = [0.0]
    breakers = Breakers(min_requests=3, error_rate=0.5, cooldown_s=5, clock=lambda: clock[0])
    async with client(redis_url, ns, breakers=breakers) as c:
        await ready(c, "broken", "fast")
        results = []
        for i in range(20):
            try:
                results.append(await c.request("route.echo", i, max_attempts=1))
            except reach.RemoteError:
                results.append("error")
        assert breakers.state("broken") == "open"
        assert results.count("error") <= 3  # the window's minimum, then it is skipped
        assert results[-10:] == ["fast"] * 10
        clock[0] += 6  # cool-down over: one half-open probe goes to the broken agent
        probes = [await _try(c) for _ in range(4)]
        assert probes.count("error") == 1
        assert breakers.state("broken") == "open"


async def _try(c: Client) -> str:
    try:
        return str(await c.request("route.echo", 0, max_attempts=1))
    except reach.RemoteError:
        return "error"


async def test_no_agent_reasons_and_fallback(workers: Workers, redis_url: str, ns: str) -> None:
    async with client(redis_url, ns) as c:
        with pytest.raises(reach.NoAgentAvailable) as e:
            await c.request("route.echo", 1)
        assert e.value.reason == "no_agent"
    async with client(redis_url, ns, fallback=lambda cap, p: {"fallback": cap, "got": p}) as c:
        assert await c.request("route.echo", 7) == {"fallback": "route.echo", "got": 7}
    workers.start("fast")
    async with client(redis_url, ns) as c:
        await ready(c, "fast")
        with pytest.raises(reach.NoAgentAvailable) as e:
            await c.request("route.echo", 1, where={"region": "mars"})
        assert e.value.reason == "filter"
        await Registry(c.redis, ns).drain("fast")
        c.invalidate()
        with pytest.raises(reach.NoAgentAvailable) as e:
            await c.request("route.echo", 1)
        assert e.value.reason in ("draining", "no_agent")  # it may already have left


async def test_back_pressure_fails_fast_with_overloaded(
    workers: Workers, redis_url: str, ns: str
) -> None:
    workers.start("bounded", "--concurrency", "1")
    async with client(redis_url, ns) as c:
        await ready(c, "bounded")
        outcomes: list[str] = []

        async def one() -> None:
            try:
                outcomes.append(await c.request("route.echo", 1))
            except reach.Overloaded as e:
                assert e.reason == "overloaded"
                outcomes.append("overloaded")

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(one)
    assert outcomes.count("bounded") == 2, outcomes
    assert outcomes.count("overloaded") == 3, outcomes

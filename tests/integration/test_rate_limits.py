"""Rate limits per capability (issue 14, item 4): set by an operator, taken by every worker
from one GCRA state in Redis before a batch starts, so the handlers of a capability start
no more often than the limit however many callers and agents there are. Messages over the
limit wait in the delayed set (their attempt not counted) and all run, once each."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from reach import Agent, Client, ConfigError, Context, DeadlineExceeded, RateLimited
from reach.keys import Keys
from reach.limits import parse_limit, set_limit
from tests.support.agents_messaging import bump, effects, serving, wait_eligible
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

CAP = "rl.work"
RATE = 20  # starts per second
CALLERS, EACH = 20, 3


def limited_agent(agent_id: str, starts: list[float]) -> Agent:
    app = Agent(agent_id, capabilities=[CAP])

    @app.handler(CAP)
    async def work(payload: Any, ctx: Context) -> Any:
        starts.append(time.monotonic())
        await bump(ctx, "rl")
        return payload

    return app


async def test_twenty_callers_over_two_agents_keep_to_the_limit(redis_url: str, ns: str) -> None:
    starts: list[float] = []
    agents = [limited_agent("rl-1", starts), limited_agent("rl-2", starts)]
    async with serving(redis_url, ns, *agents) as client:
        await set_limit(client.redis, Keys(ns), CAP, parse_limit(f"{RATE}/s"))
        await anyio.sleep(1.1)  # every worker has read the limit (they re-read each second)
        starts.clear()

        async def caller(c: int) -> None:
            for i in range(EACH):
                assert await client.request(CAP, [c, i], timeout_s=60) == [c, i]

        async with anyio.create_task_group() as tg:
            for c in range(CALLERS):
                tg.start_soon(caller, c)
        n = CALLERS * EACH
        done = await effects(client.redis, ns, "rl")
        assert len(done) == n and set(done.values()) == {1}  # every message, once
    assert len(starts) == n
    starts.sort()
    # In any one-second window: at most RATE + 1 starts (GCRA with a burst of 1), plus one
    # for the few ms between a start's token and its handler's first line.
    worst = max(sum(1 for t in starts[i:] if t < s + 1.0) for i, s in enumerate(starts))
    assert worst <= RATE + 2, worst
    # and the limit did hold them back: 60 starts at 20/s take about 3 s, not a burst
    assert starts[-1] - starts[0] >= (n - 1) / RATE - 0.5


async def test_a_capability_without_a_limit_takes_nothing(redis_url: str, ns: str) -> None:
    # Another capability's limit is no limit for this one: its messages never meet
    # rate_limit.lua (which would leave the limit's state behind) and never wait.
    starts: list[float] = []
    async with serving(redis_url, ns, limited_agent("rl-3", starts)) as client:
        k = Keys(ns)
        await set_limit(client.redis, k, "rl.other", parse_limit("1/m"))
        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(client.request, CAP, i)
        assert len(starts) == 60
        assert await client.redis.exists(k.rate_state(CAP), k.rate_state("rl.other")) == 0
        assert await client.redis.zcard(k.delayed) == 0


def worst_window(times: list[float]) -> int:
    """The most starts in any one-second window."""
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t < s + 1.0) for i, s in enumerate(times))


async def test_a_limit_holds_across_worker_processes(redis_url: str, ns: str) -> None:
    # Two `reach worker` processes serve the capability; an operator's limit applies to
    # both together, and 20 concurrent callers cannot push it past the limit.
    workers = Workers(redis_url, ns, "tests.support.agents_limits")
    try:
        workers.start("lim1")
        workers.start("lim2")
        async with Client(redis_url=redis_url, namespace=ns) as client:
            await wait_eligible(client, "rl.proc", ["lim-1", "lim-2"])
            await set_limit(client.redis, Keys(ns), "rl.proc", parse_limit(f"{RATE}/s"))
            await anyio.sleep(1.1)  # both processes have read the limit

            async def caller(c: int) -> None:
                for i in range(EACH):
                    assert await client.request("rl.proc", [c, i], timeout_s=60) == [c, i]

            async with anyio.create_task_group() as tg:
                for c in range(CALLERS):
                    tg.start_soon(caller, c)
            raw = await client.redis.lrange(Keys(ns).effects("rl.proc.starts"), 0, -1)
    finally:
        workers.stop_all()
    starts = [float(x) for x in raw]
    assert len(starts) == CALLERS * EACH  # each once
    assert worst_window(starts) <= RATE + 2
    assert max(starts) - min(starts) >= (len(starts) - 1) / RATE - 0.5


async def test_a_limit_an_agent_declares_holds_per_agent(redis_url: str, ns: str) -> None:
    # rate="4/s" on each agent's handler: each agent starts at most 4 a second, so the two
    # together about 8, whoever sends and however many at once.
    workers = Workers(redis_url, ns, "tests.support.agents_limits")
    try:
        workers.start("lim1")
        workers.start("lim2")
        async with Client(redis_url=redis_url, namespace=ns) as client:
            await wait_eligible(client, "rl.own", ["lim-1", "lim-2"])
            async with anyio.create_task_group() as tg:
                for i in range(24):
                    tg.start_soon(client.request, "rl.own", i)
            raw = await client.redis.lrange(Keys(ns).effects("rl.own.starts"), 0, -1)
            k = Keys(ns)
            assert not await client.redis.exists(k.rate_state("rl.own"))  # no operator limit
    finally:
        workers.stop_all()
    by_agent: dict[str, list[float]] = {}
    for x in raw:
        agent, t = x.decode().split()
        by_agent.setdefault(agent, []).append(float(t))
    assert sum(len(v) for v in by_agent.values()) == 24
    for agent, times in by_agent.items():
        assert worst_window(times) <= 4 + 2, (agent, worst_window(times))
        if len(times) > 4:
            assert max(times) - min(times) >= (len(times) - 1) / 4 - 0.5


def test_a_declared_rate_is_checked_when_the_handler_is_declared() -> None:
    app = Agent("rl-x", capabilities=[CAP])
    with pytest.raises(ConfigError, match="Invalid rate limit"):
        app.handler(CAP, rate="fast")
    with pytest.raises(ConfigError, match="needs a rate"):
        app.handler(CAP, burst=3)
    app.handler(CAP, rate="100/s", burst=5)(lambda p, c: p)
    limit = app.handlers[CAP].limit
    assert limit is not None and limit.per_second == 100 and limit.burst == 5


async def test_a_caller_may_ask_not_to_wait(redis_url: str, ns: str) -> None:
    starts: list[float] = []
    async with serving(redis_url, ns, limited_agent("rl-4", starts)) as client:
        await set_limit(client.redis, Keys(ns), CAP, parse_limit("1/m"))
        await anyio.sleep(1.1)  # the worker has read the limit
        assert await client.request(CAP, "first", on_rate_limit="raise") == "first"
        with pytest.raises(RateLimited) as err:
            await client.request(CAP, "second", on_rate_limit="raise")
        assert 50 < err.value.retry_after_s <= 60
        assert "1/m" in str(err.value) and "on_rate_limit='wait'" in str(err.value)
        with pytest.raises(RateLimited):
            await client.send(CAP, "third", on_rate_limit="raise")
        # The default waits for its turn, here past its deadline.
        with pytest.raises(DeadlineExceeded):
            await client.request(CAP, "waits", timeout_s=1)
        with pytest.raises(ConfigError, match="on_rate_limit"):
            await client.request(CAP, "x", on_rate_limit="maybe")
        assert len(starts) == 1

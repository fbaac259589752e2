"""Several agents in one process (issue 12, items 3 and 4): one heartbeat thread renews
them all in one call per round, their blocking reads share one connection, and every
liveness guarantee still holds per agent."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

import anyio
import pytest

from reach import Agent, Client
from reach._worker.liveness import Heartbeats
from reach.connection import AnyRedis, connect
from reach.registry import Registry
from tests.support.registry_helpers import new_version

pytestmark = pytest.mark.anyio

N = 5
PROCESS_CONNECTIONS = 3  # issue 12: a worker process's bound on standalone Redis
FAST = {
    "heartbeat_s": 0.1,
    "lease_s": 0.6,
    "evict_after_s": 1.2,
    "block_ms": 200,
    "handle_signals": False,
}
# FAST's heartbeats with leases that outlast a busy loop: the test below runs 2,000
# requests in the agents' own process, and on a loaded machine a round may come late
# enough for a 1.2 s eviction; an evicted agent leaves a shadow record, not the clean
# deregistration the test checks at the end.
ROOMY = {**FAST, "lease_s": 5.0, "evict_after_s": 10.0}


def _agents(prefix: str) -> list[Agent]:
    out = []
    for i in range(N):
        app = Agent(f"{prefix}-{i}", capabilities=["host.echo"])

        @app.handler("host.echo")
        async def echo(payload: Any, ctx: Any, me: str = app.agent_id) -> Any:
            return {"by": me, "x": payload}

        out.append(app)
    return out


async def _wait(pred: Any, what: str, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not await pred():
            await anyio.sleep(0.02)


async def _all_ready(reg: Registry, ids: list[str]) -> bool:
    got = await reg.read_agents(ids)
    return all(a is not None and a.ready for a in got.values())


async def _others(r: AnyRedis, names: tuple[str, ...]) -> int:
    """Connections Redis holds that are not named one of ``names``."""
    return len([c for c in await r.client_list() if c.get("name") not in names])


async def test_agents_of_one_process_share_heartbeats_and_connections(
    redis_url: str, ns: str
) -> None:
    probe = await connect(redis_url, client_name="t-probe")
    caller_redis = await connect(redis_url, client_name="t-caller")
    names = ("t-probe", "t-caller")
    reg = Registry(probe, ns)
    agents = _agents("h")
    ids = [a.agent_id for a in agents]
    try:
        before = await _others(probe, names)
        async with anyio.create_task_group() as tg:
            for a in agents:
                tg.start_soon(partial(a.run, redis_url=redis_url, namespace=ns, **ROOMY))
            await _wait(lambda: _all_ready(reg, ids), "all ready")
            assert Heartbeats.running() == 1  # one thread for the five
            hub = Heartbeats._hubs[redis_url]
            first = {a: x.last_heartbeat_ms for a, x in (await reg.read_agents(ids)).items() if x}
            rounds0, t0 = hub.rounds, time.monotonic()
            await anyio.sleep(1.0)
            rounds, took = hub.rounds - rounds0, time.monotonic() - t0
            now = await reg.read_agents(ids)
            assert all(now[a] is not None and now[a].last_heartbeat_ms > first[a] for a in ids)  # type: ignore[union-attr]
            # one round renews all five (a round per agent would be ~5x more)
            assert rounds <= took / 0.1 * 1.5 + 2, rounds

            # every agent is served through the shared wake-ups: targeted requests
            async with Client(redis=caller_redis, namespace=ns, client_id="t-caller") as c:
                for _ in range(3):
                    for a in ids:
                        got = await c.request("host.echo", 1, target=a, timeout_s=10)
                        assert got == {"by": a, "x": 1}
                peak = 0
                done = anyio.Event()

                async def watch() -> None:
                    nonlocal peak
                    while not done.is_set():
                        peak = max(peak, await _others(probe, names) - before)
                        await anyio.sleep(0.01)

                with anyio.fail_after(30):
                    async with anyio.create_task_group() as load:
                        load.start_soon(watch)
                        res = await _gather(c, 2000)
                        done.set()
                assert len(res) == 2000
                peak = max(peak, await _others(probe, names) - before)
                # the process's connections, whatever the agents and the load (sampled while
                # 2,000 requests run): the shared commands (one multiplexed connection), the
                # shared wake-up read, the heartbeat thread
                assert 1 <= peak <= PROCESS_CONNECTIONS, peak
            for a in agents:
                a.stop()
        assert Heartbeats.running() == 0
        assert await reg.read_agents(ids) == dict.fromkeys(ids)  # all deregistered
    finally:
        await caller_redis.aclose()
        await probe.aclose()


async def _gather(c: Client, n: int) -> list[Any]:
    out: list[Any] = []

    async def one(i: int) -> None:
        out.append(await c.request("host.echo", i, timeout_s=20))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return out


async def test_a_stale_agent_stops_alone_and_an_evicted_one_comes_back(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    reg = Registry(r, ns)
    agents = _agents("s")
    ids = [a.agent_id for a in agents]
    stopped: list[str] = []

    async def run(a: Agent) -> None:
        await a.run(redis_url=redis_url, namespace=ns, sweeper=False, **FAST)
        stopped.append(a.agent_id)

    async with anyio.create_task_group() as tg:
        for a in agents:
            tg.start_soon(run, a)
        await _wait(lambda: _all_ready(reg, ids), "all ready")
        # fencing: a newer registration of s-1 elsewhere stops s-1 only
        await reg.register(
            "s-1",
            instance_id="newer",
            version=new_version() + 10**9,
            capabilities=["host.echo"],
            lease_ms=60_000,
            evict_after_ms=120_000,
        )
        await _wait(lambda: _true(stopped == ["s-1"]), "s-1 stopped")
        newer = await reg.get("s-1")
        assert newer is not None and newer.instance_id == "newer"  # not deregistered
        # a registration lost (flushed) registers again at the next heartbeat
        await r.delete(reg.keys.agent("s-2"))
        await r.zrem(reg.keys.agents, "s-2")

        async def back() -> bool:
            a = await reg.get("s-2")
            return a is not None and a.state == "active"

        await _wait(back, "s-2 registered again")
        await anyio.sleep(0.5)
        assert stopped == ["s-1"]
        for a in agents:
            a.stop()
    assert sorted(stopped) == sorted(ids)


async def _true(v: bool) -> bool:
    return v


def _states_while(redis_url: str, ns: str, agent_id: str, seconds: float) -> set[str]:
    """Sweep and read ``agent_id``'s state every 50 ms for ``seconds``, on an event loop of
    this (worker) thread: the test's own loop is the agent's, which a handler blocks."""

    async def run() -> set[str]:
        r = await connect(redis_url)
        reg = Registry(r, ns)
        seen: set[str] = set()
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                await reg.sweep(owner="t-sweeper")
                a = (await reg.read_agents([agent_id]))[agent_id]
                seen.add(a.state if a is not None else "gone")
                await asyncio.sleep(0.05)
        finally:
            await r.aclose()
        return seen

    return asyncio.run(run())


async def test_heartbeat_rounds_go_out_on_the_loop_and_a_blocked_loop_falls_back_to_the_thread(
    redis_url: str, ns: str
) -> None:
    """Rounds are sent by the agent's event loop on the process's multiplexed connection
    (no fallback while the loop is free); a handler blocking the loop for twice the lease
    still costs no lease: the thread sends the rounds itself, on its own connection
    (issue 12 item 4)."""
    probe = await connect(redis_url, client_name="t-probe")
    reg = Registry(probe, ns)
    app = Agent("blk-1", capabilities=["host.block"])

    @app.handler("host.block")
    async def block(payload: Any, ctx: Any) -> str:
        time.sleep(float(payload))  # noqa: ASYNC251 - deliberately blocks the loop
        return "unblocked"

    # slack 0.8 s: a round waits up to 0.4 s for the loop, then the thread sends it
    opts = {**FAST, "heartbeat_s": 0.2, "lease_s": 1.0, "evict_after_s": 2.0, "stall_s": 30.0}
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(app.run, redis_url=redis_url, namespace=ns, **opts))
            await _wait(lambda: _all_ready(reg, ["blk-1"]), "ready")
            hub = Heartbeats._hubs[redis_url]
            rounds0 = hub.rounds
            await anyio.sleep(1.0)
            assert hub.rounds - rounds0 >= 3 and hub.fallbacks == 0, (hub.rounds, hub.fallbacks)
            async with Client(redis=probe, namespace=ns, client_id="t-probe") as c:
                with anyio.fail_after(30):
                    async with anyio.create_task_group() as calls:
                        seen: set[str] = set()

                        async def watch() -> None:
                            seen.update(
                                await anyio.to_thread.run_sync(
                                    _states_while, redis_url, ns, "blk-1", 3.0
                                )
                            )

                        calls.start_soon(watch)
                        assert await c.request("host.block", 2.0, timeout_s=20) == "unblocked"
            assert seen == {"active"}, seen  # 2 s blocked, lease 1 s: renewed by the thread
            assert hub.fallbacks >= 2, hub.fallbacks
            app.stop()
    finally:
        await probe.aclose()

"""The drain, the hard way: real `reach worker` processes get SIGTERM while a handler that
outlasts every internal timer (the blocking read, the lease, the heartbeat) still runs.

What a drain promises (docs/operations.md, "Drain"): the caller gets the result, the task
ends `succeeded`, the handler ran exactly once (its starts are counted in Redis, per
message), no message ran on two agents at once, and the agent deregistered and left
nothing in its inbox. The handlers are tests.support.agents_lifecycle's sleepers; the end
of the grace, the second signal and the long handler are in test_drain_grace.py.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from functools import partial
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.registry import Registry
from tests.support.agents_messaging import effects
from tests.support.cluster import RedisTestCluster
from tests.support.draining import assert_left_clean, assert_ran_once, running, start
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_lifecycle")
    yield w
    w.stop_all()


@pytest.mark.parametrize(
    ("seconds", "peer", "direct", "sig"),
    [
        pytest.param(1.5, False, False, signal.SIGTERM, id="1.5s-alone"),
        pytest.param(1.5, True, False, signal.SIGTERM, id="1.5s-with-a-peer"),
        pytest.param(1.5, True, True, signal.SIGTERM, id="1.5s-target-with-a-peer"),
        pytest.param(3.0, False, False, signal.SIGTERM, id="3s-alone"),
        pytest.param(3.0, True, False, signal.SIGTERM, id="3s-with-a-peer"),
        pytest.param(3.0, True, True, signal.SIGTERM, id="3s-target-with-a-peer"),
        pytest.param(1.5, True, False, signal.SIGINT, id="1.5s-ctrl-c-with-a-peer"),
    ],
)
async def test_sigterm_mid_handler_settles_its_outcome(
    workers: Workers,
    r: AnyRedis,
    redis_url: str,
    ns: str,
    seconds: float,
    peer: bool,
    direct: bool,
    sig: signal.Signals,
) -> None:
    """Failed before the fix, 9 of 9 times: the handler finished during the drain, but its
    settle (taken off the queue by a flush still awaiting Redis) was cancelled with the
    worker's tasks; alone the caller got DeadlineExceeded and the task stayed `running`,
    with a peer the message ran a second time there (even sent with target=). Ctrl-C
    (SIGINT) drains the same way; the worker then exits 130, as an interrupted command."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a", "sleeper-b"] if peer else ["sleeper-a"])
    kw: dict[str, Any] = {"target": "sleeper-a", "policy": "direct"} if direct else {}
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": seconds}, timeout_s=30, **kw))

            tg.start_soon(call)
            key, agent = await running(r, ns, "sleep")
            procs[agent].send_signal(sig)
        assert got == [{"agent": agent, "slept": seconds}]
        assert procs[agent].wait(timeout=30) == (130 if sig == signal.SIGINT else 0)
        status = await c.task(key)
        assert (status.status, status.runs, status.agent_id) == ("succeeded", 1, agent)
    await assert_ran_once(r, ns, "sleep", key)
    await assert_left_clean(r, reg, agent)
    if direct:
        assert agent == "sleeper-a"
    for other, p in procs.items():
        if other != agent:
            assert p.poll() is None, f"{other} still serves"


@pytest.mark.parametrize("name", ["sleep_emit", "sleep_gen"])
async def test_sigterm_mid_stream_settles_every_chunk_and_the_result(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str, name: str
) -> None:
    """A streaming handler (``ctx.emit``) and an async generator, 2 s each, SIGTERMed
    mid-stream with a peer of the capability beside them. Failed before the fix: no final
    result (DeadlineExceeded) or a second run on the peer."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a", "sleeper-b"])
    chunks: list[Any] = []
    result: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                s = c.stream(f"test.{name}", {"seconds": 2.0}, timeout_s=30)
                async for chunk in s:
                    chunks.append(chunk)
                result.append(s.result)

            tg.start_soon(call)
            key, agent = await running(r, ns, name)
            procs[agent].send_signal(signal.SIGTERM)
        assert chunks == [{"i": i} for i in range(20)]
        assert result == [{"agent": agent}]
        assert procs[agent].wait(timeout=30) == 0
        status = await c.task(key)
        assert (status.status, status.runs) == ("succeeded", 1)
    await assert_ran_once(r, ns, name, key)
    await assert_left_clean(r, reg, agent)


async def test_entries_read_ahead_but_not_started_are_handed_back(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """One handler slot, read-ahead on (quick handlers so far): a 3 s message runs and the
    quick one behind it waits, claimed, in the worker's queue when SIGTERM comes. The drain
    does not start it: it stays pending with the agent, and once the agent has left the
    sweeper moves it to the peer, which takes the claim over and runs it, once. Before,
    the drain ran it (and, racing its settle, lost the 3 s message's outcome)."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a"], "--concurrency", "1", "--prefetch", "1")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        for _ in range(30):  # quick handlers: the worker reads ahead of its one slot
            await c.request("test.sleep", {"seconds": 0}, timeout_s=30)
        await r.delete(c.keys.effects("sleep.started"), c.keys.effects("sleep.agent"))
        procs["sleeper-b"] = workers.start("sleeper_b")
        got: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:

            async def call(name: str, seconds: float, **kw: Any) -> None:
                got[name] = await c.request("test.sleep", {"seconds": seconds}, **kw)

            tg.start_soon(partial(call, "slow", 3.0, timeout_s=30, target="sleeper-a"))
            await running(r, ns, "sleep")
            tg.start_soon(partial(call, "quick", 0.0, timeout_s=30, target="sleeper-a"))
            inbox = c.keys.inbox("sleeper-a", "normal")

            async def read_ahead() -> bool:
                return int((await r.xpending(inbox, "reach"))["pending"]) == 2

            await wait_until(read_ahead, what="the quick one read ahead")
            procs["sleeper-a"].send_signal(signal.SIGTERM)
        assert got == {
            "slow": {"agent": "sleeper-a", "slept": 3.0},
            "quick": {"agent": "sleeper-b", "slept": 0.0},
        }
        assert procs["sleeper-a"].wait(timeout=30) == 0
    started = await effects(r, ns, "sleep.started")
    assert sorted(started.values()) == [1, 1], "each ran once"
    assert await effects(r, ns, "drain.overlap") == {}
    await assert_left_clean(r, reg, "sleeper-a")


@pytest.mark.cluster
async def test_sigterm_mid_handler_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    """The same drain on a 3-master Redis Cluster (settling is pipelined per slot there),
    a peer beside the worker: the result reaches the caller, the handler ran once."""
    url = redis_cluster.url
    w = Workers(url, ns, "tests.support.agents_lifecycle")
    r = await connect(url)
    try:
        reg = Registry(r, ns)
        procs = await start(w, reg, ["sleeper-a", "sleeper-b"])
        got: list[Any] = []
        async with Client(redis_url=url, namespace=ns) as c:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    got.append(await c.request("test.sleep", {"seconds": 2}, timeout_s=30))

                tg.start_soon(call)
                key, agent = await running(r, ns, "sleep")
                procs[agent].send_signal(signal.SIGTERM)
            assert got == [{"agent": agent, "slept": 2}]
            assert procs[agent].wait(timeout=30) == 0
            status = await c.task(key)
            assert (status.status, status.runs) == ("succeeded", 1)
        await assert_ran_once(r, ns, "sleep", key)
        await assert_left_clean(r, reg, agent)
    finally:
        w.stop_all()
        await r.aclose()

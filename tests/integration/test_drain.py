"""The drain, the hard way: real `reach worker` processes get SIGTERM while a handler that
outlasts every internal timer (the blocking read, the lease, the heartbeat) still runs.

What a drain promises (docs/operations.md, "Drain"): the caller gets the result, the task
ends `succeeded`, the handler ran exactly once (its starts are counted in Redis, per
message), no message ran on two agents at once, and the agent deregistered and left
nothing in its inbox. The handlers are tests.support.agents_lifecycle's sleepers.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.registry import Registry
from tests.support.agents_messaging import effects
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

FACTORY = {"sleeper-a": "sleeper_a", "sleeper-b": "sleeper_b"}


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_lifecycle")
    yield w
    w.stop_all()


@pytest.fixture
async def r(redis_url: str) -> Any:
    client = await connect(redis_url)
    yield client
    await client.aclose()


async def start(
    workers: Workers, reg: Registry, agent_ids: list[str], *extra: str
) -> dict[str, subprocess.Popen[bytes]]:
    procs = {a: workers.start(FACTORY[a], *extra) for a in agent_ids}

    async def ready() -> bool:
        infos = [await reg.get(a) for a in agent_ids]
        return all(i is not None and i.ready for i in infos)

    await wait_until(ready, what="workers ready")
    return procs


async def running(r: AnyRedis, ns: str, name: str) -> tuple[str, str]:
    """The one message of handler ``name`` once it started: (its key, the agent running it)."""

    async def probe() -> tuple[str, str] | None:
        agents = await effects_text(r, ns, f"{name}.agent")
        return next(iter(agents.items()), None)

    return await wait_until(probe, what=f"{name} started")


async def effects_text(r: AnyRedis, ns: str, name: str) -> dict[str, str]:
    from reach.keys import Keys

    raw = await r.hgetall(Keys(ns).effects(name))
    return {k.decode(): v.decode() for k, v in raw.items()}


async def assert_ran_once(r: AnyRedis, ns: str, name: str, key: str) -> None:
    assert await effects(r, ns, f"{name}.started") == {key: 1}, "the handler started once"
    assert await effects(r, ns, f"{name}.finished") == {key: 1}
    assert await effects(r, ns, "drain.overlap") == {}, "no message ran on two agents at once"


async def assert_left_clean(r: AnyRedis, reg: Registry, agent_id: str) -> None:
    """Deregistered, and nothing left in its inbox for anyone to run again."""
    assert await reg.get(agent_id) is None, f"{agent_id} deregistered"
    for stream in reg.keys.inboxes(agent_id):
        assert not await r.exists(stream), f"{stream}: settled and dropped, nothing pending"


@pytest.mark.parametrize(
    ("seconds", "peer", "direct"),
    [
        pytest.param(1.5, False, False, id="1.5s-alone"),
        pytest.param(1.5, True, False, id="1.5s-with-a-peer"),
        pytest.param(3.0, False, False, id="3s-alone"),
        pytest.param(3.0, True, True, id="3s-target-with-a-peer"),
    ],
)
async def test_sigterm_mid_handler_settles_its_outcome(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str, seconds: float, peer: bool, direct: bool
) -> None:
    """Failed before the fix, 9 of 9 times: the handler finished during the drain, but its
    settle (taken off the queue by a flush still awaiting Redis) was cancelled with the
    worker's tasks; alone the caller got DeadlineExceeded and the task stayed `running`,
    with a peer the message ran a second time there (even sent with target=)."""
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
            procs[agent].send_signal(signal.SIGTERM)
        assert got == [{"agent": agent, "slept": seconds}]
        assert procs[agent].wait(timeout=30) == 0
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


async def test_sigterm_during_a_30s_handler_waits_for_it(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """A 30 s handler under a 45 s drain grace, a peer beside it: the drain waits the
    handler out (every lease and heartbeat renewed meanwhile), settles it, and only then
    deregisters. Failed before the fix (the message ran again on the peer)."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a", "sleeper-b"], "--drain-s", "45")
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": 30}, timeout_s=90))

            tg.start_soon(call)
            key, agent = await running(r, ns, "sleep")
            procs[agent].send_signal(signal.SIGTERM)

            async def draining() -> bool:
                a = await reg.get(agent)
                return a is not None and a.draining

            await wait_until(draining, what="draining flag")
        assert got == [{"agent": agent, "slept": 30}]
        assert procs[agent].wait(timeout=30) == 0
        status = await c.task(key)
        assert (status.status, status.runs) == ("succeeded", 1)
    await assert_ran_once(r, ns, "sleep", key)
    await assert_left_clean(r, reg, agent)


async def test_handler_past_the_grace_is_cancelled_and_runs_again_elsewhere(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """A 4 s handler under a 1 s drain grace: at the end of the grace it is cancelled (its
    run ends there: the sleeper's counter of running copies goes back to 0), its entry
    stays pending, and once its agent has left the peer runs it: the caller gets the
    peer's result, and the two runs never overlap."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a", "sleeper-b"], "--drain-s", "1")
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": 4}, timeout_s=60))

            tg.start_soon(call)
            key, agent = await running(r, ns, "sleep")
            procs[agent].send_signal(signal.SIGTERM)
        peer = "sleeper-b" if agent == "sleeper-a" else "sleeper-a"
        assert got == [{"agent": peer, "slept": 4}]
        assert procs[agent].wait(timeout=30) == 0
        status = await c.task(key)
        assert (status.status, status.runs, status.agent_id) == ("succeeded", 2, peer)
    assert await effects(r, ns, "sleep.started") == {key: 2}, "cut at the grace, run again"
    assert await effects(r, ns, "sleep.finished") == {key: 1}
    assert await effects(r, ns, "drain.overlap") == {}
    assert await effects_text(r, ns, "sleep.agent") == {key: peer}
    await assert_left_clean(r, reg, agent)


async def test_second_signal_stops_at_once_and_the_message_runs_again(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """A second SIGTERM during the drain stops the worker at once: its running handler is
    cancelled (the cost), its entry stays pending and runs again on the peer once the agent
    has left; the caller still gets a result, from that second run."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a", "sleeper-b"], "--drain-s", "60")
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": 4}, timeout_s=60))

            tg.start_soon(call)
            key, agent = await running(r, ns, "sleep")
            procs[agent].send_signal(signal.SIGTERM)

            async def draining() -> bool:
                a = await reg.get(agent)
                return a is not None and a.draining

            await wait_until(draining, what="draining flag")
            procs[agent].send_signal(signal.SIGTERM)
            # at once: well before its handler (4 s) or the grace (60 s) would end
            assert await anyio.to_thread.run_sync(procs[agent].wait, 3.0) == 0
        peer = "sleeper-b" if agent == "sleeper-a" else "sleeper-a"
        assert got == [{"agent": peer, "slept": 4}]
        status = await c.task(key)
        assert (status.status, status.runs, status.agent_id) == ("succeeded", 2, peer)
    assert await effects(r, ns, "sleep.started") == {key: 2}
    assert await effects(r, ns, "sleep.finished") == {key: 1}
    assert await effects(r, ns, "drain.overlap") == {}
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


async def test_plain_handler_past_the_grace_never_overlaps_its_second_run(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str, tmp_path: Path
) -> None:
    """A plain (non-async) handler runs in a thread, which the end of the grace cannot
    cancel. The worker stays registered, draining, until the thread returns, and leaves
    only then: the message, left pending, runs again on the peer after the first run
    ended, never beside it. Before, the worker deregistered at once and the peer ran the
    message while the first run was still in its thread."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a", "sleeper-b"], "--drain-s", "0.5")
    runs = tmp_path / "runs.log"
    runs.touch()
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                payload = {"seconds": 3, "log": str(runs)}
                got.append(await c.request("test.sleep_plain", payload, timeout_s=60))

            tg.start_soon(call)

            async def first() -> str:
                lines = runs.read_text().split()
                return lines[1] if lines else ""

            agent = await wait_until(first, what="the plain handler started")
            procs[agent].send_signal(signal.SIGTERM)
        peer = "sleeper-b" if agent == "sleeper-a" else "sleeper-a"
        assert got == [{"agent": peer, "slept": 3}]
        assert procs[agent].wait(timeout=30) == 0
    lines = [line.split() for line in runs.read_text().splitlines()]
    assert [(what, who) for what, who, _ in lines] == [
        ("start", agent),
        ("end", agent),
        ("start", peer),
        ("end", peer),
    ], "the second run starts after the first one ended"
    await assert_left_clean(r, reg, agent)

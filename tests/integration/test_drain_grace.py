"""The drain past its grace and under pressure, with real `reach worker` processes: a 30 s
handler under a longer grace, handlers still running at the end of the grace (async, and
a plain function in a thread), the second signal, and Redis restarting while the drain
writes. The checks are those of test_drain.py (tests/support/draining.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.registry import Registry
from tests.support.agents_messaging import effects
from tests.support.draining import (
    assert_left_clean,
    assert_ran_once,
    effects_text,
    running,
    start,
)
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_lifecycle")
    yield w
    w.stop_all()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("peer", "direct"),
    [
        pytest.param(False, False, id="alone"),
        pytest.param(True, False, id="with-a-peer"),
        pytest.param(True, True, id="target-with-a-peer"),
    ],
)
async def test_sigterm_during_a_30s_handler_waits_for_it(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str, peer: bool, direct: bool
) -> None:
    """A 30 s handler under a 45 s drain grace, alone or with a peer beside it (and sent
    with target= to the agent that drains): the drain waits the handler out (every lease
    and heartbeat renewed meanwhile), settles it, and only then deregisters. Failed before
    the fix (the message ran again on the peer; alone, the caller's deadline passed)."""
    reg = Registry(r, ns)
    names = ["sleeper-a", "sleeper-b"] if peer else ["sleeper-a"]
    procs = await start(workers, reg, names, "--drain-s", "45")
    kw: dict[str, Any] = {"target": "sleeper-a", "policy": "direct"} if direct else {}
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": 30}, timeout_s=90, **kw))

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
        assert (status.status, status.runs, status.agent_id) == ("succeeded", 1, agent)
    await assert_ran_once(r, ns, "sleep", key)
    await assert_left_clean(r, reg, agent)
    if direct:
        assert agent == "sleeper-a"


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
    await assert_left_clean(r, reg, agent)


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


async def test_outcome_refused_by_a_redis_restart_is_written_when_redis_is_back(
    fresh_redis: RedisServer, ns: str, tmp_path: Path
) -> None:
    """Redis goes away during the drain, before the handler's outcome is written, and
    comes back within the drain's 10 s of retries: the outcome is written then (the
    consumer has stopped: no pending scan would redo it), the caller gets the result and
    the handler ran once. Leases long enough for the outage (an agent whose lease ran out
    is evicted and its inbox moved on: that is what eviction is for, not the drain)."""
    url = fresh_redis.url
    w = Workers(url, ns, "tests.support.agents_lifecycle")
    try:
        r = await connect(url)
        reg = Registry(r, ns)
        long_lease = ["--heartbeat-s", "1", "--lease-s", "20", "--evict-after-s", "40"]
        procs = await start(w, reg, ["sleeper-a"], *long_lease)
        runs = tmp_path / "runs.log"
        runs.touch()
        got: list[Any] = []
        async with Client(redis_url=url, namespace=ns) as c:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    payload = {"seconds": 2, "log": str(runs)}
                    got.append(await c.request("test.sleep_plain", payload, timeout_s=60))

                tg.start_soon(call)

                async def line(n: int) -> bool:
                    return len(runs.read_text().splitlines()) >= n

                await wait_until(lambda: line(1), what="the handler started")
                procs["sleeper-a"].send_signal(signal.SIGTERM)

                async def draining() -> bool:
                    a = await reg.get("sleeper-a")
                    return a is not None and a.draining

                await wait_until(draining, what="draining flag")
                fresh_redis.kill()
                await wait_until(lambda: line(2), what="the handler returned")
                await anyio.sleep(1.0)  # its settle is refused meanwhile (nothing to see)
                fresh_redis.start()
            assert got == [{"agent": "sleeper-a", "slept": 2}]
            assert procs["sleeper-a"].wait(timeout=30) == 0
        assert [ln.split()[0] for ln in runs.read_text().splitlines()] == ["start", "end"]
        await assert_left_clean(r, reg, "sleeper-a")
        await r.aclose()
    finally:
        w.stop_all()


async def test_handler_ignoring_its_cancellation_is_waited_for_and_settled(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """A handler that ignores cancellation (it shields itself) for 6.5 s, a 0.5 s grace: the
    cut at the end of the grace does not end it, and the worker waits for it past the 5 s
    it gives cancelled handlers, then writes its outcome and leaves. Before, the worker gave
    up waiting, wrote nothing more, and the message ran a second time on the peer."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a", "sleeper-b"], "--drain-s", "0.5")
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep_shielded", {"seconds": 6.5}, timeout_s=60))

            tg.start_soon(call)
            key, agent = await running(r, ns, "sleep_shielded")
            procs[agent].send_signal(signal.SIGTERM)
        assert got == [{"agent": agent, "slept": 6.5}]
        assert procs[agent].wait(timeout=30) == 0
        status = await c.task(key)
        assert (status.status, status.runs) == ("succeeded", 1)
    await assert_ran_once(r, ns, "sleep_shielded", key)
    await assert_left_clean(r, reg, agent)


@pytest.mark.slow
async def test_overlapping_start_with_the_same_agent_id_does_not_run_a_message_twice(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """A rolling restart that starts the new process (same agent_id) before the old one
    is told to drain: the old one's running handler must not run again beside it. The new
    process resumes the agent_id's pending entries at its start and finds the message
    claimed by the process it replaced, still alive on this host: the copy waits, the old
    process drains (the newer registration stops it), finishes the handler and settles
    it, and the waiting copy replays that result. Failed before the fix: the new process
    took the claim over at its start and ran the message a second time, at once."""
    reg = Registry(r, ns)
    procs = await start(workers, reg, ["sleeper-a"])
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": 10}, timeout_s=60))

            tg.start_soon(call)
            key, _ = await running(r, ns, "sleep")
            old = procs["sleeper-a"]
            first = await reg.get("sleeper-a")
            assert first is not None
            new = workers.start("sleeper_a")  # the same agent_id, a newer process

            async def replaced() -> bool:  # ready: it has resumed its pending entries
                a = await reg.get("sleeper-a")
                return a is not None and a.instance_id != first.instance_id and a.ready

            await wait_until(replaced, what="the newer process ready")
            old.send_signal(signal.SIGTERM)
        assert old.wait(timeout=30) == 0
        assert got == [{"agent": "sleeper-a", "slept": 10}]
        status = await c.task(key)
        assert (status.status, status.runs) == ("succeeded", 1)
    assert new.poll() is None, "the newer process serves on"
    await assert_ran_once(r, ns, "sleep", key)


async def test_overlapping_start_during_a_handler_longer_than_its_claim_lease(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """As above, with a 1 s claim lease and a 4 s handler: the old process renews the
    claim while its handler runs (and drains), so the copy the new process parked never
    finds the claim run out, and the message runs once. Failed before the claims were
    renewed (the parked copy claimed the key once its lease had run out: runs 2)."""
    reg = Registry(r, ns)
    lease = ["--claim-lease-s", "1"]
    procs = await start(workers, reg, ["sleeper-a"], *lease)
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": 4}, timeout_s=60))

            tg.start_soon(call)
            key, _ = await running(r, ns, "sleep")
            old = procs["sleeper-a"]
            first = await reg.get("sleeper-a")
            assert first is not None
            new = workers.start("sleeper_a", *lease)

            async def replaced() -> bool:
                a = await reg.get("sleeper-a")
                return a is not None and a.instance_id != first.instance_id

            await wait_until(replaced, what="the newer process registered")
        assert old.wait(timeout=30) == 0
        assert got == [{"agent": "sleeper-a", "slept": 4}]
        status = await c.task(key)
        assert (status.status, status.runs) == ("succeeded", 1)
    assert new.poll() is None
    await assert_ran_once(r, ns, "sleep", key)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and is not reaped yet (its state in /proc, Linux)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"


async def test_sigkilled_worker_restarted_on_this_host_takes_its_message_over_at_once(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """A worker SIGKILLed mid-handler and started again at once with the same agent_id,
    on the same host, while its registration's lease still runs (30 s here): the new
    process replaces a registration that looks alive, but its pid is gone (here a zombie
    its parent has not reaped yet, as under a supervisor that restarts before it waits),
    so the message is taken over at once, not after its claim's lease (about the caller's
    30 s deadline, past which the caller would get no result). Its handler starts twice:
    the first run was killed (a zombie before the second process started: never at once;
    ``drain.overlap`` cannot tell, the killed run never counted itself out)."""
    reg = Registry(r, ns)
    long_lease = ["--lease-s", "30", "--evict-after-s", "60"]
    procs = await start(workers, reg, ["sleeper-a"], *long_lease)
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": 5}, timeout_s=30))

            tg.start_soon(call)
            key, _ = await running(r, ns, "sleep")

            # The first run is counted (start.lua, ~10 ms after the handler starts) before
            # the kill: killed sooner, it is not known to have run, and runs ends at 1.
            async def counted() -> bool:
                return (await c.task(key)).runs == 1

            await wait_until(counted, what="the first run counted")
            first = await reg.get("sleeper-a")
            assert first is not None
            old = procs["sleeper-a"]
            os.kill(old.pid, signal.SIGKILL)  # not reaped: a zombie until old.wait()
            # The kill must land mid-handler; a 1 s handler once finished first on a loaded CI.
            assert await effects(r, ns, "sleep.finished") == {}, "killed after the handler ended"

            async def dead() -> bool:
                return _zombie(old.pid)

            await wait_until(dead, what="the killed worker a zombie")
            new = workers.start("sleeper_a", *long_lease)
        assert got == [{"agent": "sleeper-a", "slept": 5}]
        status = await c.task(key)
        assert (status.status, status.runs) == ("succeeded", 2)
        assert old.wait(timeout=10) == -signal.SIGKILL
    assert new.poll() is None
    assert await effects(r, ns, "sleep.started") == {key: 2}
    assert await effects(r, ns, "sleep.finished") == {key: 1}

"""A handler that ends while Redis refuses its outcome (restarting; full at ``maxmemory``),
with a real `reach worker` process: the worker keeps the outcome and writes it once Redis
takes it again, so the caller gets that run's result and the handler ran once (it is not
run again by the pending scan, which would find its entry unsettled). The held outcome's
write stays fenced (a worker evicted meanwhile has it refused), at most HOLD_MAX outcomes
are held, and a SIGTERM during the outage still ends the worker within its drain bound.

The handler is ``test.sleep_plain`` of tests.support.agents_lifecycle: each run writes the
lines ``start`` and ``end`` in a file of the test's, which outlives any Redis restart.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from reach import Agent, Context
from reach._worker import settlement
from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.envelope import Envelope
from reach.hooks import Hooks
from reach.keys import GROUP, Keys
from reach.registry import Registry
from tests.integration.test_full_redis import Memory
from tests.support.agents_messaging import FAST, wait_eligible
from tests.support.draining import start
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# Leases long enough for the outage: an agent whose lease ran out is evicted and its inbox
# moved on (that is what eviction is for; the settle is fenced then).
LONG_LEASE = ("--heartbeat-s", "1", "--lease-s", "20", "--evict-after-s", "40")


def runs(log: Path) -> list[str]:
    return [ln.split()[0] for ln in log.read_text().splitlines()]


async def pending(r: AnyRedis, ns: str, agent_id: str) -> int:
    n = 0
    for key in Keys(ns).inboxes(agent_id):
        if await r.exists(key):
            n += int((await r.xpending(key, GROUP))["pending"])
    return n


async def run_through(
    url: str, ns: str, log: Path, refuse: Any, restore: Any
) -> tuple[list[Any], AnyRedis]:
    """Send one 2 s request; ``refuse()`` once it runs, ``restore()`` a second after it
    ended (its settle refused meanwhile). Returns what the caller got, and a client."""
    got: list[Any] = []
    async with Client(redis_url=url, namespace=ns) as c, anyio.create_task_group() as tg:

        async def call() -> None:
            payload = {"seconds": 2, "log": str(log)}
            got.append(await c.request("test.sleep_plain", payload, timeout_s=60))

        tg.start_soon(call)

        async def lines(n: int) -> bool:
            return len(log.read_text().splitlines()) >= n

        await wait_until(lambda: lines(1), what="the handler started")
        await refuse()
        await wait_until(lambda: lines(2), what="the handler returned")
        await anyio.sleep(1.0)  # its settle is refused meanwhile (nothing to see)
        await restore()
    return got, await connect(url)


async def assert_ran_once(r: AnyRedis, ns: str, log: Path) -> None:
    # Settled (acked): nothing is left that a pending scan could run again; and the runs
    # so far are the one.
    async def settled() -> bool:
        return await pending(r, ns, "sleeper-a") == 0

    await wait_until(settled, what="the entry settled")
    assert runs(log) == ["start", "end"]


async def test_outcome_held_through_a_redis_restart_is_written_and_not_run_again(
    fresh_redis: RedisServer, ns: str, tmp_path: Path
) -> None:
    """Redis stops while the handler runs and starts again (AOF: its data kept) a second
    after it returned: the outcome is written then, the handler ran once."""
    url = fresh_redis.url
    w = Workers(url, ns, "tests.support.agents_lifecycle")
    try:
        r = await connect(url)
        reg = Registry(r, ns)
        procs = await start(w, reg, ["sleeper-a"], *LONG_LEASE)
        await r.aclose()
        log = tmp_path / "runs.log"
        log.touch()

        async def stop_redis() -> None:
            fresh_redis.kill()

        async def start_redis() -> None:
            fresh_redis.start()

        got, r = await run_through(url, ns, log, stop_redis, start_redis)
        assert got == [{"agent": "sleeper-a", "slept": 2}]
        await assert_ran_once(r, ns, log)
        assert procs["sleeper-a"].poll() is None  # the worker went through the outage
        await r.aclose()
    finally:
        w.stop_all()


@pytest.mark.parametrize("cap", ["test.emit_logged", "test.gen_logged"])
async def test_stream_through_a_redis_restart_is_written_and_not_run_again(
    fresh_redis: RedisServer, ns: str, tmp_path: Path, cap: str
) -> None:
    """A streaming handler (``ctx.emit``, and an async generator) whose chunk writes Redis
    refuses mid-stream: the worker keeps the chunks and writes them once Redis is back,
    the handler runs on and is not failed for it. Before, the first refused chunk write
    failed the run (RedisUnavailable, 'writing the chunks ... failed'): it was retried,
    on another agent when there was one (the rolling-deploy scenario's "run again: ended
    while Redis was away"), and the handler ran twice."""
    url = fresh_redis.url
    w = Workers(url, ns, "tests.support.agents_lifecycle")
    try:
        r = await connect(url)
        procs = await start(w, Registry(r, ns), ["sleeper-a"], *LONG_LEASE)
        await r.aclose()
        log = tmp_path / "runs.log"
        log.touch()
        chunks: list[Any] = []
        result: list[Any] = []
        async with Client(redis_url=url, namespace=ns) as c, anyio.create_task_group() as tg:

            async def call() -> None:
                s = c.stream(cap, {"seconds": 2, "log": str(log)}, timeout_s=60)
                async for chunk in s:
                    chunks.append(chunk)
                result.append(s.result)

            tg.start_soon(call)

            async def streaming() -> bool:
                return len(chunks) >= 3

            await wait_until(streaming, what="the first chunks")
            fresh_redis.kill()

            async def returned() -> bool:
                return len(runs(log)) >= 2

            await wait_until(returned, what="the handler returned")
            await anyio.sleep(1.0)  # its chunks and outcome are refused meanwhile
            fresh_redis.start()
        assert runs(log) == ["start", "end"], "the handler ran once"
        assert chunks == [{"i": i} for i in range(20)]
        assert result == [{"agent": "sleeper-a"}]
        r = await connect(url)
        await assert_ran_once(r, ns, log)
        assert procs["sleeper-a"].poll() is None
        await r.aclose()
    finally:
        w.stop_all()


@pytest.fixture
def small_redis(server_binary) -> Iterator[RedisServer]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary, extra_args=("--maxmemory-policy", "noeviction")) as s:
        yield s


@pytest.fixture
async def r(small_redis: RedisServer) -> AsyncIterator[AnyRedis]:
    client = await connect(small_redis.url)
    yield client
    await client.aclose()


async def test_outcome_held_while_redis_is_full_is_written_and_not_run_again(
    small_redis: RedisServer, r: AnyRedis, ns: str, tmp_path: Path
) -> None:
    """Redis fills (``maxmemory``, ``noeviction``: OutOfMemoryError) while the handler
    runs, and memory is freed a second after it returned: the outcome is written then,
    the handler ran once."""
    w = Workers(small_redis.url, ns, "tests.support.agents_lifecycle")
    try:
        procs = await start(w, Registry(r, ns), ["sleeper-a"], *LONG_LEASE)
        mem = Memory(r, ns)
        log = tmp_path / "runs.log"
        log.touch()
        got, other = await run_through(small_redis.url, ns, log, mem.fill, mem.free)
        await other.aclose()
        assert got == [{"agent": "sleeper-a", "slept": 2}]
        await assert_ran_once(r, ns, log)
        assert procs["sleeper-a"].poll() is None
    finally:
        w.stop_all()


async def test_sigterm_while_redis_is_away_ends_within_the_drain_bound(
    fresh_redis: RedisServer, ns: str, tmp_path: Path
) -> None:
    """Redis stops while the handler runs and stays away; the worker, told to stop once
    the handler returned, tries to write the outcome it holds for the drain's 10 s of
    retries and then leaves (the message stays pending: it runs again, once Redis is
    back, on whichever agent takes it). It does not wait for Redis beyond that."""
    url = fresh_redis.url
    w = Workers(url, ns, "tests.support.agents_lifecycle")
    try:
        r = await connect(url)
        procs = await start(w, Registry(r, ns), ["sleeper-a"], *LONG_LEASE)
        await r.aclose()
        log = tmp_path / "runs.log"
        log.touch()
        async with Client(redis_url=url, namespace=ns) as c:
            await c.send("test.sleep_plain", {"seconds": 1, "log": str(log)}, timeout_s=120)

            async def lines(n: int) -> bool:
                return len(log.read_text().splitlines()) >= n

            await wait_until(lambda: lines(1), what="the handler started")
            fresh_redis.kill()
            await wait_until(lambda: lines(2), what="the handler returned")
            await anyio.sleep(0.5)  # its settle refused, the outcome held
            t0 = time.monotonic()
            procs["sleeper-a"].send_signal(signal.SIGTERM)
            rc = await anyio.to_thread.run_sync(lambda: procs["sleeper-a"].wait(timeout=60))
            took_s = time.monotonic() - t0
        # 10 s of settle retries (SETTLE_RETRY_S), then leaving without Redis: its calls
        # each end within the client's timeouts.
        assert took_s < 25, f"the worker took {took_s:.1f}s to stop"
        assert took_s >= 9, f"the worker gave up its outcome after {took_s:.1f}s"
        assert rc is not None
    finally:
        w.stop_all()


class Dropped(Hooks):
    def __init__(self) -> None:
        self.msg_ids: list[str] = []

    def on_outcome_dropped(self, env: Envelope) -> None:
        self.msg_ids.append(env.msg_id)


async def test_outcomes_past_the_cap_are_let_go_and_run_again(
    fresh_redis: RedisServer, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker holds at most HOLD_MAX outcomes while Redis refuses them (here 2, of 4
    handlers that end while Redis is away): the oldest past the cap are let go, counted by
    the hook, and run again once Redis is back; the ones held are written, not run again.
    Every caller gets a result."""
    monkeypatch.setattr(settlement, "HOLD_MAX", 2)
    dropped = Dropped()
    agent = Agent("capped-1", capabilities=["test.capped"], hooks=[dropped])
    release = anyio.Event()
    runs: dict[str, int] = {}

    @agent.handler("test.capped")
    async def handle(payload: int, ctx: Context) -> int:
        runs[ctx.msg_id] = runs.get(ctx.msg_id, 0) + 1
        if runs[ctx.msg_id] == 1:
            await release.wait()
        return payload

    opts = {**FAST, "heartbeat_s": 1.0, "lease_s": 30.0, "evict_after_s": 60.0}
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: agent.run(redis_url=fresh_redis.url, namespace=ns, concurrency=4, **opts)
        )
        async with Client(redis_url=fresh_redis.url, namespace=ns) as c:
            await wait_eligible(c, "test.capped", ["capped-1"])
            ids = [await c.send("test.capped", i, timeout_s=120) for i in range(4)]

            async def all_running() -> bool:
                return len(runs) == 4

            await wait_until(all_running, what="the 4 handlers running")
            await anyio.to_thread.run_sync(fresh_redis.kill)
            release.set()

            async def let_go() -> bool:
                return len(dropped.msg_ids) == 2

            await wait_until(let_go, what="2 outcomes let go")
            await anyio.sleep(0.5)  # the 2 held are tried again meanwhile, and refused
            assert len(dropped.msg_ids) == 2
            await anyio.to_thread.run_sync(fresh_redis.start)
            with anyio.fail_after(60):
                got = [await c.result(i, timeout_s=60) for i in ids]
        agent.stop()
    assert got == [0, 1, 2, 3]
    again = {m for m, n in runs.items() if n == 2}
    assert again == set(dropped.msg_ids), (runs, dropped.msg_ids)
    assert sorted(runs.values()) == [1, 1, 2, 2]


async def test_outcome_held_by_an_evicted_worker_is_fenced(
    fresh_redis: RedisServer, ns: str, tmp_path: Path
) -> None:
    """The held outcome's write stays fenced: the worker holding it is stopped (SIGSTOP)
    across the Redis restart, evicted meanwhile (short leases), and another agent takes
    the message over and answers it. Resumed, the worker's late completion is refused
    (logged, nothing written): the caller has the second run's result."""
    url = fresh_redis.url
    w = Workers(url, ns, "tests.support.agents_lifecycle")
    try:
        r = await connect(url)
        reg = Registry(r, ns)
        a_log = tmp_path / "a.log"
        a = w.start("sleeper_a", log=a_log)

        async def ready(agent_id: str) -> bool:
            info = await reg.get(agent_id)
            return info is not None and info.ready

        await wait_until(lambda: ready("sleeper-a"), what="sleeper-a ready")
        log = tmp_path / "runs.log"
        log.touch()

        async def lines(n: int) -> bool:
            return len(log.read_text().splitlines()) >= n

        got: list[Any] = []
        async with Client(redis_url=url, namespace=ns) as c:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    payload = {"seconds": 3, "log": str(log)}
                    got.append(await c.request("test.sleep_plain", payload, timeout_s=60))

                tg.start_soon(call)
                await wait_until(lambda: lines(1), what="the handler started on sleeper-a")
                w.start("sleeper_b")
                await wait_until(lambda: ready("sleeper-b"), what="sleeper-b ready")
                await r.aclose()
                fresh_redis.kill()
                await wait_until(lambda: lines(2), timeout_s=30, what="the handler returned")
                await anyio.sleep(0.5)  # its settle refused, the outcome held
                a.send_signal(signal.SIGSTOP)
                fresh_redis.start()
                await wait_until(lambda: lines(4), timeout_s=60, what="the run on sleeper-b")
            a.send_signal(signal.SIGCONT)

        async def fenced() -> bool:
            return "late completion of" in a_log.read_text()

        await wait_until(fenced, timeout_s=30, what="sleeper-a's late completion refused")
        assert got == [{"agent": "sleeper-b", "slept": 3}]
        starts = [ln.split()[:2] for ln in log.read_text().splitlines()]
        assert starts == [
            ["start", "sleeper-a"],
            ["end", "sleeper-a"],
            ["start", "sleeper-b"],
            ["end", "sleeper-b"],
        ]
    finally:
        w.stop_all()

"""A long handler among workers that come and go: one message whose handler runs for
``REACH_LONG_HANDLER_S`` seconds (60 in CI) on one worker, while the other workers of its
capability are SIGTERMed and SIGKILLed and started again around it, under a steady load of
short messages, with claim leases far shorter than the handler (1 s).

It must start exactly once, on the worker that lives, and its result must reach the
caller; every short message must be answered. A 10-minute run, by hand:

    REACH_LONG_HANDLER_S=600 .venv/bin/pytest -n 0 -q tests/chaos/test_long_handler.py
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import connect
from reach.registry import Registry
from tests.support.agents_messaging import effects
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

LONG_S = float(os.environ.get("REACH_LONG_HANDLER_S", "60"))
SHORT_S = 0.3
LANES = 3
# The long handler's worker: a lease that a loaded CI machine does not miss (its eviction
# would move the message on, which is what eviction is for, not what is tested here).
STEADY = ["--heartbeat-s", "0.2", "--lease-s", "2", "--evict-after-s", "4"]
EVERYONE = ["--claim-lease-s", "1", "--concurrency", "4", "--drain-s", "10"]


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_lifecycle")
    yield w
    w.stop_all()


@pytest.mark.slow
@pytest.mark.timeout(LONG_S + 120)
async def test_long_handler_runs_once_while_its_neighbours_come_and_go(
    workers: Workers, redis_url: str, ns: str
) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)

    async def ready(agent_id: str) -> bool:
        a = await reg.get(agent_id)
        return a is not None and a.ready

    home = workers.start("sleeper_a", *EVERYONE, *STEADY)
    await wait_until(lambda: ready("sleeper-a"), what="sleeper-a ready")
    result: list[Any] = []
    answered = 0
    events: list[str] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:

        async def long_call() -> None:
            result.append(
                await c.request(
                    "test.sleep",
                    {"seconds": LONG_S},
                    timeout_s=LONG_S + 60,
                )
            )

        async def lane(stop: anyio.Event) -> None:
            nonlocal answered
            while not stop.is_set():
                got = await c.request("test.sleep", {"seconds": SHORT_S}, timeout_s=60)
                assert got["slept"] == SHORT_S
                answered += 1

        async def chaos(stop: anyio.Event) -> None:
            """Replace a neighbour every ~2 s, one in three by SIGKILL, until the long
            handler is done."""
            names = ["sleeper_b", "sleeper_c"]
            i = 0
            while not result:
                name = names[i % 2]
                p = workers.procs[name]
                how = signal.SIGKILL if i % 3 == 2 else signal.SIGTERM
                p.send_signal(how)
                await anyio.to_thread.run_sync(p.wait, 30.0)
                events.append(f"{name}:{how.name}")
                workers.start(name, *EVERYONE)
                agent_id = name.replace("_", "-")
                await wait_until(lambda a=agent_id: ready(a), timeout_s=30, what=f"{agent_id} back")
                i += 1
                with anyio.move_on_after(2.0):
                    await stop.wait()
            stop.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)

            async def started() -> list[str]:
                return list(await effects(r, ns, "sleep.started"))

            (long_key,) = await wait_until(started, what="the long handler started")
            for name in ("sleeper_b", "sleeper_c"):
                workers.start(name, *EVERYONE)
            for agent_id in ("sleeper-b", "sleeper-c"):
                await wait_until(lambda a=agent_id: ready(a), what=f"{agent_id} ready")
            stop = anyio.Event()
            t0 = time.monotonic()
            tg.start_soon(chaos, stop)
            for _ in range(LANES):
                tg.start_soon(lane, stop)
        elapsed = time.monotonic() - t0
        assert result == [{"agent": "sleeper-a", "slept": LONG_S}]
        status = await c.task(long_key)
        assert (status.status, status.runs, status.agent_id) == ("succeeded", 1, "sleeper-a")
    started = await effects(r, ns, "sleep.started")
    assert started[long_key] == 1, "the long handler started exactly once"
    assert (await effects(r, ns, "sleep.finished"))[long_key] == 1
    assert home.poll() is None, "its own worker lived throughout"
    assert events, "neighbours were replaced meanwhile"
    assert any("SIGKILL" in e for e in events) or elapsed < 10
    assert answered >= LANES, "short messages kept being answered"
    print(f"long handler {LONG_S:g}s: {len(events)} replacements {events}, {answered} answered")
    await r.aclose()

"""Messages sent to an agent just after it deregistered (a caller's registry view that has
not read the deregistration yet: events in flight, or hidden by a Redis outage) are moved
on by the sweeper, not left in an inbox nobody reads: each runs exactly once, on a live
agent of the capability, or waits parked until one registers."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis
from reach.keys import GROUP, Keys
from reach.registry import Registry
from reach.sweeper import REROUTE_GRACE_MS, reroute_evicted
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

LONG_VIEW = {"view_refresh_s": 600.0, "max_staleness_s": 600.0}
"""A view that re-reads nothing by itself: only events change it (and those naming the
agent that leaves are hidden from it, below)."""


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_recovery")
    yield w
    w.stop_all()


@pytest.fixture
def bystander(redis_url: str, ns: str) -> Iterator[Workers]:
    """A worker of another capability: it holds the sweeper lock while no agent of the
    capability under test runs."""
    w = Workers(redis_url, ns, "tests.support.agents_routing")
    yield w
    w.stop_all()


def miss_events_of(c: Client, agent_id: str) -> None:
    """Make the view's event tail pass over ``agent_id``'s events: the view keeps listing
    it as it was, as a view does between a deregistration and reading its event (longer
    when a Redis outage hid the event)."""
    view = c.view
    named = view._named

    def without(res: Any, tail: Any) -> set[str]:
        return named(res, tail) - {agent_id}

    view._named = without  # type: ignore[method-assign]


async def runs(r: AnyRedis, ns: str) -> dict[str, int]:
    """Handler runs per idempotency key (agents_recovery counts them)."""
    h = await r.hgetall(Keys(ns).effects("rec"))
    return {
        k.decode()[len("runs:") :]: int(v) for k, v in h.items() if k.decode().startswith("runs:")
    }


async def routable(reg: Registry, *agent_ids: str) -> bool:
    found = await reg.agents("rec.work", ready=True, state="active")
    return set(agent_ids) <= {a.agent_id for a in found}


async def leave(reg: Registry, p: Any, agent_id: str) -> None:
    """SIGTERM the worker: it drains, deregisters, drops its emptied inbox and exits."""
    p.send_signal(signal.SIGTERM)
    with anyio.fail_after(30):
        while p.poll() is None:
            await anyio.sleep(0.02)
    assert p.returncode == 0
    assert await reg.get(agent_id) is None  # deregistered, not evicted


async def test_a_request_and_a_send_after_the_agent_left_run_once_on_another(
    workers: Workers, redis_url: str, r: AnyRedis, ns: str
) -> None:
    reg = Registry(r, ns)
    p1 = workers.start("w1")
    workers.start("w2")
    await wait_until(lambda: routable(reg, "rec-1", "rec-2"), timeout_s=30, what="both ready")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0, **LONG_VIEW) as c:
        c.invalidate()
        assert {a.agent_id for a in await c.eligible("rec.work")} == {"rec-1", "rec-2"}
        miss_events_of(c, "rec-1")
        await leave(reg, p1, "rec-1")
        # The view still routes to rec-1: both land in its inbox after it left.
        assert "rec-1" in {a.agent_id for a in await c.eligible("rec.work")}
        await c.send("rec.work", {}, target="rec-1", idempotency_key="late-send")
        with anyio.fail_after(60):
            got = await c.request(
                "rec.work", {}, target="rec-1", idempotency_key="late-request", timeout_s=50
            )
        assert got == "rec-2"

        async def both_ran() -> dict[str, int] | None:
            n = await runs(r, ns)
            return n if len(n) == 2 else None

        counted = await wait_until(both_ran, timeout_s=30, what="the send ran")
        keys = Keys(ns)

        async def settled() -> bool:
            inboxes = [*keys.inboxes("rec-1"), *keys.inboxes("rec-2")]
            queued = sum([int(await r.xlen(k)) for k in inboxes])
            return queued == 0 and await r.zcard(keys.delayed) == 0

        await wait_until(settled, timeout_s=30, what="nothing left to run")
    assert list(counted.values()) == [1, 1]
    assert list((await runs(r, ns)).values()) == [1, 1]
    assert sum([int(await r.exists(k)) for k in keys.inboxes("rec-1")]) == 0  # dropped


async def test_a_request_sent_during_the_drain_runs_once_on_another_after_it_left(
    workers: Workers, redis_url: str, r: AnyRedis, ns: str
) -> None:
    """A message that lands while the agent drains (it reads no more) is moved on once it
    has left, as one that lands after."""
    reg = Registry(r, ns)
    p1 = workers.start("w1")
    workers.start("w2")
    await wait_until(lambda: routable(reg, "rec-1", "rec-2"), timeout_s=30, what="both ready")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0, **LONG_VIEW) as c:
        c.invalidate()
        assert {a.agent_id for a in await c.eligible("rec.work")} == {"rec-1", "rec-2"}
        miss_events_of(c, "rec-1")
        got: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:

            async def call(name: str, sleep_s: float) -> None:
                got[name] = await c.request(
                    "rec.work",
                    {"sleep_s": sleep_s},
                    target="rec-1",
                    idempotency_key=name,
                    timeout_s=50,
                )

            tg.start_soon(call, "slow", 3.0)  # keeps the drain going
            inbox = Keys(ns).inbox("rec-1", "normal")

            async def slow_running() -> bool:  # read, not settled: its handler runs
                return int((await r.xpending(inbox, GROUP))["pending"]) == 1

            await wait_until(slow_running, timeout_s=30, what="the slow one running")
            p1.send_signal(signal.SIGTERM)

            async def draining() -> bool:
                a = await reg.get("rec-1")
                return a is not None and a.draining

            await wait_until(draining, timeout_s=30, what="rec-1 draining")
            tg.start_soon(call, "during", 0.0)
        assert got == {"slow": "rec-1", "during": "rec-2"}
        assert p1.wait(timeout=30) == 0
    assert await runs(r, ns) == {"slow": 1, "during": 1}


async def test_with_no_agent_left_they_are_parked_and_run_when_one_registers(
    workers: Workers, bystander: Workers, redis_url: str, r: AnyRedis, ns: str
) -> None:
    reg, keys = Registry(r, ns), Keys(ns)
    p1 = workers.start("w1")
    bystander.start("ring_a")  # another capability's worker: it sweeps meanwhile
    await wait_until(lambda: routable(reg, "rec-1"), timeout_s=30, what="rec-1 ready")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0, **LONG_VIEW) as c:
        c.invalidate()
        assert [a.agent_id for a in await c.eligible("rec.work")] == ["rec-1"]
        miss_events_of(c, "rec-1")
        await leave(reg, p1, "rec-1")
        await c.send("rec.work", {}, target="rec-1", idempotency_key="late-send")
        result: list[Any] = []

        async def ask() -> None:
            result.append(
                await c.request(
                    "rec.work", {}, target="rec-1", idempotency_key="late-request", timeout_s=90
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)

            async def parked() -> bool:
                return int(await r.xlen(keys.parked("rec.work"))) == 2

            await wait_until(parked, timeout_s=30, what="both parked")
            assert await runs(r, ns) == {}
            workers.start("w2")
        assert result == ["rec-2"]

        async def both_ran() -> dict[str, int] | None:
            n = await runs(r, ns)
            return n if len(n) == 2 else None

        counted = await wait_until(both_ran, timeout_s=30, what="the send ran")

        async def settled() -> bool:
            queued = sum([int(await r.xlen(k)) for k in keys.inboxes("rec-2")])
            return queued == 0 and int(await r.xlen(keys.parked("rec.work"))) == 0

        await wait_until(settled, timeout_s=30, what="nothing left to run")
    assert list(counted.values()) == [1, 1]
    assert list((await runs(r, ns)).values()) == [1, 1]


async def test_the_sweeper_forgets_a_deregistered_agent_after_the_grace(
    redis_url: str, r: AnyRedis, ns: str
) -> None:
    """Listed while its grace runs (nothing to move: no inbox, no record read), forgotten
    after it; an agent id that came back (its inbox streams made again) is forgotten at
    once, its inbox left to it."""
    reg, keys = Registry(r, ns), Keys(ns)
    left = reg.keys.left_of(0)
    for agent_id in ("gone-1", "back-1"):
        await register(reg, agent_id, ["rec.work"])
        assert await reg.deregister(agent_id) == 1
    await register(reg, "back-1", ["rec.work"])
    for k in keys.inboxes("back-1"):  # as a worker that starts makes them
        await r.xgroup_create(k, GROUP, id="0", mkstream=True)
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await reroute_evicted(r, keys, c, reg)
        assert await r.smembers(reg.keys.reroute) == {b"gone-1"}
        assert await r.zrange(left, 0, -1) == [b"gone-1"]
        # Its grace over (the time it left moved back past it): forgotten.
        at = await r.zscore(left, "gone-1")
        assert at is not None
        await r.zadd(left, {"gone-1": at - REROUTE_GRACE_MS - 1})
        await reroute_evicted(r, keys, c, reg)
    assert await r.exists(reg.keys.reroute, left) == 0
    assert sum([int(await r.exists(k)) for k in keys.inboxes("back-1")]) == 3

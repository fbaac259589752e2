"""Cancellation with real ``reach worker`` processes: messages cancelled while their worker
is dead (SIGKILL) are never run by the worker that takes its place (their entries were
claimed at send for the dead instance, or read by it: claim.lua answers CANCELLED), and a
running handler that ignores ``ctx.cancelled`` is cut at the worker's ``--cancel-grace-s``;
a worker run with ``--preempt-after-s`` cuts a low-priority run for a high-priority
message and the low one still completes."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import anyio
import pytest

from reach import Cancelled, Client
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.integration.test_cancel import Call, dead_reasons, wait_effect
from tests.support.agents_messaging import effects, wait_eligible, wait_status
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

AGENT = "can-p"
GRACE_S = 0.5


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_cancel")
    yield w
    w.stop_all()


def start(workers: Workers) -> None:
    workers.start("app", "--concurrency", "1", "--prefetch", "0", "--cancel-grace-s", str(GRACE_S))


async def test_cancels_across_a_sigkill_and_a_grace_cut(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    start(workers)
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "can.stubborn", [AGENT])
        [first] = await client.eligible("can.stubborn")
        running = Call(client, client.build("can.stubborn", 60, timeout_s=120))
        async with anyio.create_task_group() as tg:
            tg.start_soon(running.run)
            await wait_effect(r, ns, "started", running.env.msg_id)
            queued = [await client.send("can.work", i) for i in range(3)]
            p = workers.procs["app"]
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
            # Cancelled while no worker runs: the records say so, nothing can be told.
            for m in queued:
                assert (await client.cancel(m)).status == "pending"
            assert (await client.cancel(running.env.msg_id)).status == "running"

            start(workers)  # the same agent id, a new instance
            await wait_eligible(
                client, "can.stubborn", [AGENT], instance_of={AGENT: first.instance_id}
            )
            # The caller of the running one is told by the new worker (its entry was
            # pending for the dead one: the new one claims it, and claim.lua refuses).
            assert isinstance(await running.outcome(timeout_s=60), Cancelled)
        letters = await wait_dead(r, ns, "can.work", len(queued))
        assert letters == {m: "cancelled" for m in queued}
        assert await effects(r, ns, "work") == {}  # none of them ever ran
        assert await effects(r, ns, "started") == {running.env.msg_id: 1}  # only its first run
        assert await effects(r, ns, "finished") == {}

        # A running handler on the live worker that ignores ctx.cancelled: cut at the grace.
        stubborn = Call(client, client.build("can.stubborn", 60, timeout_s=120))
        async with anyio.create_task_group() as tg:
            tg.start_soon(stubborn.run)
            await wait_effect(r, ns, "started", stubborn.env.msg_id)
            t0 = time.monotonic()
            await client.cancel(stubborn.env.msg_id)
            assert isinstance(await stubborn.outcome(), Cancelled)
        assert GRACE_S * 0.8 <= stubborn.returned_at - t0 < GRACE_S + 15
        assert await effects(r, ns, "finished") == {}
        for m in [*queued, running.env.msg_id, stubborn.env.msg_id]:
            assert (await client.task(m)).status == "cancelled"
        assert await client.request("can.work", "after", timeout_s=30) == "after"
        assert (await dead_reasons(r, ns, "can.stubborn")) == {
            running.env.msg_id: "cancelled",
            stubborn.env.msg_id: "cancelled",
        }


async def wait_dead(r: AnyRedis, ns: str, cap: str, n: int) -> dict[str, str]:
    with anyio.fail_after(60):
        while await r.xlen(Keys(ns).dlq(cap)) < n:
            await anyio.sleep(0.05)
    return await dead_reasons(r, ns, cap)


async def test_preemption_in_a_worker_process(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start(
        "preempt_app", "--concurrency", "2", "--prefetch", "0", "--preempt-after-s", "0.1"
    )
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "pre.low", ["pre-p"])
        lows = [await client.send("pre.low", 3.0, priority="low") for _ in range(2)]
        for m in lows:
            await wait_effect(r, ns, "started", m)
        t0 = time.monotonic()
        assert await client.request("pre.high", None, priority="high", timeout_s=30) == "high"
        assert time.monotonic() - t0 < 2.5  # not the 3 s of a low run: one was cut
        for m in lows:  # and both still complete, their attempt not counted
            st = await wait_status(client, m, "succeeded", timeout=60)
            assert st.attempt == 1
        assert sorted((await effects(r, ns, "started")).values()) == [1, 2]

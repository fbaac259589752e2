"""Compensation: an evicted agent's inbox moves to live agents; parking; fencing."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from reach.client import Client
from reach.keys import Keys
from reach.registry import Registry
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_recovery")
    yield w
    w.stop_all()


async def ready(c: Client, ids: set[str], timeout_s: float = 30.0) -> None:
    with anyio.fail_after(timeout_s):
        while True:
            got = {
                a.agent_id
                for a in await Registry(c.redis, c.namespace).agents(
                    "rec.work", ready=True, state="active"
                )
            }
            if ids <= got:
                c.invalidate()
                return
            await anyio.sleep(0.02)


async def effects(c: Client) -> dict[str, int]:
    h = await c.redis.hgetall(Keys(c.namespace).effects("rec"))
    return {k.decode(): int(v) for k, v in h.items() if not k.startswith(b"done:")}


async def test_inbox_of_a_killed_agent_moves_to_a_live_one(
    workers: Workers, redis_url: str, ns: str
) -> None:
    workers.start("w1", "--concurrency", "2")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"rec-1"})
        # Two in flight (pending) and the rest unread, across priorities.
        ids = [
            await c.send("rec.work", {"sleep_s": 5}, priority=p)
            for p in ["normal", "normal", "high", "low", "normal", "low"]
        ]
        with anyio.fail_after(20):
            while sum([(await c.task(i)).status == "running" for i in ids]) < 2:
                await anyio.sleep(0.02)
        workers.procs["w1"].send_signal(signal.SIGKILL)
        workers.start("w2", "--concurrency", "8")
        t0 = anyio.current_time()
        with anyio.fail_after(30):
            while not all([(await c.task(i)).status == "succeeded" for i in ids]):
                await anyio.sleep(0.05)
        took = anyio.current_time() - t0
        done_by = {(await c.task(i)).agent_id for i in ids}
        eff = await effects(c)
        keys = Keys(ns)
        depth = sum([await c.redis.xlen(k) for k in keys.inboxes("rec-1") + keys.inboxes("rec-2")])
    assert done_by == {"rec-2"}
    assert eff["effects"] == len(ids)
    assert depth == 0
    assert took < 15, took  # lease + evict + sweeps + the 5 s handlers


async def test_no_live_agent_parks_then_releases(workers: Workers, redis_url: str, ns: str) -> None:
    workers.start("w1", "--concurrency", "1")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"rec-1"})
        keep = await c.send("rec.work", {"sleep_s": 5})
        later = await c.send("rec.work", {"sleep_s": 0})
        # Its deadline leaves time to be parked (eviction takes < 1 s here), then passes.
        short = await c.send("rec.work", {"sleep_s": 0}, timeout_s=3.0)
        with anyio.fail_after(20):
            while (await c.task(keep)).status != "running":
                await anyio.sleep(0.02)
        workers.procs["w1"].send_signal(signal.SIGKILL)
        reg = Registry(c.redis, ns)
        keys = Keys(ns)
        with anyio.fail_after(20):  # nobody sweeps but us: no worker is left
            while await c.redis.xlen(keys.parked("rec.work")) < 3:
                await reg.sweep(owner="test")
                from reach.sweeper import release_parked, reroute_evicted

                await reroute_evicted(c.redis, keys, c, reg)
                await release_parked(c.redis, keys, c)
                await anyio.sleep(0.05)
        with anyio.fail_after(20):  # the short deadline passes while parked
            while (await c.task(short)).status != "expired":
                await release_parked(c.redis, keys, c)
                await anyio.sleep(0.1)
        assert (await c.task(short)).error == "deadline passed while parked (no agent)"
        dead = await c.redis.xrange(keys.dlq("rec.work"))
        assert [f[b"reason"] for _, f in dead] == [b"expired"]
        workers.start("w2")  # its sweeper releases the parked ones
        with anyio.fail_after(30):
            while not all([(await c.task(i)).status == "succeeded" for i in (keep, later)]):
                await anyio.sleep(0.05)
        assert await c.redis.xlen(keys.parked("rec.work")) == 0
        assert (await effects(c))["effects"] == 2


async def test_stopped_worker_cannot_complete_after_takeover(
    workers: Workers, redis_url: str, ns: str, tmp_path: Path
) -> None:
    """SIGSTOP past the lease: the message moves and completes elsewhere; the paused
    worker's late completion is refused (fenced) and the effect happens once."""
    log = tmp_path / "w1.log"
    p1 = workers.start("w1", log=log)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"rec-1"})
        msg = await c.send("rec.work", {"sleep_s": 1.0})
        with anyio.fail_after(20):
            while (await c.task(msg)).status != "running":
                await anyio.sleep(0.01)
        os.kill(p1.pid, signal.SIGSTOP)
        workers.start("w2")
        with anyio.fail_after(30):
            while (st := await c.task(msg)).status != "succeeded":
                await anyio.sleep(0.05)
        assert st.agent_id == "rec-2"
        os.kill(p1.pid, signal.SIGCONT)  # it wakes mid-handler and tries to complete
        rec = Keys(ns).idem(msg)
        with anyio.fail_after(20):
            while int(await c.redis.hget(Keys(ns).effects("rec"), f"runs:{msg}") or 0) < 2:
                await anyio.sleep(0.05)
        with anyio.fail_after(20):
            while b"late completion of " + msg.encode() + b" refused" not in log.read_bytes():
                await anyio.sleep(0.05)
        st = await c.task(msg)
        assert st.status == "succeeded" and st.agent_id == "rec-2"
        assert int(await c.redis.hget(rec, "fence")) == 2
        assert (await effects(c))["effects"] == 1

"""Watching a task (``client.watch``, ``ctx.progress``) with a real ``reach worker``
process: a watcher in a second process sees every change in order (pending, running,
each progress report, succeeded), one started after the end gets the final change at
once, and a cancel or a dead letter ends a watch too."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import IO, Any

import anyio
import pytest

from reach import Client, ConfigError, DeadlineExceeded, TaskChange
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.integration.test_cancel import wait_effect
from tests.support.agents_messaging import serving, wait_eligible, wait_status
from tests.support.agents_watch import make
from tests.support.cluster import RedisTestCluster
from tests.support.waiting import wait_until
from tests.support.workers import ROOT, Workers

pytestmark = pytest.mark.anyio

AGENT = "watch-1"
STEPS = [[0.25, "reading"], [0.5, "thinking"], [1.0, "writing"]]


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_watch")
    w.start("app", "--concurrency", "1", "--prefetch", "0")
    yield w
    w.stop_all()


@pytest.fixture
def watchers() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def watcher(procs: list[subprocess.Popen[str]], url: str, ns: str, msg_id: str) -> IO[str]:
    """Start ``tests.support.watcher`` on ``msg_id`` in a process of its own; its stdout."""
    cmd = [sys.executable, "-m", "tests.support.watcher", url, ns, msg_id]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout is not None
    return p.stdout


async def next_change(out: IO[str]) -> dict[str, Any]:
    with anyio.fail_after(60):
        line = await anyio.to_thread.run_sync(out.readline)
    assert line, "the watcher ended without a final change"
    row: dict[str, Any] = json.loads(line)
    return row


def brief(row: dict[str, Any]) -> tuple[Any, ...]:
    if row["kind"] == "progress":
        return ("progress", row["progress"], row["note"])
    return (row["kind"], row["status"], row["final"])


async def open_gate(r: AnyRedis, ns: str, name: str) -> None:
    await r.hset(Keys(ns).effects("gate"), name, 1)


async def test_a_second_process_sees_every_change_in_order(
    workers: Workers, watchers: list[subprocess.Popen[str]], redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "watch.steps", [AGENT])
        hold = await client.send("watch.hold", "g1")
        await wait_effect(r, ns, "held", hold)  # the only slot is taken: the next waits
        msg_id = await client.send("watch.steps", STEPS)
        out = watcher(watchers, redis_url, ns, msg_id)
        # The watcher's first change is the task as it is: it has subscribed by then.
        assert brief(await next_change(out)) == ("current", "pending", False)
        await open_gate(r, ns, "g1")
        seen = [brief(await next_change(out)) for _ in range(5)]
        assert seen == [
            ("status", "running", False),
            ("progress", 0.25, "reading"),
            ("progress", 0.5, "thinking"),
            ("progress", 1.0, "writing"),
            ("status", "succeeded", True),
        ]
        assert await anyio.to_thread.run_sync(out.readline) == ""  # it ended there
        # The record keeps the latest progress.
        task = await client.task(msg_id)
        assert (task.status, task.progress, task.progress_note) == ("succeeded", 1.0, "writing")


async def test_a_watch_after_the_end_gets_the_final_change_at_once(
    workers: Workers, redis_url: str, ns: str
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "watch.steps", [AGENT])
        msg_id = await client.send("watch.steps", [[0.3, "only step"]])
        await wait_status(client, msg_id, "succeeded", timeout=60)
        with anyio.fail_after(10):  # no change is waited for: the first one is the last
            changes = [c async for c in client.watch(msg_id)]
        [c] = changes
        assert (c.kind, c.status, c.final, c.progress, c.note) == (
            "current",
            "succeeded",
            True,
            0.3,
            "only step",
        )
        assert c.task is not None and c.task.reply is not None

        failed = await client.send("watch.fail", None, max_attempts=1)
        await wait_status(client, failed, "dead", timeout=60)
        [d] = [c async for c in client.watch(failed)]
        assert (d.status, d.final, d.progress) == ("dead", True, 0.5)
        assert d.task is not None and "refused on purpose" in d.task.error

        [u] = [c async for c in client.watch("no-such-message")]
        assert (u.kind, u.status, u.final) == ("current", "unknown", True)


async def test_a_cancel_and_a_dead_letter_end_a_watch(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "watch.hold", [AGENT])
        held = await client.send("watch.hold", "g2")
        await wait_status(client, held, "running")  # started, and confirmed running
        waiting = await client.send("watch.fail", None, max_attempts=1)
        got: dict[str, list[TaskChange]] = {held: [], waiting: []}

        async def follow(msg_id: str, subscribed: anyio.Event) -> None:
            async for c in client.watch(msg_id, timeout_s=60):
                got[msg_id].append(c)
                subscribed.set()

        async with anyio.create_task_group() as tg:
            ready = [anyio.Event(), anyio.Event()]
            tg.start_soon(follow, held, ready[0])
            tg.start_soon(follow, waiting, ready[1])
            for ev in ready:
                await ev.wait()
            assert (await client.cancel(held)).cancelled  # its slot frees: the next runs
        assert [(c.kind, c.status) for c in got[held]] == [
            ("current", "running"),
            ("status", "cancelled"),
        ]
        assert got[held][-1].final
        assert [(c.kind, c.status, c.progress) for c in got[waiting]] == [
            ("current", "pending", None),
            ("status", "running", None),
            ("progress", "running", 0.5),
            ("status", "dead", None),
        ]
        assert got[waiting][-1].final


async def test_a_watch_times_out_and_refuses_a_bad_timeout(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "watch.hold", [AGENT])
        held = await client.send("watch.hold", "g3")
        await wait_status(client, held, "running")  # started, and confirmed running
        seen: list[TaskChange] = []
        with pytest.raises(DeadlineExceeded, match="still running"):
            async for c in client.watch(held, timeout_s=0.3):
                seen.append(c)
        assert [(c.kind, c.status) for c in seen] == [("current", "running")]
        with pytest.raises(ConfigError, match="timeout_s"):
            async for _ in client.watch(held, timeout_s=0):
                pass
        await open_gate(r, ns, "g3")


async def test_a_watch_survives_its_connection_killed(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "watch.hold", [AGENT])
        held = await client.send("watch.hold", "g4")
        await wait_status(client, held, "running")  # started, and confirmed running
        seen: list[TaskChange] = []
        async with anyio.create_task_group() as tg:
            first = anyio.Event()

            async def follow() -> None:
                async for c in client.watch(held, timeout_s=60):
                    seen.append(c)
                    first.set()

            tg.start_soon(follow)
            await first.wait()
            # The watcher's connection is the only one in pub/sub mode (a standalone
            # worker waits with XREAD): killed, the watch subscribes again by itself.
            assert await r.execute_command("CLIENT", "KILL", "TYPE", "pubsub") == 1

            async def subscribed_again() -> bool:
                channel = Keys(ns).task_changes(held)
                _, n = await r.execute_command("PUBSUB", "SHARDNUMSUB", channel)
                return int(n) == 1

            await wait_until(subscribed_again, what="the watch subscribed again")
            await open_gate(r, ns, "g4")
        assert [(c.kind, c.status, c.final) for c in seen] == [
            ("current", "running", False),
            ("status", "succeeded", True),
        ]


@pytest.mark.cluster
async def test_a_watch_on_a_cluster_sees_every_change(
    redis_cluster: RedisTestCluster, ns: str
) -> None:
    """On a Cluster the channel is subscribed on the master of the record's slot, and a
    caller's idempotency key (its record named by the key, found through the msg_id's
    pointer) is followed as well as a msg_id."""
    url = redis_cluster.url
    async with serving(url, ns, make(), concurrency=1, prefetch=0) as client:
        r = client.commands
        held = await client.send("watch.hold", "c1")
        await wait_status(client, held, "running")
        msg_id = await client.send("watch.steps", STEPS, idempotency_key="order-1")
        got: list[tuple[str, str, float | None]] = []
        async with anyio.create_task_group() as tg:
            first = anyio.Event()

            async def follow() -> None:
                async for c in client.watch(msg_id, timeout_s=60):
                    got.append((c.kind, c.status, c.progress))
                    first.set()

            tg.start_soon(follow)
            await first.wait()
            await r.hset(Keys(ns).effects("gate"), "c1", 1)
        assert got == [
            ("current", "pending", None),
            ("status", "running", None),
            ("progress", "running", 0.25),
            ("progress", "running", 0.5),
            ("progress", "running", 1.0),
            ("status", "succeeded", None),
        ]

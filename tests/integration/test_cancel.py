"""Cancellation (issue 14, item 2), in-process agents on a real Redis: a cancelled queued
message never runs; a running one sees ctx.cancelled at once and is cut at its grace; a
parent's cancel reaches its children; a caller whose own task is cancelled cancels the
remote work (a reach deadline does not); a finished message cannot be cancelled; forged
notices stop nothing. Side effects are counted in Redis (tests/support/agents_cancel.py)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from reach import Cancelled, Client, DeadlineExceeded
from reach.connection import AnyRedis, connect
from reach.envelope import Envelope
from reach.keys import Keys
from tests.support.agents_cancel import make
from tests.support.agents_messaging import effects, serving, wait_status
from tests.support.cluster import RedisTestCluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio


async def wait_effect(r: AnyRedis, ns: str, name: str, key: str, timeout_s: float = 20) -> None:
    async def seen() -> bool:
        return key in await effects(r, ns, name)

    await wait_until(seen, timeout_s=timeout_s, what=f"effect {name} of {key}")


class Call:
    """A request() running in the background: its result or error once it returned."""

    def __init__(self, client: Client, env: Envelope) -> None:
        self.client, self.env = client, env
        self.done = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.returned_at = 0.0

    async def run(self) -> None:
        try:
            self.result = await self.client.call(self.env)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            self.error = e
        finally:
            self.returned_at = time.monotonic()
            self.done.set()

    async def outcome(self, timeout_s: float = 20) -> BaseException | None:
        with anyio.fail_after(timeout_s):
            await self.done.wait()
        return self.error


async def dead_reasons(r: AnyRedis, ns: str, cap: str) -> dict[str, str]:
    """msg_id -> reason of the dead letters of ``cap``."""
    return {
        f[b"msg_id"].decode(): f[b"reason"].decode() for _, f in await r.xrange(Keys(ns).dlq(cap))
    }


async def test_cancelled_queued_messages_never_run(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make(), concurrency=1, prefetch=0) as client:
        blocker = await client.send("can.hold", 60)
        await wait_effect(r, ns, "started", blocker)  # the one slot is taken
        queued = [await client.send("can.work", i) for i in range(5)]
        waiting = Call(client, client.build("can.work", "req", timeout_s=30))
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting.run)
            await wait_status(client, waiting.env.msg_id, "pending")
            for m in [*queued, waiting.env.msg_id]:
                res = await client.cancel(m)
                assert (res.outcome, res.status, res.cancelled) == ("cancelled", "pending", True)
                assert (await client.task(m)).status == "cancelled"  # queued: shown cancelled
            again = await client.cancel(queued[0])
            assert (again.outcome, again.cancelled) == ("already_cancelled", True)
            assert (await client.cancel(blocker)).status == "running"  # frees the slot
            assert isinstance(await waiting.outcome(), Cancelled)
        assert await client.request("can.work", "after", timeout_s=20) == "after"
        # Only the message sent after ran: the cancelled ones never did.
        work = await effects(r, ns, "work")
        assert len(work) == 1 and not set(work) & {*queued, waiting.env.msg_id}, work
        letters = await dead_reasons(r, ns, "can.work")
        assert letters == {m: "cancelled" for m in [*queued, waiting.env.msg_id]}
        for m in queued:
            assert (await client.task(m)).status == "cancelled"  # still, once dead-lettered


async def test_a_running_handler_sees_ctx_cancelled_at_once(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, make(), cancel_grace_s=30) as client:
        call = Call(client, client.build("can.hold", 60, timeout_s=60))
        async with anyio.create_task_group() as tg:
            tg.start_soon(call.run)
            await wait_effect(r, ns, "started", call.env.msg_id)
            st = await wait_status(client, call.env.msg_id, "running")
            assert st.status == "running"
            t0_ms = int(time.time() * 1000)
            res = await client.cancel(call.env.msg_id)
            assert (res.outcome, res.status) == ("cancelled", "running")
            assert isinstance(await call.outcome(), Cancelled)
        saw = await r.hget(Keys(ns).effects("saw_ms"), call.env.msg_id)
        assert saw is not None
        # Seen through the notice, not the grace (30 s): well under a second even on a busy
        # machine (bench/cancel_bench.py measures it: docs/operations.md).
        assert 0 <= int(saw) - t0_ms < 1000
        st = await client.task(call.env.msg_id)
        assert (st.status, st.runs) == ("cancelled", 1)
        assert (await dead_reasons(r, ns, "can.hold")) == {call.env.msg_id: "cancelled"}


async def test_a_handler_that_ignores_the_cancel_is_cut_at_its_grace(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    grace = 0.5
    async with serving(redis_url, ns, make(), cancel_grace_s=grace, concurrency=1) as client:
        # With a deadline (its cancel scope is cut) ...
        call = Call(client, client.build("can.stubborn", 60, timeout_s=60))
        async with anyio.create_task_group() as tg:
            tg.start_soon(call.run)
            await wait_effect(r, ns, "started", call.env.msg_id)
            t0 = time.monotonic()
            await client.cancel(call.env.msg_id)
            assert isinstance(await call.outcome(), Cancelled)
        took = call.returned_at - t0
        assert grace * 0.8 <= took < grace + 10, took  # the grace, not the 60 s it asked for
        # ... and without one (sent without a timeout: its task is cut, no scope).
        bare = await client.send("can.stubborn", 60)
        await wait_effect(r, ns, "started", bare)
        t0 = time.monotonic()
        await client.cancel(bare)
        await wait_dead_letter(r, ns, "can.stubborn", bare)
        assert time.monotonic() - t0 < grace + 10
        assert await effects(r, ns, "finished") == {}
        for m in (call.env.msg_id, bare):
            assert (await client.task(m)).status == "cancelled"
        # The one slot is free again: the agent goes on serving.
        assert await client.request("can.work", 1, timeout_s=20) == 1


async def wait_dead_letter(r: AnyRedis, ns: str, cap: str, msg_id: str) -> None:
    async def filed() -> bool:
        return msg_id in await dead_reasons(r, ns, cap)

    await wait_until(filed, what=f"the dead letter of {msg_id}")


async def test_a_streamed_call_ends_with_cancelled_after_its_chunks(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, make(), cancel_grace_s=30) as client:
        chunks: list[Any] = []
        s = client.stream("can.stream", None, timeout_s=60)
        with pytest.raises(Cancelled):
            async for chunk in s:
                chunks.append(chunk)
                if len(chunks) == 3:
                    assert (await client.cancel(s.msg_id)).status == "running"
        assert chunks[:3] == [0, 1, 2] and chunks == list(range(len(chunks)))
        await wait_effect(r, ns, "saw_cancel", s.msg_id)
        assert (await client.task(s.msg_id)).status == "cancelled"


async def test_cancelling_a_parent_cancels_the_child_it_sent(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, make(), cancel_grace_s=30) as client:
        parent = await client.send("can.parent", None)
        await wait_effect(r, ns, "started", parent)
        child_raw = await r.hget(Keys(ns).effects("child_of"), parent)
        assert child_raw is not None
        child = child_raw.decode()
        await wait_effect(r, ns, "started", child)  # the child runs (a second slot)
        assert (await client.cancel(parent)).outcome == "cancelled"
        await wait_status(client, parent, "cancelled")
        await wait_effect(r, ns, "saw_cancel", child)  # the child's handler was told
        st = await client.task(child)
        assert st.status == "cancelled" and "parent" in st.error


async def test_a_caller_cancelled_in_its_own_code_cancels_the_remote_work(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, make(), cancel_grace_s=30) as client:
        env = client.build("can.hold", 60, timeout_s=60)
        with anyio.move_on_after(60) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call, env)
                await wait_effect(r, ns, "started", env.msg_id)
                tg.cancel_scope.cancel()  # the caller gives up (its own cancel scope)
        assert not scope.cancelled_caught
        await wait_effect(r, ns, "saw_cancel", env.msg_id)
        assert (await client.task(env.msg_id)).status == "cancelled"

        # With cancel_on_abort=False the message goes on running.
        async with Client(redis_url=redis_url, namespace=ns, cancel_on_abort=False) as keep:
            env2 = keep.build("can.hold", 60, timeout_s=60)
            async with anyio.create_task_group() as tg:
                tg.start_soon(keep.call, env2)
                await wait_effect(r, ns, "started", env2.msg_id)
                tg.cancel_scope.cancel()
        await anyio.sleep(0.5)  # time a cancel would have needed (none must come)
        assert (await client.task(env2.msg_id)).status == "running"
        assert env2.msg_id not in await effects(r, ns, "saw_cancel")
        await client.cancel(env2.msg_id)
        await wait_effect(r, ns, "saw_cancel", env2.msg_id)


async def test_a_reach_deadline_is_not_a_cancel(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make(), cancel_grace_s=30) as client:
        with pytest.raises(DeadlineExceeded):
            await client.request("can.stubborn", 60, timeout_s=1)
        [key] = await effects(r, ns, "started")
        st = await wait_status(client, key, "expired")
        assert st.status == "expired"  # the worker's deadline, not a cancel


async def test_a_finished_message_cannot_be_cancelled(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make()) as client:
        env = client.build("can.work", "x", timeout_s=20)
        assert await client.call(env) == "x"
        res = await client.cancel(env.msg_id)
        assert (res.outcome, res.status, res.cancelled) == ("already_done", "succeeded", False)
        assert (await client.task(env.msg_id)).status == "succeeded"
        assert (await client.cancel("no-such-message")).outcome == "unknown"
        assert await r.xlen(Keys(ns).dlq("can.work")) == 0


async def test_forged_notices_stop_nothing(
    redis_url: str, ns: str, r: AnyRedis, caplog: pytest.LogCaptureFixture
) -> None:
    k = Keys(ns)
    async with serving(redis_url, ns, make(), cancel_grace_s=30) as client:
        held = await client.send("can.hold", 60)
        await wait_effect(r, ns, "started", held)
        # Garbage, and a notice naming the running message whose record is not cancelled.
        for fields in (
            {"x": "y"},
            {"k": ""},
            {"k": "\xff" * 10},
            {"k": b"\xff\xfe not utf-8"},
            {"k": "k" * 5000},
            {"m": held},
            {"m": held, "k": k.idem(held)},
            {"k": k.idem("never-sent")},
        ):
            await r.xadd(k.cancels, fields)
        assert await client.request("can.work", "alive", timeout_s=20) == "alive"
        # A message read after a forged notice named its record is checked and runs.
        forged_for = client.build("can.work", "next", timeout_s=20)
        await r.xadd(k.cancels, {"m": forged_for.msg_id, "k": k.idem(forged_for.msg_id)})
        assert await client.call(forged_for) == "next"
        assert (await client.task(held)).status == "running"
        assert held not in await effects(r, ns, "saw_cancel")
        # The reader lives on: a real cancel still reaches the handler.
        await client.cancel(held)
        await wait_effect(r, ns, "saw_cancel", held)
        assert not [m for m in caplog.messages if "cancel watcher error" in m]  # data, no bug


@pytest.mark.cluster
async def test_cancel_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    # The record and the notices stream are in different slots there: cancel.lua marks the
    # record, the client adds the notice after; no message is claimed at send.
    url = redis_cluster.url
    r = await connect(url)
    try:
        async with serving(url, ns, make(), concurrency=1, prefetch=0, cancel_grace_s=30) as c:
            held = Call(c, c.build("can.hold", 60, timeout_s=60))
            async with anyio.create_task_group() as tg:
                tg.start_soon(held.run)
                await wait_effect(r, ns, "started", held.env.msg_id)
                queued = [await c.send("can.work", i) for i in range(3)]
                for m in queued:
                    assert (await c.cancel(m)).outcome == "cancelled"
                assert (await c.cancel(held.env.msg_id)).status == "running"
                assert isinstance(await held.outcome(), Cancelled)
            assert held.env.msg_id in await effects(r, ns, "saw_cancel")
            assert await c.request("can.work", "after", timeout_s=20) == "after"
            for m in queued:
                assert (await c.task(m)).status == "cancelled"
            assert len(await effects(r, ns, "work")) == 1  # only "after" ran
    finally:
        await r.aclose()


async def test_agents_sharing_a_process_share_one_reader(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    # Two agents in one process (one event loop): one of them reads the notices for both,
    # and when it stops the other takes over.
    a1, a2 = make("can-1"), make("can-2")
    async with serving(redis_url, ns, a1, a2, cancel_grace_s=30) as client:
        held = {
            a: await client.send("can.hold", 60, target=a, policy="direct")
            for a in ("can-1", "can-2")
        }
        for m in held.values():
            await wait_effect(r, ns, "started", m)
        for m in held.values():
            await client.cancel(m)
        for m in held.values():
            await wait_effect(r, ns, "saw_cancel", m)
        rts = [a1.runtime, a2.runtime]
        assert all(rt is not None for rt in rts)
        readers = [rt for rt in rts if rt is not None and rt.cancels and rt.cancels.notices_read]
        assert len(readers) == 1  # one read for both
        reader = a1 if readers[0] is a1.runtime else a2
        other = a2 if reader is a1 else a1
        reader.stop()
        # The other one takes over: a cancel still reaches its handler.
        late = await client.send("can.hold", 60, target=other.agent_id, policy="direct")
        await wait_effect(r, ns, "started", late)
        await client.cancel(late)
        await wait_effect(r, ns, "saw_cancel", late)

"""Human input (``ctx.ask``) with real `reach worker` processes: a question answered with
``client.answer``; two asks in order; a timeout; an answered ask surviving a worker
SIGKILL (the re-run gets the stored answer: one question in all); a handler waiting for
input holding no slot; the typed refusals of ``client.answer``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import reach
from reach import Agent, Client, Context, TaskChange
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.support.agents_ask import ECHO, REFUND, TWICE
from tests.support.agents_messaging import effects, serving, wait_eligible
from tests.support.cluster import RedisTestCluster
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_ask")
    yield w
    w.stop_all()


async def question_of(c: Client, msg_id: str, n: int = 1) -> TaskChange:
    """The change that shows ``msg_id`` waiting for its ask ``n``."""
    with anyio.fail_after(30):
        async for change in c.watch(msg_id):
            if change.status == "input_required" and change.task and change.task.asking == n:
                return change
            assert not change.final, f"{msg_id} ended without asking: {change}"
    raise AssertionError("the watch ended")


async def test_an_ask_answered_with_client_answer(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """The task shows input_required with the question (watch, task, the record); the
    answer resumes the handler, which returns it; the record keeps the answer."""
    workers.start("ask_a")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a"])
        msg_id = await c.send(REFUND, {"order": "A-17"}, timeout_s=60)
        change = await question_of(c, msg_id)
        assert change.question == "Refund order A-17?"
        task = await c.task(msg_id)
        assert (task.status, task.question, task.asking, task.asked) == (
            "input_required",
            "Refund order A-17?",
            1,
            1,
        )
        assert task.ask_until_ms > 0
        assert await c.answer(msg_id, {"refund": True, "note": "ok by Ana"}) == 1
        result = await c.result(msg_id, timeout_s=30)
        assert result == {"answer": {"refund": True, "note": "ok by Ana"}, "agent": "ask-a"}
        done = await c.task(msg_id)
        assert (done.status, done.question, done.asking, done.asked) == ("succeeded", "", 0, 1)
        raw = await r.hget(Keys(ns).idem(msg_id), "a:1")
        assert raw == b'{"refund":true,"note":"ok by Ana"}'
        with pytest.raises(reach.AlreadyAnswered) as already:
            await c.answer(msg_id, "again")
        assert already.value.n == 1


async def test_two_asks_come_in_order(workers: Workers, redis_url: str, ns: str) -> None:
    workers.start("ask_a")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, TWICE, ["ask-a"])
        msg_id = await c.send(TWICE, {}, timeout_s=60)
        first = await question_of(c, msg_id, 1)
        assert first.question == "First: which colour?"
        assert await c.answer(msg_id, "green") == 1
        second = await question_of(c, msg_id, 2)
        assert second.question == "Second: how many green ones?"
        assert await c.answer(msg_id, 3) == 2
        assert await c.result(msg_id, timeout_s=30) == ["green", 3]
        assert (await c.task(msg_id)).asked == 2


async def test_an_ask_times_out(workers: Workers, redis_url: str, ns: str) -> None:
    """No answer within timeout_s: AskTimeout in the handler (which returns what it said),
    the question taken back; a late answer is refused as not waiting."""
    workers.start("ask_a")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a"])
        msg_id = await c.send(REFUND, {"order": "T-1", "timeout_s": 0.5}, timeout_s=60)
        result = await c.result(msg_id, timeout_s=30)
        assert result["agent"] == "ask-a"
        assert (
            "No answer to ask 1 ('Refund order T-1?') within timeout_s=0.5" in (result["timed_out"])
        )
        task = await c.task(msg_id)
        assert (task.status, task.question, task.asking) == ("succeeded", "", 0)
        with pytest.raises(reach.NotWaitingForInput) as late:
            await c.answer(msg_id, True)
        assert late.value.status == "succeeded"


async def test_an_answered_ask_survives_a_sigkill_without_a_second_question(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """ask-a asks, gets its answer, then is SIGKILLed before it returns. Once it is
    evicted its message moves to ask-b, whose run gets the stored answer from the record
    without asking: one question in all (the record's count, and the input_required
    changes a watcher from another connection saw), two runs, the answer ask-a got."""
    procs = {"ask-a": workers.start("ask_a"), "ask-b": workers.start("ask_b")}
    seen: list[TaskChange] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a", "ask-b"])
        msg_id = await c.send(
            REFUND, {"order": "K-9", "hold_on": "ask-a"}, timeout_s=90, target="ask-a"
        )
        key = msg_id  # no idempotency key of the caller's: the record is the msg_id's

        async def watch() -> None:
            async for change in c.watch(msg_id, timeout_s=60):
                seen.append(change)

        async def watcher_saw_the_question() -> bool:
            return any(ch.status == "input_required" for ch in seen)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await question_of(c, msg_id)
            # The watcher follows from its own connection: answered before it read the
            # question, it would only ever see 'running' (a loaded run did).
            await wait_until(watcher_saw_the_question, what="the watcher saw the question")
            assert await c.answer(msg_id, "yes, refund") == 1

            async def held() -> bool:
                return (await effects(r, ns, "ask.held")).get(key) == 1

            await wait_until(held, what="ask-a holding after its answer")
            procs["ask-a"].send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(procs["ask-a"].wait)
            result = await c.result(msg_id, timeout_s=60)
        assert result == {"answer": "yes, refund", "agent": "ask-b"}
        task = await c.task(msg_id)
        assert (task.status, task.runs, task.asked) == ("succeeded", 2, 1)
    assert await effects(r, ns, "ask.started") == {key: 2}, "two runs"
    assert await effects(r, ns, "ask.answered") == {key: 2}, "both got the answer"
    asked = [ch for ch in seen if ch.status == "input_required"]
    assert len(asked) == 1, f"one question in all, the watcher saw: {seen}"
    assert seen[-1].final and seen[-1].status == "succeeded"


async def test_a_handler_waiting_for_input_holds_no_slot(
    workers: Workers, redis_url: str, ns: str
) -> None:
    """On a worker of concurrency 1, a handler waits for input while other messages run;
    answered, it takes its slot again and finishes."""
    workers.start("ask_a", "--concurrency", "1")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a"])
        waiting = await c.send(REFUND, {"order": "S-1"}, timeout_s=60)
        await question_of(c, waiting)
        for i in range(3):
            assert await c.request(ECHO, {"i": i}, timeout_s=20) == {"i": i}
        second = await c.send(REFUND, {"order": "S-2"}, timeout_s=60)
        await question_of(c, second)  # a second waiting handler: still no slot held
        assert await c.request(ECHO, "still free", timeout_s=20) == "still free"
        await c.answer(waiting, "first")
        await c.answer(second, "second")
        assert await c.result(waiting, timeout_s=30) == {"answer": "first", "agent": "ask-a"}
        assert await c.result(second, timeout_s=30) == {"answer": "second", "agent": "ask-a"}
        assert await c.request(ECHO, "after", timeout_s=20) == "after"


async def test_waiting_beyond_the_bound_keeps_the_slot(
    workers: Workers, redis_url: str, ns: str
) -> None:
    """max_waiting_handlers 0: a handler waiting for input keeps its slot (concurrency 1:
    the next message waits until it is answered)."""
    workers.start("ask_a", "--concurrency", "1", "--max-waiting-handlers", "0")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a"])
        waiting = await c.send(REFUND, {"order": "B-1"}, timeout_s=60)
        await question_of(c, waiting)
        echo = await c.send(ECHO, "queued", timeout_s=60)
        with pytest.raises(reach.DeadlineExceeded):
            await c.result(echo, timeout_s=1.0)
        await c.answer(waiting, "go")
        assert await c.result(waiting, timeout_s=30) == {"answer": "go", "agent": "ask-a"}
        assert await c.result(echo, timeout_s=30) == "queued"


async def test_answer_refusals(workers: Workers, redis_url: str, ns: str) -> None:
    workers.start("ask_a")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, ECHO, ["ask-a"])
        with pytest.raises(reach.UnknownTask):
            await c.answer("no-such-message", True)
        echo = await c.send(ECHO, "x", timeout_s=30)
        await c.result(echo, timeout_s=30)
        with pytest.raises(reach.NotWaitingForInput) as done:
            await c.answer(echo, True)
        assert done.value.status == "succeeded"
        with pytest.raises(reach.ConfigError, match="JSON"):
            await c.answer(echo, {1, 2})
        assert issubclass(reach.UnknownTask, reach.AnswerRefused)
        assert issubclass(reach.AnswerRefused, reach.ReachError)


async def test_a_task_waiting_for_input_can_be_cancelled(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """client.cancel of a task waiting for input ends it cancelled (its handler stopped in
    ctx.ask, after the grace); the worker's count of handlers in flight, which its
    drain reads, comes back to 0 (the slot it gave back is not counted twice: SIGTERM ends
    it at once), and its one slot still serves."""
    workers.start("ask_a", "--concurrency", "1", "--cancel-grace-s", "0")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a"])
        waiting = await c.send(REFUND, {"order": "X-1"}, timeout_s=60)
        await question_of(c, waiting)
        res = await c.cancel(waiting)
        assert res.cancelled and res.status == "input_required"

        async def stopped() -> bool:  # its handler ended: the worker filed its dead letter
            return int(await r.xlen(Keys(ns).dlq(REFUND))) == 1

        await wait_until(stopped, what="the cancelled handler's dead letter")
        [(_, fields)] = await r.xrange(Keys(ns).dlq(REFUND))
        assert fields[b"reason"] == b"cancelled" and fields[b"msg_id"] == waiting.encode()
        with pytest.raises(reach.NotWaitingForInput):
            await c.answer(waiting, True)
        assert await c.request(ECHO, "after", timeout_s=20) == "after"

    # Its drain ends at once: no handler is counted in flight (a count left at -1 would
    # have it wait for a handler that does not exist, forever).
    proc = workers.procs["ask_a"]
    proc.send_signal(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20)) == 0


async def test_a_drain_stops_a_waiting_handler_and_its_message_asks_again_elsewhere(
    workers: Workers, redis_url: str, ns: str
) -> None:
    """SIGTERM to a worker whose handler waits for input: the drain does not wait for it
    (exit 0 at once); its message runs again on the other agent, which puts the same
    question again (the count of questions stays 1), and the answer finishes it there."""
    procs = {"ask-a": workers.start("ask_a"), "ask-b": workers.start("ask_b")}
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a", "ask-b"])
        msg_id = await c.send(REFUND, {"order": "D-1"}, timeout_s=90, target="ask-a")
        await question_of(c, msg_id)
        procs["ask-a"].send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: procs["ask-a"].wait(timeout=20))
        assert code == 0

        async def asked_by_b() -> bool:
            t = await c.task(msg_id)
            return t.status == "input_required" and t.agent_id == "ask-b"

        await wait_until(asked_by_b, timeout_s=40, what="ask-b asking again")
        task = await c.task(msg_id)
        assert (task.question, task.asking, task.asked) == ("Refund order D-1?", 1, 1)
        assert await c.answer(msg_id, "fine") == 1
        assert await c.result(msg_id, timeout_s=30) == {"answer": "fine", "agent": "ask-b"}


@pytest.mark.cluster
async def test_ask_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    """On a Redis Cluster (the record in a slot of its own, its channel on that slot's
    node, a caller's idempotency key behind a pointer in another slot): the question shows,
    the answer wakes the handler, a retry gets the answer back without asking again."""
    runs: list[int] = []

    async def handler(payload: Any, ctx: Context) -> Any:
        runs.append(ctx.attempt)
        answer = await ctx.ask("which one?", timeout_s=30)
        if ctx.attempt == 1:
            raise RuntimeError("failing after the answer on attempt 1")
        return [answer, ctx.attempt]

    app = Agent("ask-cluster", capabilities=["ask.cluster"])
    app.handler("ask.cluster")(handler)
    async with serving(redis_cluster.url, ns, app) as c:
        msg_id = await c.send("ask.cluster", {}, timeout_s=60, idempotency_key="order-7")
        change = await question_of(c, msg_id)
        assert change.question == "which one?"
        assert await c.answer(msg_id, "the blue one") == 1
        assert await c.result(msg_id, timeout_s=30) == ["the blue one", 2]
        assert (await c.task(msg_id)).asked == 1
    assert runs == [1, 2]


async def test_a_plain_handler_asks_through_the_event_loop(redis_url: str, ns: str) -> None:
    import functools

    import anyio.from_thread

    def handler(payload: Any, ctx: Context) -> Any:
        ask = functools.partial(ctx.ask, "from a thread?", timeout_s=30)
        return {"answer": anyio.from_thread.run(ask)}

    app = Agent("ask-plain", capabilities=["ask.plain"])
    app.handler("ask.plain")(handler)
    async with serving(redis_url, ns, app, concurrency=1) as c:
        msg_id = await c.send("ask.plain", {}, timeout_s=60)
        await question_of(c, msg_id)
        await c.answer(msg_id, "yes")
        assert await c.result(msg_id, timeout_s=30) == {"answer": "yes"}


async def test_a_long_wait_keeps_its_claim(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """Claims of 0.3 s: a handler waits for input ten times that long, its claim renewed
    all along, so a second copy of the message (the caller sending again with its key)
    sent meanwhile to the other agent finds it held and waits: one run, one question, and
    both copies get the answer ask-a's handler returned."""
    lease = ("--claim-lease-s", "0.3")
    workers.start("ask_a", *lease)
    workers.start("ask_b", *lease)
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a", "ask-b"])
        kw: dict[str, Any] = {"timeout_s": 60, "idempotency_key": "refund-R-1"}
        first = await c.send(REFUND, {"order": "R-1"}, target="ask-a", **kw)
        await question_of(c, first)
        await anyio.sleep(3.0)  # the point: ten claim leases pass while it waits
        again = await c.send(REFUND, {"order": "R-1"}, target="ask-b", **kw)
        await anyio.sleep(0.5)  # ask-b had time to claim it, were the claim not renewed
        assert (await c.task(first)).status == "input_required"
        await c.answer(first, "ok")
        want = {"answer": "ok", "agent": "ask-a"}
        assert await c.result(first, timeout_s=30) == want
        assert await c.result(again, timeout_s=30) == want
        task = await c.task(first)
        assert (task.runs, task.asked) == (1, 1)
    assert await effects(r, ns, "ask.started") == {"refund-R-1": 1}, "one run"

"""Durable steps (``ctx.step``): a step's outside effect happens once per idempotency key,
across a worker SIGKILLed between two steps (real `reach worker` processes), a retry, and
a step function that raised; the journal's bounds and its end (deleted once the message
is done); a stale run's step refused."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import anyio
import anyio.from_thread
import msgspec
import pytest

import reach
from reach import Agent, Client, Context
from reach.connection import AnyRedis, connect
from reach.keys import Keys
from reach.scripts import ClaimCode, delivery
from reach.steps import MAX_STEPS, RESULT_MAX_BYTES, StepJournal
from tests.support.agents_messaging import effects, serving, wait_eligible
from tests.support.agents_steps import CAP
from tests.support.cluster import RedisTestCluster
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_steps")
    yield w
    w.stop_all()


async def journal_fields(r: AnyRedis, ns: str, key: str) -> set[bytes]:
    h = await r.hgetall(Keys(ns).idem(key))
    return {f for f in h if f.startswith(b"s:") or f == b"steps"}


# -- real worker processes ------------------------------------------------------------------
async def test_a_worker_sigkilled_between_two_steps_charges_once(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """steps-a runs the first step (charge), then stops between the steps and is SIGKILLed
    there. Once it is evicted its message moves to steps-b, which takes the claim over and
    runs the handler again: the charge comes back from the journal (made by steps-a on
    attempt 1, its effect counted once), the second step (ship) runs once, on steps-b, and
    the caller gets steps-b's result."""
    procs = {"steps-a": workers.start("steps_a"), "steps-b": workers.start("steps_b")}
    got: list[Any] = []
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, CAP, ["steps-a", "steps-b"])
        env = c.build(CAP, {"cents": 500, "hold_on": "steps-a"}, timeout_s=90, target="steps-a")
        key = env.key
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                got.append(await c.call(env))

            tg.start_soon(call)

            async def between() -> bool:
                return (await effects(r, ns, "steps.between")).get(key) == 1

            await wait_until(between, what="steps-a between its two steps")
            assert await effects(r, ns, "steps.charge") == {key: 1}
            assert await journal_fields(r, ns, key) == {b"s:charge", b"steps"}
            procs["steps-a"].send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(procs["steps-a"].wait)
        [result] = got
        assert result == {
            "receipt": {"charged": 500, "by": "steps-a", "attempt": 1},
            "shipped": "shipped by steps-b",
            "agent": "steps-b",
            "attempt": 1,
        }
        status = await c.task(env.msg_id)
        assert (status.status, status.runs, status.agent_id) == ("succeeded", 2, "steps-b")
    assert await effects(r, ns, "steps.charge") == {key: 1}, "charged once, across the kill"
    assert await effects(r, ns, "steps.ship") == {key: 1}
    assert await effects(r, ns, "steps.between") == {key: 1}, "steps-b did not stop"
    assert await journal_fields(r, ns, key) == set(), "the journal goes once the key is done"


async def test_a_retry_reuses_the_first_step(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """Attempt 1 charges, then raises between the steps; attempt 2 (a retry through the
    delayed set) gets attempt 1's charge from the journal and ships."""
    workers.start("steps_a")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, CAP, ["steps-a"])
        env = c.build(CAP, {"cents": 300, "fail_attempt": 1}, timeout_s=60)
        result = await c.call(env)
        assert result["receipt"] == {"charged": 300, "by": "steps-a", "attempt": 1}
        assert (result["attempt"], result["shipped"]) == (2, "shipped by steps-a")
        status = await c.task(env.msg_id)
        assert (status.status, status.runs) == ("succeeded", 2)
    assert await effects(r, ns, "steps.charge") == {env.key: 1}
    assert await effects(r, ns, "steps.ship") == {env.key: 1}


# -- in-process agents: what a step does and refuses ---------------------------------------
def _app(handler: Any, cap: str = "steps.local") -> Agent:
    app = Agent("steps-local", capabilities=[cap])
    app.handler(cap)(handler)
    return app


async def test_a_step_that_raises_journals_nothing_and_runs_again(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    calls: list[int] = []

    async def flaky(attempt: int) -> str:
        calls.append(attempt)
        if attempt == 1:
            raise RuntimeError("the outside service failed")
        return f"ok on {attempt}"

    seen: list[bytes | None] = []

    async def handler(payload: Any, ctx: Context) -> Any:
        try:
            return await ctx.step("call", flaky, ctx.attempt)
        finally:
            seen.append(await ctx.redis.hget(Keys(ns).idem(ctx.envelope.key), "s:call"))

    async with serving(redis_url, ns, _app(handler)) as c:
        assert await c.request("steps.local", {}, timeout_s=30) == "ok on 2"
    assert calls == [1, 2]
    assert seen[0] is None, "the failed step journaled nothing"
    assert seen[1] is not None


async def test_plain_functions_duplicate_names_and_a_thread_handler(
    redis_url: str, ns: str
) -> None:
    """A plain ``fn`` runs in a worker thread (not on the event loop); a second call of a
    name returns the first's result without calling ``fn``; a plain handler calls
    ``ctx.step`` through ``anyio.from_thread.run`` (keywords: with ``partial``); values come back as decoded from the
    journal (a tuple as a list) on the first run too."""
    loop_thread = threading.get_ident()
    ran_in: list[int] = []

    def price(a: int, *, b: int) -> tuple[int, int]:
        ran_in.append(threading.get_ident())
        return (a, b)

    async def handler(payload: Any, ctx: Context) -> Any:
        first = await ctx.step("price", price, 1, b=2)
        second = await ctx.step("price", price, 3, b=4)
        return [first, second]

    def plain(payload: Any, ctx: Context) -> Any:
        return anyio.from_thread.run(partial(ctx.step, "price", price, 5, b=6))

    app = Agent("steps-local", capabilities=["steps.local", "steps.plain"])
    app.handler("steps.local")(handler)
    app.handler("steps.plain")(plain)
    async with serving(redis_url, ns, app) as c:
        assert await c.request("steps.local", {}, timeout_s=30) == [[1, 2], [1, 2]]
        assert await c.request("steps.plain", {}, timeout_s=30) == [5, 6]
    assert len(ran_in) == 2 and loop_thread not in ran_in


async def test_the_bounds_dead_letter_at_once(redis_url: str, ns: str, r: AnyRedis) -> None:
    """A result over RESULT_MAX_BYTES, one that cannot be encoded, and a step past
    MAX_STEPS: the caller gets Rejected at once (no retry: a retry would run the step's
    function again)."""
    calls: dict[str, int] = {}

    def counted(name: str, value: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        return value

    async def big(payload: Any, ctx: Context) -> Any:
        return await ctx.step("big", counted, "big", "x" * RESULT_MAX_BYTES)

    async def odd(payload: Any, ctx: Context) -> Any:
        return await ctx.step("odd", counted, "odd", object())

    async def many(payload: Any, ctx: Context) -> Any:
        for i in range(MAX_STEPS + 1):
            await ctx.step(f"s{i}", counted, "many", i)
        return "unreachable"

    app = Agent("steps-local", capabilities=["steps.big", "steps.odd", "steps.many"])
    app.handler("steps.big")(big)
    app.handler("steps.odd")(odd)
    app.handler("steps.many")(many)
    async with serving(redis_url, ns, app) as c:
        with pytest.raises(reach.Rejected, match=r"is 65541 bytes encoded, over the 65536"):
            await c.request("steps.big", {}, timeout_s=30)
        with pytest.raises(reach.Rejected, match="cannot be journaled"):
            await c.request("steps.odd", {}, timeout_s=30)
        env = c.build("steps.many", {}, timeout_s=30)
        msg = env.msg_id
        with pytest.raises(reach.Rejected, match=rf"journaled {MAX_STEPS} steps, the most"):
            await c.call(env)
        status = await c.task(msg)
        assert (status.status, status.runs) == ("dead", 1)
    assert calls == {"big": 1, "odd": 1, "many": MAX_STEPS}, "each run once, never retried"
    # a released key keeps its journal (a dead-letter replay would reuse it)
    assert len(await journal_fields(r, ns, msg)) == MAX_STEPS + 1


async def test_bad_step_names_are_refused_before_the_function_runs(redis_url: str, ns: str) -> None:
    ran: list[str] = []

    async def handler(payload: Any, ctx: Context) -> Any:
        out = []
        for name in ("", "n" * 201, 7):
            try:
                await ctx.step(name, ran.append, "ran")  # type: ignore[arg-type]
            except reach.ConfigError as e:
                out.append(str(e)[:30])
        return out

    async with serving(redis_url, ns, _app(handler)) as c:
        got = await c.request("steps.local", {}, timeout_s=30)
    assert len(got) == 3 and ran == []


async def test_a_stale_run_s_step_is_refused(r: AnyRedis, ns: str) -> None:
    """A run whose claim another owner took over (its worker was paused past the lease):
    its step's function runs, but the result is not journaled (StaleRun), and the new
    owner's run does not find it."""
    key = Keys(ns).idem("m-stale")

    async def claim(owner: str, takeover_from: str = "") -> int:
        [got] = await delivery.claim(
            r,
            [delivery.ClaimItem(key, 60_000, "m-stale", takeover_from)],
            cluster=False,
            owner=owner,
            ttl_ms=60_000,
            agent_id=owner.split("/")[0],
            max_takeovers=5,
        )
        assert not isinstance(got, Exception) and got.code == ClaimCode.RUN
        return got.fence

    old = await claim("a/1")
    new = await claim("b/2", takeover_from="a/1")
    calls: list[str] = []

    async def charge(who: str) -> str:
        calls.append(who)
        return who

    stale = StepJournal(r, record=key, owner="a/1", fence=old)
    with pytest.raises(reach.StaleRun, match="no longer holds the message's claim"):
        await stale.run("charge", charge, ("a",), {})
    current = StepJournal(r, record=key, owner="b/2", fence=new)
    assert await current.run("charge", charge, ("b",), {}) == "b"
    assert calls == ["a", "b"]
    assert msgspec.msgpack.decode(await r.hget(key, "s:charge")) == "b"


@pytest.mark.cluster
async def test_steps_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    """On a Redis Cluster (records in slots of their own, claimed by claim.lua): a retry
    gets the first attempt's step from the journal, and the journal goes at completion."""
    url = redis_cluster.url
    calls: list[int] = []

    async def charge(attempt: int) -> int:
        calls.append(attempt)
        return attempt

    async def handler(payload: Any, ctx: Context) -> Any:
        charged_on = await ctx.step("charge", charge, ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("failing after the step on attempt 1")
        return [charged_on, ctx.attempt]

    r = await connect(url)
    try:
        async with serving(url, ns, _app(handler)) as c:
            env = c.build("steps.local", {}, timeout_s=30)
            assert await c.call(env) == [1, 2]
        assert calls == [1]
        assert await journal_fields(r, ns, env.key) == set()
    finally:
        await r.aclose()

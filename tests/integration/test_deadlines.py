"""Deadlines for every call and fallbacks that cover failures (docs/concepts.md, *Call
graphs*), against a real Redis and in-process agents: a send that names no deadline still
ends, a child call ends before its parent, a capability's advertised timeout is what a
caller that names none gets, and the fallback answers the kinds of failure it is asked to."""

from __future__ import annotations

from typing import Any

import pytest

from reach import Agent, Context
from reach.client import Client
from reach.connection import AnyRedis
from reach.envelope import decode_envelope, now_ms
from reach.errors import DeadlineExceeded, NoAgentAvailable, RemoteError
from reach.keys import Keys
from reach.tasks import parse_dead_letter
from tests.support.agents_messaging import Gate, bump, effects, serving, wait_status, wait_until

pytestmark = pytest.mark.anyio


async def dead_letters(r: AnyRedis, ns: str, capability: str) -> list[Any]:
    return [parse_dead_letter(i, f) for i, f in await r.xrange(Keys(ns).dlq(capability))]


async def test_a_send_without_a_deadline_gets_the_default_one_and_expires_unrun(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    gate = Gate()
    app = Agent("send-1", capabilities=["test.block", "test.work"])

    @app.handler("test.block")
    async def block(payload: Any, ctx: Context) -> None:
        await gate.hold()

    @app.handler("test.work")
    async def work(payload: Any, ctx: Context) -> None:
        await bump(ctx, "work")

    async with serving(redis_url, ns, app, concurrency=1) as served:
        await served.send("test.block", None, timeout_s=60)
        await gate.entered.wait()  # its one slot is taken: the next message waits
        async with Client(redis_url=redis_url, namespace=ns, default_send_timeout_s=0.5) as client:
            msg_id = await client.send("test.work", {})  # no timeout_s, no deadline_ms
            # it waits in the inbox with the client's default deadline
            [(_, fields)] = await r.xrevrange(Keys(ns).inbox("send-1", "normal"), count=1)
            env = decode_envelope(fields[b"e"])
            assert env.msg_id == msg_id and env.deadline_ms == env.sent_ms + 500
            await wait_until(
                lambda: _true(now_ms() > env.deadline_ms), what="the default deadline passed"
            )
            gate.open()  # the slot frees after the deadline: the message is never run
            st = await wait_status(client, msg_id, "expired")
            assert st.status == "expired"
        [dl] = await dead_letters(r, ns, "test.work")
        assert dl.reason == "expired" and dl.msg_id == msg_id
        assert await effects(r, ns, "work") == {}
        # None keeps sends without a deadline
        async with Client(redis_url=redis_url, namespace=ns, default_send_timeout_s=None) as client:
            msg_id = await client.send("test.work", {})
            await wait_status(client, msg_id, "succeeded")


async def _true(value: bool) -> bool:
    return value


def deadline_reporter(agent_id: str, timeout_s: float | None) -> Agent:
    """``test.adv`` (advertising ``timeout_s``): answers the deadline its message got,
    relative to when it was sent; ``test.parent`` calls it through ``ctx.client``."""
    app = Agent(agent_id, capabilities=["test.adv", "test.parent"])

    @app.handler("test.adv", timeout_s=timeout_s)
    async def adv(payload: Any, ctx: Context) -> dict[str, int]:
        return {"deadline_ms": ctx.deadline_ms, "budget_ms": ctx.deadline_ms - ctx.envelope.sent_ms}

    @app.handler("test.parent")
    async def parent(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        child = await ctx.client.request("test.adv", {}, **payload)
        return {"parent_ms": ctx.deadline_ms, "child": child}

    return app


async def test_an_advertised_timeout_is_what_a_caller_that_names_none_gets(
    redis_url: str, ns: str
) -> None:
    async with (
        serving(redis_url, ns, deadline_reporter("adv-1", 7)),
        Client(redis_url=redis_url, namespace=ns, default_timeout_s=30) as client,
    ):
        assert await client.timeout_for("test.adv") == 7.0
        assert await client.timeout_for("test.parent") == 30.0  # advertises none
        got = await client.request("test.adv", {})
        assert got["budget_ms"] == 7000  # the capability's, not the client's 30 s
        got = await client.request("test.adv", {}, timeout_s=2)
        assert got["budget_ms"] == 2000  # a caller's own timeout wins
        [got] = await client.request_many("test.adv", [{}])
        assert got["budget_ms"] == 7000
        stream = client.stream("test.adv", {})
        assert [c async for c in stream] == [] and stream.result["budget_ms"] == 7000
        # a child call naming none: the advertised 7 s, being nearer than its parent's
        got = await client.request("test.parent", {}, timeout_s=60)
        assert got["child"]["budget_ms"] == 7000
        # agents advertising different values: the longest, whichever agent answers
        async with serving(redis_url, ns, deadline_reporter("adv-2", 12)):
            client.invalidate()
            await wait_until(
                lambda: _is(client.timeout_for("test.adv"), 12.0), what="12 s advertised"
            )
            got = await client.request("test.adv", {})
            assert got["budget_ms"] == 12000


async def _is(value: Any, want: Any) -> bool:
    return bool(await value == want)


async def test_a_child_call_inherits_its_parents_deadline_less_the_margin(
    redis_url: str, ns: str
) -> None:
    async with serving(redis_url, ns, deadline_reporter("child-1", None)) as client:
        # 30 s left: the child ends 1 s (the cap of the margin) before its parent
        got = await client.request("test.parent", {}, timeout_s=30)
        assert got["child"]["deadline_ms"] == got["parent_ms"] - 1000
        # 3 s left: a tenth of what the parent has left when it calls, at most 300 ms
        got = await client.request("test.parent", {}, timeout_s=3)
        margin = got["parent_ms"] - got["child"]["deadline_ms"]
        assert 0 < margin <= 300
        # the child's own nearer timeout is kept
        got = await client.request("test.parent", {"timeout_s": 1}, timeout_s=30)
        assert got["child"]["budget_ms"] == 1000


def failing_agents(gate: Gate) -> Agent:
    app = Agent("fail-1", capabilities=["test.stall", "test.boom"])

    @app.handler("test.stall")
    async def stall(payload: Any, ctx: Context) -> None:
        await gate.hold()

    @app.handler("test.boom")
    async def boom(payload: Any, ctx: Context) -> None:
        raise RuntimeError("boom")

    return app


def fallback(capability: str, payload: Any) -> dict[str, Any]:
    return {"fallback": capability, "payload": payload}


async def test_the_fallback_answers_the_kinds_it_is_asked_to(redis_url: str, ns: str) -> None:
    gate = Gate()
    async with serving(redis_url, ns, failing_agents(gate)):
        # by default only "no agent": a deadline and a handler failure are raised
        async with Client(redis_url=redis_url, namespace=ns, fallback=fallback) as client:
            with pytest.raises(DeadlineExceeded):
                await client.request("test.stall", 1, timeout_s=0.5)
            with pytest.raises(RemoteError):
                await client.request("test.boom", 2, max_attempts=1)
            assert await client.request("test.none", 3) == fallback("test.none", 3)
        async with Client(
            redis_url=redis_url,
            namespace=ns,
            fallback=fallback,
            fallback_on={"deadline", "remote_error"},
        ) as client:
            assert await client.request("test.stall", 1, timeout_s=0.5) == fallback("test.stall", 1)
            assert await client.request("test.boom", 2, max_attempts=1) == fallback("test.boom", 2)
            assert await client.request_many("test.boom", [4, 5], max_attempts=1) == [
                fallback("test.boom", 4),
                fallback("test.boom", 5),
            ]
            with pytest.raises(NoAgentAvailable):  # "no_agent" was not asked for
                await client.request("test.none", 3)
        gate.open()

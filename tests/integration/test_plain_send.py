"""The plain send's fast path (reach._sending.plain, issue 27): a send needing nothing but a
pick skips the full path's coroutines, and its outcome is the full path's in every case:
where it lands, what is refused, what its record says. Counted in Redis, never timed."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from reach import Agent, Context, logs
from reach._sending import plain
from reach.client import Client
from reach.connection import AnyRedis
from reach.errors import Overloaded
from reach.keys import Keys
from reach.registry import Registry
from tests.support.agents_messaging import serving, wait_eligible
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio


class Counted:
    """Counts the fast path's sends (a wrapper around reach._sending.plain.send). Tracing
    is off here whatever another test of the process set up: with spans to record, every
    send takes the full path (it has the spans)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(logs, "tracing", lambda: False)
        self.calls = 0
        self._send = plain.send
        monkeypatch.setattr(plain, "send", self)

    async def __call__(self, *args: Any, **kw: Any) -> str:
        self.calls += 1
        return await self._send(*args, **kw)


async def test_concurrent_plain_sends_take_the_fast_path_and_land_as_sent(
    redis_url: str, ns: str, r: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = Registry(r, ns)
    await register(reg, "plain-a", ["test.plain"], ready=True)
    await register(reg, "plain-b", ["test.plain"], ready=True)
    fast = Counted(monkeypatch)
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.plain", ["plain-a", "plain-b"])
        await client.send("test.plain", 0)  # the quotas and splits are read: cached now
        ids = await asyncio.gather(*(client.send("test.plain", i) for i in range(1, 200)))
        assert fast.calls >= 190  # a stale cache may send a few by the full path
        keys = Keys(ns)
        a = await r.xlen(keys.inbox("plain-a", "normal"))
        b = await r.xlen(keys.inbox("plain-b", "normal"))
        assert a + b == 200 and a > 50 and b > 50  # weighted round-robin: both served
        assert len(set(ids)) == 199
        assert {(await client.task(m)).status for m in ids} == {"pending"}


async def test_a_bound_that_refuses_a_fast_send_passes_it_to_another_agent(
    redis_url: str, ns: str, r: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = Registry(r, ns)
    await register(reg, "tight", ["test.bounded"], ready=True, max_queue=3)
    await register(reg, "roomy", ["test.bounded"], ready=True)
    fast = Counted(monkeypatch)
    keys = Keys(ns)
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.bounded", ["tight", "roomy"])
        for i in range(60):  # one at a time: each pick sees the last one's outcome
            await client.send("test.bounded", i)
        assert fast.calls >= 55
        assert await r.xlen(keys.inbox("tight", "normal")) == 3
        assert await r.xlen(keys.inbox("roomy", "normal")) == 57


async def test_a_fast_send_every_agent_refuses_is_refused_as_the_full_path_refuses(
    redis_url: str, ns: str, r: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = Registry(r, ns)
    await register(reg, "only", ["test.full"], ready=True, max_queue=2)
    fast = Counted(monkeypatch)
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.full", ["only"])
        await client.send("test.full", 0)
        await client.send("test.full", 1)
        with pytest.raises(Overloaded):
            await client.send("test.full", 2)
        assert fast.calls >= 2  # the refused one went by the fast path first
        assert await r.xlen(Keys(ns).inbox("only", "normal")) == 2


async def test_concurrent_requests_take_the_fast_path_and_each_gets_its_answer(
    redis_url: str, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request (track=True) goes the fast way too: counted in flight to its agent from
    the pick until its reply, as on the full path, and answered."""
    app = Agent("plain-echo", capabilities=["test.echo"])
    release = anyio.Event()

    @app.handler("test.echo")
    async def echo(payload: int, ctx: Context) -> int:
        if payload:
            await release.wait()
        return payload * 2

    fast = Counted(monkeypatch)
    got: dict[int, int] = {}

    async def ask(client: Client, i: int) -> None:
        got[i] = await client.request("test.echo", i)

    async with serving(redis_url, ns, app) as client:
        await client.request("test.echo", 0)  # the quotas and splits are read: cached now
        async with anyio.create_task_group() as tg:
            for i in range(1, 21):
                tg.start_soon(ask, client, i)

            async def all_in_flight() -> bool:
                return client.router.inflight.get("plain-echo", 0) == 20

            await wait_until(all_in_flight, what="20 requests in flight")
            release.set()
        assert got == {i: i * 2 for i in range(1, 21)}
        assert fast.calls >= 19
        assert client.router.inflight.get("plain-echo", 0) == 0  # every one counted out

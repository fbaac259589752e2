"""User hooks on a real worker: they see a message's life, and one that raises changes
nothing for the messages."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from reach import Agent, Context, Hooks
from reach.connection import AnyRedis
from reach.envelope import Envelope
from reach.hooks import Outcome, WorkerInfo
from tests.support.agents_messaging import serving, wait_until

pytestmark = pytest.mark.anyio


class Seen(Hooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []  # (hook, msg_id, detail)
        self.started: list[str] = []

    def on_start(self, worker: WorkerInfo) -> None:
        self.started.append(worker.agent_id)

    def on_delivered(self, env: Envelope) -> None:
        self.events.append(("on_delivered", env.msg_id, ""))

    def before_handle(self, ctx: Context) -> None:
        self.events.append(("before_handle", ctx.msg_id, ctx.agent_id))

    def after_handle(self, ctx: Context, outcome: Outcome, duration_s: float | None) -> None:
        self.events.append(("after_handle", ctx.msg_id, outcome.status))
        assert duration_s is not None and duration_s >= 0

    def on_retry(self, env: Envelope, delay_s: float, error: str) -> None:
        self.events.append(("on_retry", env.msg_id, error))

    def after_settle(self, env: Envelope | None, outcome: str, reason: str) -> None:
        self.events.append(("after_settle", env.msg_id if env else "", outcome))


class Broken(Hooks):
    def before_handle(self, ctx: Context) -> None:
        raise RuntimeError("hook bug")

    def after_settle(self, env: Envelope | None, outcome: str, reason: str) -> None:
        raise RuntimeError("hook bug")


async def test_a_user_hook_sees_a_message_from_delivery_to_settlement(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    seen = Seen()
    app = Agent("hooked-1", capabilities=["hook.echo"], hooks=[seen])
    runs: dict[str, int] = {}

    @app.handler("hook.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        runs[ctx.msg_id] = runs.get(ctx.msg_id, 0) + 1
        if payload == "flaky" and ctx.attempt == 1:
            raise ValueError("first attempt fails")
        return payload

    async with serving(redis_url, ns, app) as client:
        env = client.build("hook.echo", {"x": 1}, timeout_s=10)
        assert await client.call(env) == {"x": 1}
        flaky = client.build("hook.echo", "flaky", timeout_s=10)
        assert await client.call(flaky) == "flaky"

        def events(msg_id: str) -> list[tuple[str, str]]:
            return [(h, d) for h, m, d in seen.events if m == msg_id]

        async def settled() -> bool:
            return ("after_settle", "succeeded") in events(flaky.msg_id)

        await wait_until(settled, what="the retried message settled")

    assert seen.started == ["hooked-1"]
    assert events(env.msg_id) == [
        ("on_delivered", ""),
        ("before_handle", "hooked-1"),
        ("after_handle", "succeeded"),
        ("after_settle", "succeeded"),
    ]
    assert events(flaky.msg_id) == [
        ("on_delivered", ""),
        ("before_handle", "hooked-1"),
        ("after_handle", "retrying"),
        ("on_retry", "first attempt fails"),
        ("after_settle", "retrying"),
        ("on_delivered", ""),
        ("before_handle", "hooked-1"),
        ("after_handle", "succeeded"),
        ("after_settle", "succeeded"),
    ]


async def test_a_hook_that_raises_changes_nothing_for_the_messages(
    redis_url: str, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Agent("hooked-2", capabilities=["hook.echo"], hooks=[Broken()])
    app.add_hooks(seen := Seen())

    @app.handler("hook.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return payload

    with caplog.at_level(logging.ERROR, logger="reach.hooks"):
        async with serving(redis_url, ns, app) as client:
            for i in range(5):
                assert await client.request("hook.echo", i, timeout_s=10) == i

            async def all_settled() -> bool:
                return sum(1 for h, _, _ in seen.events if h == "after_settle") == 5

            await wait_until(all_settled, what="five messages settled")
    lines = [r.getMessage() for r in caplog.records if r.name == "reach.hooks"]
    # one line per failing hook method (with its traceback), not one per message
    assert len(lines) == 2, lines
    assert any("Broken.before_handle" in x for x in lines)
    assert any("Broken.after_settle" in x for x in lines)
    # the hooks after the broken one still ran
    assert sum(1 for h, _, _ in seen.events if h == "before_handle") == 5

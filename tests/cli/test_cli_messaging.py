"""`reach send / task / queues / dlq` against a real Redis and an agent in the test's loop.

The CLI runs its own event loop, so each invocation goes to a worker thread.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

import reach
from reach import Agent, Context
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.support.agents_messaging import Gate, serving, wait_status, wait_until

pytestmark = pytest.mark.anyio


def make_agent(gate: Gate) -> Agent:
    app = Agent("cli-agent-1", capabilities=["test.echo", "test.refuse", "test.hold"])

    @app.handler("test.echo")
    async def echo(payload: Any, ctx: Context) -> dict[str, Any]:
        return {"echo": payload, "priority": ctx.priority, "session": ctx.session_id}

    @app.handler("test.refuse")
    async def refuse(payload: Any, ctx: Context) -> None:
        raise reach.Reject(f"refused {payload}")

    @app.handler("test.hold")
    async def hold(payload: Any, ctx: Context) -> None:
        await gate.hold()

    return app


class Cli:
    def __init__(self, redis_url: str, ns: str) -> None:
        self.common = ["--redis-url", redis_url, "--namespace", ns]
        self.runner = CliRunner()

    async def __call__(self, *args: str, ok: bool = True) -> Any:
        res = await anyio.to_thread.run_sync(
            lambda: self.runner.invoke(cli_app, [*args, *self.common])
        )
        if ok:
            assert res.exit_code == 0, (args, res.exit_code, res.output, res.exception)
        return res

    async def json(self, *args: str) -> Any:
        return json.loads((await self(*args, "--json")).stdout)


async def test_send_task_queues_and_dead_letters_from_the_cli(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    gate = Gate()
    cli = Cli(redis_url, ns)
    async with serving(redis_url, ns, make_agent(gate), concurrency=1) as client:
        # send --wait --json: the handler's result
        out = await cli.json(
            "send",
            "test.echo",
            '{"a": 1}',
            "--wait",
            "--priority",
            "high",
            "--session",
            "s-9",
            "--timeout-s",
            "10",
        )
        assert out == {"result": {"echo": {"a": 1}, "priority": "high", "session": "s-9"}}
        res = await cli("send", "test.echo", "[1, 2]", "--wait")
        assert json.loads(res.stdout) == {"echo": [1, 2], "priority": "normal", "session": ""}

        # send (fire and forget) prints the msg_id; task shows its status and result
        msg_id = (await cli("send", "test.echo", '"ping"')).stdout.strip()
        assert len(msg_id) == 32
        await wait_status(client, msg_id, "succeeded")
        t = await cli.json("task", msg_id)
        assert (t["msg_id"], t["status"], t["result"]) == (
            msg_id,
            "succeeded",
            {"echo": "ping", "priority": "normal", "session": ""},
        )
        assert t["agent_id"] == "cli-agent-1" and t["runs"] == 1
        res = await cli("task", "no-such-message", ok=False)
        assert res.exit_code == 1

        # queues: the one slot held, three messages waiting in the inbox
        await cli("send", "test.hold", "null")
        await gate.entered.wait()
        for p in ("high", "low", "low"):
            await cli("send", "test.echo", '"queued"', "--priority", p)
        [q] = await cli.json("queues")
        assert q["agent_id"] == "cli-agent-1"
        assert (q["high"], q["normal"], q["low"]) == (1, 1, 2)  # normal: the held entry
        # pending: the held entry, plus those the worker has read ahead (RuntimeOptions.prefetch)
        assert 1 <= q["pending"] <= 4 and q["oldest_pending_age_ms"] > 0  # held since before
        gate.open()

        async def drained() -> bool:
            [q] = await cli.json("queues")
            return (q["high"], q["normal"], q["low"], q["pending"]) == (0, 0, 0, 0)

        await wait_until(drained, what="queues drained")
        text = (await cli("queues")).stdout
        assert "cli-agent-1" in text

        # a rejected message: send --wait fails with a clear error, dlq list / show see it
        res = await cli("send", "test.refuse", '"x"', "--wait", ok=False)
        assert res.exit_code == 2 and "refused" in res.output
        refused_id = await client.send("test.refuse", "y")
        await wait_status(client, refused_id, "dead")
        letters = await cli.json("dlq", "list")
        assert [(d["capability"], d["reason"]) for d in letters] == [
            ("test.refuse", "rejected")
        ] * 2
        [d] = [d for d in letters if d["msg_id"] == refused_id]
        assert d["error"] == "refused y" and d["attempts"] == 1
        assert await cli.json("dlq", "list", "--cap", "test.echo") == []

        shown = await cli.json("dlq", "show", d["id"])
        assert shown["msg_id"] == refused_id and shown["payload"] == "y"
        assert shown["envelope"]["capability"] == "test.refuse"
        text = (await cli("dlq", "show", d["id"])).stdout
        assert "rejected" in text and refused_id in text
        res = await cli("dlq", "show", "0-1", ok=False)
        assert res.exit_code == 2 and "No dead letter" in res.output

        # purge needs --yes
        res = await cli("dlq", "purge", ok=False)
        assert res.exit_code != 0 and "--yes" in res.output
        assert len(await cli.json("dlq", "list")) == 2
        res = await cli("dlq", "purge", "--yes")
        assert "purged 2" in res.stdout
        assert await cli.json("dlq", "list") == []
        assert await r.exists(Keys(ns).dlq("test.refuse")) == 0

"""`reach tasks` lists recent messages with the console's filters (and --json); listings fit
the terminal's width, `--wide` shows everything."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

import reach
from tests.support.agents_failing import failing_agent
from tests.support.agents_messaging import serving, wait_status, wait_until

pytestmark = pytest.mark.anyio


async def cli(
    url: str, ns: str, *args: str, code: int = 0, env: dict[str, str] | None = None
) -> str:
    common = ["--redis-url", url, "--namespace", ns]
    res = await anyio.to_thread.run_sync(
        lambda: CliRunner().invoke(cli_app, [*args, *common], env=env)
    )
    assert res.exit_code == code, (args, res.exit_code, res.output)
    return res.stdout if code == 0 else res.output


def wide_agent() -> reach.Agent:
    caps = [f"text.capability_with_a_long_name_{i}" for i in range(4)]
    app = reach.Agent(
        "summarizer-with-a-long-agent-id-1",
        capabilities=caps,
        metadata={"region": "eu-west-1", "model": "a-model-with-a-long-name", "tier": "gold"},
    )
    for c in caps:
        app.handler(c)(_echo)
    return app


async def _echo(payload: Any, ctx: reach.Context) -> Any:
    return payload


def echo_agent() -> reach.Agent:
    app = reach.Agent("echo-t1", capabilities=["tasks.echo"])
    app.handler("tasks.echo")(_echo)
    return app


async def test_reach_tasks_lists_and_filters(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, failing_agent(), echo_agent()) as client:
        env = client.build("fail.key", {"no": 1}, timeout_s=15, max_attempts=1)
        with pytest.raises(reach.RemoteError):
            await client.call(env)
        await wait_status(client, env.msg_id, "dead")
        echo = client.build("tasks.echo", 1, timeout_s=15)
        assert await client.call(echo) == 1

        async def listed() -> Any:  # the index's rows may be held for a moment
            out = json.loads(await cli(redis_url, ns, "tasks", "--agent", "failing-1", "--json"))
            mine = json.loads(await cli(redis_url, ns, "tasks", "--agent", "echo-t1", "--json"))
            return out if out["messages"] and mine["messages"] else None

        out = await wait_until(listed, what="the messages listed")
        [m] = out["messages"]  # --agent: not the echo agent's message
        everything = json.loads(await cli(redis_url, ns, "tasks", "--json"))
        assert [x["msg_id"] for x in everything["messages"]] == [echo.msg_id, env.msg_id]
        echoed = json.loads(await cli(redis_url, ns, "tasks", "--agent", "echo-t1", "--json"))
        assert [x["msg_id"] for x in echoed["messages"]] == [echo.msg_id]
        assert (m["msg_id"], m["status"], m["capability"]) == (env.msg_id, "dead", "fail.key")
        assert (m["agent_id"], m["error_type"], m["error"]) == ("failing-1", "KeyError", "'txt'")
        assert out["next"] == ""
        failed = json.loads(await cli(redis_url, ns, "tasks", "--status", "failed", "--json"))
        assert [x["msg_id"] for x in failed["messages"]] == [env.msg_id]
        other = json.loads(await cli(redis_url, ns, "tasks", "--cap", "fail.deep", "--json"))
        assert other["messages"] == []
        text = await cli(redis_url, ns, "tasks", "--since", "1h")
        assert env.msg_id in text and "KeyError: 'txt'" in text
        narrow = await cli(redis_url, ns, "tasks", env={"COLUMNS": "80"})
        assert max(len(line) for line in narrow.splitlines()) <= 80, narrow
        assert env.msg_id in narrow and "--wide" in narrow  # the id whole, a column left out
        # too narrow for the columns' floors: wider lines, never a cut id
        assert env.msg_id in await cli(redis_url, ns, "tasks", env={"COLUMNS": "50"})
        future = str(int(time.time() * 1000) + 3_600_000)  # --since an hour from now
        later = json.loads(await cli(redis_url, ns, "tasks", "--since", future, "--json"))
        assert later["messages"] == []
        bad = await cli(redis_url, ns, "tasks", "--since", "yesterday", code=2)
        assert "error: --since" in bad
        bad = await cli(redis_url, ns, "tasks", "--status", "broken", code=2)
        assert "use one of pending, running" in bad


async def test_reach_agents_fits_100_columns_and_wide_shows_all(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, wide_agent()):
        narrow = await cli(redis_url, ns, "agents", env={"COLUMNS": "100"})
        wide = await cli(redis_url, ns, "agents", "--wide", env={"COLUMNS": "100"})
    lines = narrow.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= 100, narrow
    assert "summarizer-with-a-long-agent-id-1" in narrow  # the id stays whole
    assert "not shown: metadata" in lines[-1] and "--wide" in lines[-1]
    assert "region=eu-west-1" in wide and "not shown" not in wide
    assert max(len(line) for line in wide.splitlines()) > 100  # whole cells, wide lines


async def test_reach_tasks_scheduled_lists_the_waiting_sends(redis_url: str, ns: str) -> None:
    async with reach.Client(redis_url=redis_url, namespace=ns) as client:
        later = await client.send("sch.b", 2, delay_s=7200)
        first = await client.send("sch.a", 1, delay_s=3600, priority="high")
        out = json.loads(await cli(redis_url, ns, "tasks", "--scheduled", "--json"))
        assert out["total"] == 2
        assert [(s["msg_id"], s["capability"]) for s in out["scheduled"]] == [
            (first, "sch.a"),
            (later, "sch.b"),
        ]
        assert out["scheduled"][0]["priority"] == "high"
        assert out["scheduled"][0]["due_ms"] < out["scheduled"][1]["due_ms"]
        only = json.loads(
            await cli(redis_url, ns, "tasks", "--scheduled", "--cap", "sch.b", "--json")
        )
        assert [s["msg_id"] for s in only["scheduled"]] == [later]
        text = await cli(redis_url, ns, "tasks", "--scheduled", "--wide")
        assert first in text and "sch.a" in text and "in 59m" in text  # 3600 s ahead, less now
        await cli(redis_url, ns, "tasks", "--scheduled", "--status", "dead", code=2)
        await client.cancel(first)
        out = json.loads(await cli(redis_url, ns, "tasks", "--scheduled", "--json"))
        assert [s["msg_id"] for s in out["scheduled"]] == [later]


async def test_reach_send_at_or_delay_schedules(redis_url: str, ns: str) -> None:
    by_delay = (
        await cli(redis_url, ns, "send", "sch.cli", '{"a": 1}', "--delay-s", "3600")
    ).strip()
    when = (datetime.now(UTC) + timedelta(days=100)).replace(microsecond=0)
    due_ms = int(when.timestamp()) * 1000
    by_at = json.loads(
        await cli(redis_url, ns, "send", "sch.cli", "2", "--at", when.isoformat(), "--json")
    )["msg_id"]
    out = json.loads(await cli(redis_url, ns, "tasks", "--scheduled", "--json"))
    assert [s["msg_id"] for s in out["scheduled"]] == [by_delay, by_at]
    assert out["scheduled"][1]["due_ms"] == due_ms
    task = json.loads(await cli(redis_url, ns, "task", by_at, "--json"))
    assert (task["status"], task["due_ms"]) == ("scheduled", due_ms)
    naive = when.replace(tzinfo=None).isoformat()
    for bad in (["--at", "tomorrow"], ["--at", naive], ["--delay-s", "-1"]):
        err = await cli(redis_url, ns, "send", "sch.cli", "1", *bad, code=2)
        assert "at" in err or "delay_s" in err
    await cli(redis_url, ns, "send", "sch.cli", "1", "--delay-s", "5", "--wait", code=2)

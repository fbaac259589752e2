"""`reach audit`: every change the `reach` command makes is in it, as who made it
(`reach --as`, REACH_OPERATOR, else the OS user), with `--json`, `--action`, `--since`, and
`--follow` (a process of its own) printing new entries as they come."""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import sys
from typing import Any

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner, Result

from reach import audit
from reach.client import Client
from reach.connection import AnyRedis
from reach.envelope import encode, now_ms
from reach.keys import Keys
from reach.registry import Registry
from reach.tasks import dead_letter_op
from tests.support.registry_helpers import register
from tests.support.workers import ROOT

pytestmark = pytest.mark.anyio
CAP = "text.summarize"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(audit.ENV_OPERATOR, raising=False)
    monkeypatch.delenv(audit.ENV_RETENTION, raising=False)


class Cli:
    def __init__(self, redis_url: str, ns: str) -> None:
        self.common = ["--redis-url", redis_url, "--namespace", ns]

    async def __call__(self, *args: str, who: str | None = None, **env: str) -> Result:
        runner = CliRunner()
        head = ["--as", who] if who else []
        return await anyio.to_thread.run_sync(
            lambda: runner.invoke(cli_app, [*head, *args, *self.common], env=env or None)
        )

    async def entries(self, *args: str) -> list[dict[str, Any]]:
        res = await self("audit", "--json", *args)
        assert res.exit_code == 0, res.output
        rows: list[dict[str, Any]] = json.loads(res.output)
        return rows


async def _letter(r: AnyRedis, ns: str, data: bytes, msg_id: str = "") -> str:
    op = dead_letter_op(Keys(ns), capability=CAP, reason="rejected", data=data, msg_id=msg_id)
    entry = await r.execute_command(*op)
    return entry.decode() if isinstance(entry, bytes) else str(entry)


async def test_every_change_of_the_cli_is_in_the_audit_trail(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    cli = Cli(redis_url, ns)
    reg = Registry(r, ns)
    _, instance, _ = await register(reg, "sum-1", [CAP])
    await reg.mark_ready("sum-1", instance_id=instance)
    async with Client(redis=r, namespace=ns) as client:
        env = client.build(CAP, {"x": 1}, reply=False)
        pending = await client.send(CAP, {"y": 2})
    letter = await _letter(r, ns, encode(env), env.msg_id)

    done = [
        await cli("caps", "limit", CAP, "50/s", "--burst", "5", who="alice"),
        await cli("caps", "limit", CAP, "--clear", who="alice"),
        await cli("quota", "set", "--max-inbox", "100", who="alice"),
        await cli("quota", "clear", who="alice"),
        await cli("dlq", "replay", letter, who="alice"),
        await cli("cancel", pending, who="alice"),
        await cli("task", "answer", "no-such-task", "true", who="alice"),  # refused: exit 1
        await cli("sweep", who="alice"),
        await cli("agents", "drain", "sum-1", who="alice"),
    ]
    await _letter(r, ns, b"\0")
    done.append(await cli("dlq", "purge", "--cap", CAP, "--yes", REACH_OPERATOR="bob"))
    assert [d.exit_code for d in done] == [0, 0, 0, 0, 0, 0, 1, 0, 0, 0], [d.output for d in done]

    rows = await cli.entries()
    assert [(e["action"], e["who"], e["via"]) for e in rows] == [
        ("caps.limit", "alice", "cli"),
        ("caps.limit.clear", "alice", "cli"),
        ("quota.set", "alice", "cli"),
        ("quota.clear", "alice", "cli"),
        ("dlq.replay", "alice", "cli"),
        ("cancel", "alice", "cli"),
        ("task.answer", "alice", "cli"),
        ("sweep", "alice", "cli"),
        ("agents.drain", "alice", "cli"),
        ("dlq.purge", "bob", "cli"),  # REACH_OPERATOR
    ]
    by = {e["action"]: e for e in rows}
    assert by["caps.limit"]["target"] == CAP and by["caps.limit"]["detail"] == {
        "limit": "50/s (burst 5)"
    }
    assert by["quota.set"]["detail"] == {"max_inbox": "100"}
    assert by["dlq.replay"]["msg_id"] == env.msg_id and by["dlq.replay"]["detail"]["replayed"] == 1
    assert by["cancel"]["msg_id"] == pending and by["cancel"]["outcome"] == "ok"
    answer = by["task.answer"]
    assert answer["outcome"] == "error" and "No task 'no-such-task'" in answer["error"]
    assert by["agents.drain"]["target"] == "sum-1"
    assert by["dlq.purge"]["detail"] == {"purged": 1}
    assert all(e["outcome"] == "ok" for e in rows if e["action"] != "task.answer")
    assert all(e["ts_ms"] >= now_ms() - 60_000 for e in rows)

    # Without a name: the OS user at this host.
    assert (await cli("quota", "clear")).exit_code == 0
    me = (await cli.entries("--limit", "1"))[0]
    assert me["who"] == f"{getpass.getuser()}@{socket.gethostname()}"

    # --action (a family or one), --since, --limit; the table
    assert [e["action"] for e in await cli.entries("--action", "dlq")] == [
        "dlq.replay",
        "dlq.purge",
    ]
    assert [e["action"] for e in await cli.entries("--action", "caps.limit")] == [
        "caps.limit",
        "caps.limit.clear",
    ]
    assert await cli.entries("--since", str(now_ms() + 3_600_000)) == []
    assert len(await cli.entries("--since", "1h", "--limit", "3")) == 3
    table = await cli("audit", "--action", "cancel")
    assert table.exit_code == 0 and "audit trail of" in table.output and "kept 30d" in table.output
    assert "cancel" in table.output and "alice (cli)" in table.output
    bad = await cli("audit", "--since", "yesterday")
    assert bad.exit_code != 0 and "--since" in bad.output


async def test_help_names_the_retention(redis_url: str, ns: str) -> None:
    res = await Cli(redis_url, ns)("audit", "--help")
    assert res.exit_code == 0
    assert "REACH_AUDIT_RETENTION" in res.output and "30d" in res.output


async def test_the_retention_setting_applies_to_the_commands_writes(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    keys = Keys(ns)
    await r.xadd(keys.audit, {"kind": "operator", "action": "old"}, id=now_ms() - 2 * 86_400_000)
    cli = Cli(redis_url, ns)
    assert (await cli("quota", "clear", REACH_AUDIT_RETENTION="3d")).exit_code == 0
    assert [e["action"] for e in await cli.entries()] == ["old", "quota.clear"]
    assert (await cli("quota", "clear", REACH_AUDIT_RETENTION="1d")).exit_code == 0
    assert [e["action"] for e in await cli.entries()] == ["quota.clear", "quota.clear"]
    table = await cli("audit", REACH_AUDIT_RETENTION="36h")
    assert "kept 36h" in table.output


def follow_process(url: str, ns: str, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "reach_cli.app", "audit", "--follow", "--json", *args]
    cmd += ["--redis-url", url, "--namespace", ns]
    env = {k: v for k, v in os.environ.items() if k != audit.ENV_OPERATOR}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)


async def read_line(p: subprocess.Popen[str]) -> dict[str, Any]:
    assert p.stdout is not None
    with anyio.fail_after(60):
        line = await anyio.to_thread.run_sync(p.stdout.readline)
    assert line, "reach audit --follow ended early"
    row: dict[str, Any] = json.loads(line)
    return row


async def test_follow_prints_new_entries_as_they_come(redis_url: str, ns: str, r: AnyRedis) -> None:
    cli = Cli(redis_url, ns)
    assert (await cli("quota", "set", "--max-inbox", "5", who="first")).exit_code == 0
    p = follow_process(redis_url, ns, "--action", "quota")
    try:
        first = await read_line(p)  # the past entry: it follows from there, nothing missed
        assert (first["action"], first["who"]) == ("quota.set", "first")
        assert (await cli("caps", "limit", CAP, "5/s", who="other")).exit_code == 0  # filtered
        assert (await cli("quota", "clear", who="second")).exit_code == 0
        second = await read_line(p)
        assert (second["action"], second["who"], second["via"]) == ("quota.clear", "second", "cli")
        assert second["id"] > first["id"]
    finally:
        p.kill()
        p.wait(timeout=10)

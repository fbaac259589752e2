"""`reach task MSG_ID --follow`: each change of a task printed as it happens (one JSON
object per line with --json) until the final one, from a process that did not send it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

from reach import Client
from reach.keys import Keys
from tests.support.agents_messaging import wait_eligible, wait_status
from tests.support.workers import ROOT, Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_watch")
    w.start("app", "--concurrency", "1", "--prefetch", "0")
    yield w
    w.stop_all()


def follow_process(url: str, ns: str, msg_id: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "reach_cli.app", "task", msg_id, "--follow", "--json"]
    cmd += ["--redis-url", url, "--namespace", ns]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)


async def read_line(p: subprocess.Popen[str]) -> dict[str, Any]:
    assert p.stdout is not None
    with anyio.fail_after(60):
        line = await anyio.to_thread.run_sync(p.stdout.readline)
    assert line, "reach task --follow ended early"
    row: dict[str, Any] = json.loads(line)
    return row


async def test_follow_prints_each_change_as_it_happens(
    workers: Workers, redis_url: str, ns: str
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "watch.steps", ["watch-1"])
        held = await client.send("watch.hold", "cli")
        await wait_status(client, held, "running")
        msg_id = await client.send("watch.steps", [[0.5, "half"], [1.0, "all"]])
        p = follow_process(redis_url, ns, msg_id)
        try:
            first = await read_line(p)  # printed once it follows: nothing after is missed
            assert (first["kind"], first["status"], first["final"]) == ("current", "pending", False)
            await client.commands.hset(Keys(ns).effects("gate"), "cli", 1)
            rows = [await read_line(p) for _ in range(4)]
            with anyio.fail_after(30):
                code = await anyio.to_thread.run_sync(p.wait)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        assert code == 0
        assert [(r["kind"], r["status"], r["progress"], r["note"]) for r in rows] == [
            ("status", "running", None, ""),
            ("progress", "running", 0.5, "half"),
            ("progress", "running", 1.0, "all"),
            ("status", "succeeded", None, ""),
        ]
        assert rows[-1]["final"] is True and rows[-1]["result"] == 2 and rows[-1]["error"] == ""
        assert all(r["msg_id"] == msg_id for r in [first, *rows])


async def test_follow_of_a_finished_or_unknown_task_ends_at_once(
    workers: Workers, redis_url: str, ns: str
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "watch.steps", ["watch-1"])
        msg_id = await client.send("watch.steps", [[0.3, "one step"]])
        await wait_status(client, msg_id, "succeeded", timeout=60)
    common = ["--redis-url", redis_url, "--namespace", ns]

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli_app, [*args, *common])

    res = await anyio.to_thread.run_sync(run, "task", msg_id, "--follow")
    assert res.exit_code == 0, res.output
    [line] = res.stdout.splitlines()
    assert line.split()[1:] == ["succeeded", "30%", "one", "step", "result:", "1"]
    res = await anyio.to_thread.run_sync(run, "task", "no-such-message", "-f", "--json")
    assert res.exit_code == 1
    [row] = [json.loads(x) for x in res.stdout.splitlines()]
    assert (row["status"], row["final"]) == ("unknown", True)

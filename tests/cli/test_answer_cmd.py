"""`reach task answer MSG_ID JSON` (a process of its own) answers the question a real
`reach worker` process's handler asked, which `reach task MSG_ID` shows; the refusals
(answered already, waiting for nothing, no such task, not JSON) are one line and an exit
code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest

from reach import Client
from tests.support.agents_ask import ECHO, REFUND
from tests.support.agents_messaging import wait_eligible
from tests.support.waiting import wait_until
from tests.support.workers import ROOT, Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_ask")
    yield w
    w.stop_all()


async def reach(url: str, ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "reach_cli.app", *args, "--redis-url", url, "--namespace", ns]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd,
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    return await anyio.to_thread.run_sync(run)


async def test_reach_task_answer(workers: Workers, redis_url: str, ns: str) -> None:
    workers.start("ask_a")
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, REFUND, ["ask-a"])
        msg_id = await c.send(REFUND, {"order": "C-3"}, timeout_s=60)

        async def waiting() -> bool:
            return (await c.task(msg_id)).status == "input_required"

        await wait_until(waiting, what="the handler asking")
        shown = await reach(redis_url, ns, "task", msg_id, "--json")
        assert shown.returncode == 0, shown.stderr
        task = json.loads(shown.stdout)
        assert (task["status"], task["question"], task["asking"]) == (
            "input_required",
            "Refund order C-3?",
            1,
        )
        not_json = await reach(redis_url, ns, "task", "answer", msg_id, "yes please")
        assert not_json.returncode == 2
        assert "is not JSON" in not_json.stderr and "'\"yes, refund it\"'" in not_json.stderr
        # Nested past what the JSON reader recurses into (the CLI fuzzer's find): a usage
        # error too, not a traceback.
        deep = await reach(redis_url, ns, "task", "answer", msg_id, "[" * 5000)
        assert deep.returncode == 2
        assert "nested too deeply" in deep.stderr and "Traceback" not in deep.stderr
        wrong = await reach(redis_url, ns, "task", "answer", msg_id, "true", "--ask", "2")
        assert wrong.returncode == 1
        assert "waits for the answer to another question, not to ask 2" in wrong.stderr

        done = await reach(redis_url, ns, "task", "answer", msg_id, '{"refund": true}', "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"msg_id": msg_id, "answered": 1}
        assert await c.result(msg_id, timeout_s=30) == {
            "answer": {"refund": True},
            "agent": "ask-a",
        }

        again = await reach(redis_url, ns, "task", "answer", msg_id, "false")
        assert again.returncode == 1
        assert again.stderr.startswith("error: ") and "answered already" in again.stderr

        echo = await c.send(ECHO, 1, timeout_s=30)
        await c.result(echo, timeout_s=30)
        idle = await reach(redis_url, ns, "task", "answer", echo, "1")
        assert idle.returncode == 1 and "waits for no answer (it is succeeded)" in idle.stderr
        unknown = await reach(redis_url, ns, "task", "answer", "no-such-task", "1")
        assert unknown.returncode == 1 and "No task 'no-such-task'" in unknown.stderr

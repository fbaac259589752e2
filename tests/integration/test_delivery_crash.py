"""SIGKILL of a real `reach worker` process in the middle of its handlers: the messages
stay pending, a worker restarted under the same agent_id resumes them, every side effect
happens exactly once, and every caller gets its result.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis
from reach.keys import GROUP, Keys
from tests.support.agents_messaging import (
    REPO,
    effects,
    wait_eligible,
    wait_status,
    wait_until,
    worker_cmd,
)

pytestmark = pytest.mark.anyio

AGENT = "crash-1"


class Workers:
    """Start `reach worker tests.support.agents_messaging:crash_agent` processes; kill them all at the end."""

    def __init__(self, redis_url: str, ns: str, logs: Path) -> None:
        self.cmd = worker_cmd("crash_agent", redis_url, ns, "--concurrency", "4")
        self.env = {**os.environ, "REACH_TEST_AGENT_ID": AGENT, "REACH_TEST_SLEEP_S": "60"}
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = (self.logs / f"worker-{len(self.procs)}.log").open("wb")
        p = subprocess.Popen(
            self.cmd,
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(p)
        return p

    def output(self) -> str:
        return "\n".join(
            f"--- worker {i} ---\n" + (self.logs / f"worker-{i}.log").read_text(errors="replace")
            for i in range(len(self.procs))
        )

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


@pytest.fixture
def workers(redis_url: str, ns: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(redis_url, ns, tmp_path)
    yield w
    w.stop_all()


async def pending_count(r: AnyRedis, ns: str) -> int:
    return sum([int((await r.xpending(k, GROUP))["pending"]) for k in Keys(ns).inboxes(AGENT)])


async def test_sigkill_mid_handler_is_resumed_by_the_restarted_worker_once(
    redis_url: str, ns: str, r: AnyRedis, workers: Workers
) -> None:
    first = workers.start()
    async with Client(redis_url=redis_url, namespace=ns, client_id="crash-caller") as client:
        await wait_eligible(client, "test.crash", [AGENT], timeout=30)
        old = (await client.registry.get(AGENT)).instance_id  # type: ignore[union-attr]

        # one caller waits on request/reply; two messages are fire-and-forget (polled)
        waited = client.build("test.crash", {"n": 0}, timeout_s=45)
        sent = [await client.send("test.crash", {"n": i}) for i in (1, 2)]
        ids = [waited.msg_id, *sent]
        result: dict[str, Any] = {}

        async def call() -> None:
            result["waited"] = await client.call(waited)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            for msg_id in ids:  # every handler started and sleeps before its side effect
                await wait_status(client, msg_id, "running", timeout=30)

            async def all_started() -> bool:
                return len(await effects(r, ns, "crash.started")) == 3

            await wait_until(all_started, what="3 handlers started")
            first.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(first.wait)
            assert await effects(r, ns, "crash") == {}, "no side effect before the kill"
            assert await pending_count(r, ns) == 3, "the killed worker's entries stay pending"

            workers.start()  # same agent_id, new instance
            await wait_eligible(client, "test.crash", [AGENT], instance_of={AGENT: old}, timeout=30)
            for msg_id in sent:
                st = await wait_status(client, msg_id, "succeeded", timeout=30)
                assert st.runs == 2 and st.agent_id == AGENT
        assert result["waited"]["echo"] == {"n": 0}
        assert result["waited"]["effects"] == 1 and result["waited"]["starts"] == 2

        async def settled() -> bool:
            lengths = [int(await r.xlen(k)) for k in Keys(ns).inboxes(AGENT)]
            return sum(lengths) == 0 and await pending_count(r, ns) == 0

        await wait_until(settled, what="inbox empty and nothing pending")
    assert await effects(r, ns, "crash") == {i: 1 for i in ids}, workers.output()
    assert await effects(r, ns, "crash.started") == {i: 2 for i in ids}

    # the restarted worker drains on SIGTERM and deregisters
    second = workers.procs[-1]
    second.send_signal(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(lambda: second.wait(timeout=20)) == 0, workers.output()
    assert await r.exists(Keys(ns).agent(AGENT)) == 0

"""A claim's owner is ``<agent_id>/<instance_id>``, and agent ids may hold '/': a runtime
that meets another's claim must find that owner's agent (split at the last '/': instance
ids never hold one), or it judges a live owner gone, takes its claim over and runs the
handler a second time. Real worker processes, agents "team/a" and "team/b"."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis
from tests.support.agents_messaging import effects, wait_eligible, wait_status
from tests.support.workers import FAST, ROOT

pytestmark = pytest.mark.anyio
AGENTS = ("team/a", "team/b")


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[None]:
    import sys

    procs = []
    for agent_id in AGENTS:
        env = {**os.environ, "REACH_TEST_AGENT_ID": agent_id, "REACH_TEST_SLEEP_S": "3"}
        cmd = [sys.executable, "-m", "reach_cli.app", "worker",
               "tests.support.agents_owner:slow_agent", "--redis-url", redis_url,
               "--namespace", ns, "--log-level", "warning", *FAST]  # fmt: skip
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL))
    yield
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def test_a_live_owner_whose_agent_id_has_a_slash_keeps_its_claim(
    workers: None, redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "own.slow", AGENTS, timeout=60)
        opts = {"idempotency_key": "once", "policy": "direct", "timeout_s": 60}
        first = await client.send("own.slow", 1, target="team/a", **opts)
        await wait_status(client, first, "running", timeout=30)
        # the same key to the other agent while team/a runs it: team/b meets team/a's claim
        async with anyio.create_task_group() as tg:
            second: list[object] = []

            async def again() -> None:
                second.append(await client.request("own.slow", 2, target="team/b", **opts))

            tg.start_soon(again)
        got = await client.result(first, timeout_s=60)
    assert second == [got] and got["agent"] == "team/a", (got, second)
    assert list((await effects(r, ns, "own.slow")).values()) == [1]  # one run

"""The error of a capability no agent declares, against real worker processes: its counts
are the registry's (not the empty candidate list of that capability), and a close
capability name is suggested, wherever a caller meets it: a Client, `reach send`,
`reach dlq replay` and the A2A gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from reach._sending.delivery import FIGURES_TTL_S
from reach.client import Client
from reach.connection import AnyRedis
from reach.envelope import encode
from reach.errors import NoAgentAvailable
from reach.gateway import Gateway, Tokens
from reach.keys import Keys
from reach.outcomes import Unavailable
from tests.support.agents_messaging import wait_eligible, worker_cmd
from tests.support.gateway import gateway_served, http
from tests.support.workers import ROOT

pytestmark = pytest.mark.anyio
AGENTS = ("echo-n1", "echo-n2")
TYPO = "test.ech"  # the workers serve test.echo
TOKEN = "t0ken-of-the-tests-0123456789"


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = []
    for agent_id in AGENTS:
        env = {**os.environ, "REACH_TEST_AGENT_ID": agent_id}
        cmd = worker_cmd("echo_agent", redis_url, ns)
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL))
    yield procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def assert_counted_and_suggested(message: str) -> None:
    assert f"No agent has capability {TYPO!r}" in message, message
    assert "2 live agent(s)" in message and "1 capability" in message, message
    assert "Did you mean 'test.echo'?" in message, message


def reach(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reach_cli.app", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


async def test_no_agent_error_counts_the_registry_and_suggests_a_close_name(
    workers: list[subprocess.Popen[bytes]], redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.echo", AGENTS)
        with pytest.raises(NoAgentAvailable) as got:
            await client.request(TYPO, {"x": 1}, timeout_s=10)
        assert got.value.reason == Unavailable.NO_AGENT and got.value.capability == TYPO
        assert_counted_and_suggested(str(got.value))
        with pytest.raises(NoAgentAvailable) as got:
            await client.send(TYPO, {"x": 1})
        assert_counted_and_suggested(str(got.value))
        [sent] = await client.send_many(TYPO, [{"x": 1}])
        assert isinstance(sent, NoAgentAvailable)
        assert_counted_and_suggested(str(sent))
        # nothing close: no guess, the figures still right
        with pytest.raises(NoAgentAvailable) as got:
            await client.request("billing.invoice", {}, timeout_s=10)
        assert "2 live agent(s)" in str(got.value) and "Did you mean" not in str(got.value)
        # a caller looping on the misspelt name: the registry is counted once a second at
        # most, not per send
        reg = client.view.registry
        reads, read = [0], reg.figures

        async def counted() -> tuple[int, list[str]]:
            reads[0] += 1
            return await read()

        reg.figures = counted  # type: ignore[method-assign]
        t0 = time.monotonic()
        for _ in range(200):
            with pytest.raises(NoAgentAvailable, match="Did you mean 'test.echo'"):
                await client.send(TYPO, {"x": 1})
        elapsed = time.monotonic() - t0
        assert reads[0] <= 1 + elapsed / FIGURES_TTL_S, (reads, elapsed)
        # a dead letter of the misspelt capability, replayed: the failure says the same
        env = client.build(TYPO, {"x": 2})
    common = ("--redis-url", redis_url, "--namespace", ns)
    await r.xadd(Keys(ns).dlq(TYPO), {"reason": "rejected", "error": "e", "error_type": "",
                                      "attempts": 1, "agent_id": "a", "msg_id": env.msg_id,
                                      "capability": TYPO, "ts": 1, "env": encode(env)})  # fmt: skip
    res = await anyio.to_thread.run_sync(lambda: reach("send", TYPO, "{}", *common))
    assert res.returncode != 0
    assert_counted_and_suggested(" ".join(res.stderr.split()))
    res = await anyio.to_thread.run_sync(lambda: reach("dlq", "replay", "--all", "--json", *common))
    failed: list[dict[str, Any]] = json.loads(res.stdout)["failed"]
    assert len(failed) == 1, res.stdout
    assert_counted_and_suggested(failed[0]["error"])
    # the gateway: the JSON-RPC error of a message to the misspelt capability
    gw = Gateway(Client(redis_url=redis_url, namespace=ns), tokens=Tokens([("tests", TOKEN)]))
    body = {
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"data": 1}]}},
    }  # fmt: skip
    async with gateway_served(gw) as url, http(TOKEN) as h:
        reply = await h.post(f"{url}/caps/{TYPO}", json=body, headers={"A2A-Version": "1.0"})
        err = reply.json()["error"]
        [info] = err["data"]
        assert info["metadata"] == {"reachError": "NoAgentAvailable", "reason": "no_agent"}, err
        assert_counted_and_suggested(err["message"])
        # and the card of the misspelt capability: not found, with the close name
        card = await h.get(f"{url}/caps/{TYPO}/.well-known/agent-card.json")
        assert card.status_code == 404, card.text
        assert "Did you mean 'test.echo'?" in card.text, card.text

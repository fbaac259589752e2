"""Each agent's registry record states the protocol version its runtime speaks, so a
fleet of several languages can check it: a real worker's record, ``reach agents --json``
and ``reach agents show --json`` show it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest

from reach._version import PROTOCOL_VERSION
from reach.client import Client
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.support.agents_messaging import wait_eligible, worker_cmd
from tests.support.workers import ROOT

pytestmark = pytest.mark.anyio


@pytest.fixture
def worker(redis_url: str, ns: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "REACH_TEST_AGENT_ID": "proto-1"}
    p = subprocess.Popen(
        worker_cmd("echo_agent", redis_url, ns), cwd=ROOT, env=env, stdin=subprocess.DEVNULL
    )
    yield p
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def reach(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


async def test_an_agents_record_states_its_protocol_version(
    worker: subprocess.Popen[bytes], redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.echo", ["proto-1"], timeout=60)
    assert PROTOCOL_VERSION == 2
    assert await r.hget(Keys(ns).agent("proto-1"), "protocol") == b"2"
    common = ("--redis-url", redis_url, "--namespace", ns, "--json")
    [row] = json.loads(await anyio.to_thread.run_sync(lambda: reach("agents", *common)))
    assert row["agent_id"] == "proto-1" and row["protocol"] == 2
    shown = json.loads(
        await anyio.to_thread.run_sync(lambda: reach("agents", "show", "proto-1", *common))
    )
    assert shown["protocol"] == 2

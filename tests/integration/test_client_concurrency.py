"""One Client, 5,000 concurrent requests and 5,000 concurrent sends, two worker processes
(issue 9, item 4): every call is answered, every message handled exactly once, and the
client keeps to its documented bound on Redis connections (``Client(max_connections=...)``,
64 by default).

The connections are counted by Redis: the client names its connections
``reach:<namespace>:<client_id>`` and ``CLIENT LIST`` is sampled while the calls run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import DEFAULT_MAX_CONNECTIONS, AnyRedis, pool_connections
from tests.support.agents_messaging import (
    REPO,
    echo_burst,
    effects,
    handled_by_agent,
    wait_eligible,
    worker_cmd,
)
from tests.support.connections import tcp_connections_to

pytestmark = pytest.mark.anyio

N = 5_000
AGENTS = ("echo-c1", "echo-c2")
WORKER_CONNECTIONS = 3  # issue 12: one worker process on standalone Redis, any load


@pytest.fixture
def two_workers(redis_url: str, ns: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = []
    for agent_id in AGENTS:
        cmd = worker_cmd("echo_agent", redis_url, ns, "--concurrency", "64")
        env = {**os.environ, "REACH_TEST_AGENT_ID": agent_id}
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL))
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


async def test_5000_requests_and_5000_sends_at_once_on_one_client(
    two_workers: list[subprocess.Popen[bytes]],
    redis_url: str,
    ns: str,
    r: AnyRedis,
    record_property: Any,
) -> None:
    name = f"reach:{ns}:fan-out-1"
    seen_ids: set[int] = set()
    peak = 0
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    worker_peak = dict.fromkeys(AGENTS, 0)  # TCP connections of each worker process to Redis

    async def watch() -> None:
        nonlocal peak
        while True:
            mine = [c for c in await r.client_list() if c.get("name") == name]
            seen_ids.update(int(c["id"]) for c in mine)
            peak = max(peak, len(mine))
            for agent_id, proc in zip(AGENTS, two_workers, strict=True):
                held = tcp_connections_to(proc.pid, port)
                worker_peak[agent_id] = max(worker_peak[agent_id], held)
            await anyio.sleep(0.05)

    async with Client(redis_url=redis_url, namespace=ns, client_id="fan-out-1") as client:
        await wait_eligible(client, "test.echo", AGENTS, timeout=30)
        burst = await echo_burst(client, r, ns, N, while_running=watch)
        pooled = pool_connections(client.redis)
    answers, sent, t_calls, t_all = burst.answers, burst.sent, burst.t_calls, burst.t_all

    assert [answers[i]["echo"] for i in range(N)] == list(range(N))
    by_agent = {a: sum(1 for x in answers.values() if x["agent"] == a) for a in AGENTS}
    # The spread is checked over all 10,000 messages, as the workers counted them: the
    # calls alternate request, send, request, ... and weighted round-robin over two equal
    # agents alternates too, so all the requests may rightly go to one agent and all the
    # sends to the other.
    handled = await handled_by_agent(r, ns, "echo")
    assert sum(handled.values()) == 2 * N and set(handled) == set(AGENTS), handled
    # Neither worker was starved (not an even split: slow start weighs a worker that became
    # ready a moment later a little less for its first seconds).
    assert min(handled.values()) >= 2 * N // 10, handled
    assert len(sent) == N
    done = await effects(r, ns, "echo")
    assert len(done) == 2 * N and set(done.values()) == {1}  # each handled exactly once
    assert set(sent) <= set(done)  # the sends are keyed by their msg_id
    report = (
        f"{N} requests + {N} sends on one client: calls returned in {t_calls:.1f} s, all "
        f"handled in {t_all:.1f} s; Redis connections of the client: at most {peak} "
        f"open at once, {len(seen_ids)} opened in all, {pooled} pooled at the end "
        f"(bound {DEFAULT_MAX_CONNECTIONS}); requests per agent {by_agent}, messages per "
        f"agent {handled}; connections of each worker process at most {worker_peak}"
    )
    print(report)
    record_property("client_connections", report)
    assert 1 <= peak <= DEFAULT_MAX_CONNECTIONS
    assert len(seen_ids) <= DEFAULT_MAX_CONNECTIONS
    assert pooled <= DEFAULT_MAX_CONNECTIONS
    # each worker, handling its share of 10,000 messages at concurrency 64: one multiplexed
    # connection for its commands, its blocking inbox read, its heartbeat thread
    assert all(1 <= n <= WORKER_CONNECTIONS for n in worker_peak.values()), worker_peak


FAN_OUT = 10_000
FAN_OUT_CONNECTIONS = 8  # issue 11's target for one Client, whatever the concurrency


async def test_a_10000_way_fan_out_of_requests_uses_at_most_8_connections(
    two_workers: list[subprocess.Popen[bytes]],
    redis_url: str,
    ns: str,
    r: AnyRedis,
    record_property: Any,
) -> None:
    """10,000 concurrent ``request()`` calls on one Client: all answered, no
    MaxConnectionsError, and Redis sees at most 8 connections of the client (counted with
    CLIENT LIST while the calls run: at once and opened in all). The commands of the calls
    are auto-pipelined over a few connections (reach._autopipe)."""
    name = f"reach:{ns}:fan-out-10k"
    seen_ids: set[int] = set()
    peak = 0
    stop = anyio.Event()

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            listed = await r.execute_command("CLIENT LIST")  # parsed by redis-py
            mine = [c for c in listed if c.get("name") == name]
            seen_ids.update(int(c["id"]) for c in mine)
            peak = max(peak, len(mine))
            await anyio.sleep(0.02)

    async with Client(redis_url=redis_url, namespace=ns, client_id="fan-out-10k") as client:
        await wait_eligible(client, "test.echo", AGENTS, timeout=30)
        answers: dict[int, Any] = {}

        async def ask(i: int) -> None:
            answers[i] = await client.request("test.echo", i, timeout_s=120)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            async with anyio.create_task_group() as calls:
                for i in range(FAN_OUT):
                    calls.start_soon(ask, i)
            stop.set()
        pooled = pool_connections(client.redis)
        batches, commands = client.commands.batches, client.commands.commands

    assert [answers[i]["echo"] for i in range(FAN_OUT)] == list(range(FAN_OUT))
    report = (
        f"{FAN_OUT} concurrent requests on one client: connections at most {peak} at once, "
        f"{len(seen_ids)} opened in all, {pooled} pooled at the end; {commands} commands "
        f"in {batches} writes"
    )
    print(report)
    record_property("fan_out_connections", report)
    assert 1 <= peak <= FAN_OUT_CONNECTIONS
    assert len(seen_ids) <= FAN_OUT_CONNECTIONS
    assert pooled <= FAN_OUT_CONNECTIONS

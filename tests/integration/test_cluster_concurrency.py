"""One Client on the 3-master test cluster, 2,000 concurrent requests and 2,000 concurrent
sends to three `reach worker` processes whose inboxes sit on three different masters
(issue 12, item 4): every call answered, every message handled exactly once, and a bounded
number of the client's connections on every node (``CLIENT LIST`` of each node, sampled
while the calls run: the client names its connections ``reach:<namespace>:<client_id>``),
and of each worker process's (its sockets to each node, from /proc).

The issue measured a Client failing above ~100 calls in flight on a cluster (the async
cluster client's per-node pool: ``'NoneType' object has no attribute 'writelines'``).
With auto-pipelined batches as cluster pipelines (up to 4 in flight, each taking a
connection of every node it writes to) the client held 4-6 connections on a node under this
load; multiplexed per node (reach._autopipe) it holds one for its batched commands.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis
from redis.crc import key_slot

from reach.client import Client
from reach.connection import connect, pool_connections
from reach.keys import Keys
from tests.support.agents_messaging import (
    REPO,
    echo_burst,
    effects,
    handled_by_agent,
    wait_eligible,
    worker_cmd,
)
from tests.support.cluster import RedisTestCluster, master_of_slot

pytestmark = [pytest.mark.cluster, pytest.mark.anyio]

N = 2_000
# A Client's connections on one node, whatever the concurrency: its batched commands' one
# multiplexed connection, its blocking reply read on the node of its reply stream, and
# redis-py's COMMAND GETKEYS connection (the plain client asks the default node for the
# keys of each blocking XREAD it routes) on the default node: 3 where two of these meet.
PER_NODE = 3
PER_CLIENT = 5  # all nodes: 3 multiplexed, the reply read, the GETKEYS one
# A worker process with one agent, per node: the multiplexed connection, its agent's
# blocking inbox read (on a Cluster each agent blocks on its own inbox) on its inbox's node,
# and its heartbeat thread's sync cluster client (inbox lengths, the registry shard's
# heartbeat). The registry tail of a sharded registry is a pipeline of non-blocking reads:
# on the multiplexed connections.
WORKER_PER_NODE = 3


def sockets_to(pid: int, ports: list[int]) -> list[int]:
    """The established TCP connections process ``pid`` holds to each of ``ports`` on
    loopback (its file descriptors' socket inodes matched in /proc/<pid>/net/tcp)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        with open(f"/proc/{pid}/net/tcp") as f:
            rows = f.read().splitlines()[1:]
    except OSError:  # the process is gone
        return [0] * len(ports)
    counts = dict.fromkeys(ports, 0)
    for row in rows:
        cols = row.split()
        remote_port = int(cols[2].split(":")[1], 16)
        if cols[3] == "01" and cols[9] in inodes and remote_port in counts:  # ESTABLISHED
            counts[remote_port] += 1
    return [counts[p] for p in ports]


def agents_on_every_master(ns: str, masters: int = 3) -> list[str]:
    """One agent id per master: agent ``i``'s inbox slot is on master ``i``."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < masters:
        agent_id = f"cc-{i}"
        slot = key_slot(Keys(ns).inbox(agent_id, "normal").encode())
        found.setdefault(master_of_slot(slot, masters), agent_id)
        i += 1
    return [found[m] for m in range(masters)]


@pytest.fixture
def three_workers(
    redis_cluster: RedisTestCluster, ns: str
) -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    agents = agents_on_every_master(ns)
    procs = []
    for agent_id in agents:
        cmd = worker_cmd("echo_agent", redis_cluster.url, ns, "--concurrency", "64")
        env = {**os.environ, "REACH_TEST_AGENT_ID": agent_id}
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL))
    yield agents, procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def test_2000_requests_and_2000_sends_at_once_on_a_cluster_client(
    redis_cluster: RedisTestCluster,
    three_workers: tuple[list[str], list[subprocess.Popen[bytes]]],
    ns: str,
    record_property: Any,
) -> None:
    agents, procs = three_workers
    name = f"reach:{ns}:cluster-fan-out"
    nodes: list[Any] = [aredis.Redis(port=n.port) for n in redis_cluster.nodes]
    r = await connect(redis_cluster.url)
    peak = [0] * len(nodes)
    peak_total = 0
    seen: list[set[int]] = [set() for _ in nodes]
    ports = [n.port for n in redis_cluster.nodes]
    worker_peak = [[0] * len(nodes) for _ in procs]

    async def watch() -> None:
        nonlocal peak_total
        while True:
            total = 0
            for i, node in enumerate(nodes):
                listed = await node.execute_command("CLIENT LIST")
                mine = [c for c in listed if c.get("name") == name]
                seen[i].update(int(c["id"]) for c in mine)
                peak[i] = max(peak[i], len(mine))
                total += len(mine)
            peak_total = max(peak_total, total)
            for w, proc in enumerate(procs):
                now = sockets_to(proc.pid, ports)
                worker_peak[w] = [max(a, b) for a, b in zip(worker_peak[w], now, strict=True)]
            await anyio.sleep(0.02)

    try:
        async with Client(
            redis_url=redis_cluster.url, namespace=ns, client_id="cluster-fan-out"
        ) as client:
            await wait_eligible(client, "test.echo", agents, timeout=40)
            burst = await echo_burst(client, r, ns, N, while_running=watch)
            pooled = pool_connections(client.redis)
        answers, sent, t_calls, t_all = burst.answers, burst.sent, burst.t_calls, burst.t_all

        assert [answers[i]["echo"] for i in range(N)] == list(range(N))
        assert len(sent) == N
        done = await effects(r, ns, "echo")
        assert len(done) == 2 * N and set(done.values()) == {1}  # each handled exactly once
        assert set(sent) <= set(done)
        handled = await handled_by_agent(r, ns, "echo")
        assert sum(handled.values()) == 2 * N and set(handled) == set(agents), handled
        assert all(p.poll() is None for p in procs)
    finally:
        for node in nodes:
            await node.aclose()
        await r.aclose()

    report = (
        f"{N} requests + {N} sends on one cluster client: calls returned in {t_calls:.1f} s, "
        f"all handled in {t_all:.1f} s; connections per node at most {peak} at once "
        f"({peak_total} in all at once), {[len(s) for s in seen]} opened in all, "
        f"{pooled} in the plain client's pools at the end; each worker process's "
        f"connections per node at most {worker_peak}; messages per agent {handled}"
    )
    print(report)
    record_property("cluster_client_connections", report)
    assert all(1 <= p <= PER_NODE for p in peak), report
    assert all(len(s) <= PER_NODE for s in seen), report
    assert peak_total <= PER_CLIENT, report
    assert all(1 <= c <= WORKER_PER_NODE for w in worker_peak for c in w), report

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
import sys
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
# A worker process, per master, whatever its agents and their concurrency (issue 12): the
# multiplexed connection (its commands, the heartbeat rounds, the registry tail's
# non-blocking reads) and the SSUBSCRIBE connection of its agents' wake-ups on the masters
# of their inboxes. Heartbeat rounds go on the multiplexed connection as long as the event
# loop takes them up within half the lease's slack: the workers here get leases long
# enough for that on a loaded machine (FAST's 0.3 s gives 0.1 s).
WORKER_PER_NODE = 2
ROOMY_LEASES = ("--heartbeat-s", "0.2", "--lease-s", "3", "--evict-after-s", "6")


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


def agents_on_every_master(ns: str, masters: int = 3, per_master: int = 1) -> list[str]:
    """``per_master`` agent ids per master, master by master (the inbox slot of the
    ``i``-th group's agents is on master ``i``)."""
    found: dict[int, list[str]] = {m: [] for m in range(masters)}
    i = 0
    while any(len(v) < per_master for v in found.values()):
        agent_id = f"cc-{i}"
        slot = key_slot(Keys(ns).inbox(agent_id, "normal").encode())
        group = found[master_of_slot(slot, masters)]
        if len(group) < per_master:
            group.append(agent_id)
        i += 1
    return [a for m in range(masters) for a in found[m]]


@pytest.fixture
def three_workers(
    redis_cluster: RedisTestCluster, ns: str
) -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    agents = agents_on_every_master(ns)
    procs = []
    for agent_id in agents:
        cmd = worker_cmd("echo_agent", redis_cluster.url, ns, "--concurrency", "64", *ROOMY_LEASES)
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


AFTER_IDLE = 24


def start_host(url: str, ns: str, agents: list[str]) -> subprocess.Popen[bytes]:
    """A worker process running ``agents`` in one event loop."""
    cmd = [sys.executable, "-m", "tests.support.echo_host", url, ns, *agents]
    return subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)


def heartbeat_fallbacks(out: bytes) -> int:
    """The rounds the host's heartbeat thread sent on a connection of its own (its loop
    too busy to answer in time), from the line it prints when it stops."""
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("heartbeat fallbacks: "):
            return int(line.split(": ", 1)[1])
    raise AssertionError(f"the host printed no heartbeat count: {out[-2000:]!r}")


async def test_a_process_hosting_six_agents_holds_two_connections_per_master(
    redis_cluster: RedisTestCluster, ns: str, record_property: Any
) -> None:
    """Six agents in one worker process, two with their inbox on each master, under 1,000
    concurrent requests and 1,000 sends, then idle: at most 2 connections per master
    (issue 12 item 4). Before, each agent blocked on its own inbox (a connection each) and
    the heartbeat thread had its own: 4 on every master here. The wake-ups are sharded
    pub/sub: each agent's channel is subscribed once, on the master of its inbox."""
    n = 1_000
    agents = agents_on_every_master(ns, per_master=2)
    ports = [node.port for node in redis_cluster.nodes]
    proc = start_host(redis_cluster.url, ns, agents)
    peak = [0] * len(ports)

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = [max(a, b) for a, b in zip(peak, sockets_to(proc.pid, ports), strict=True)]
            await anyio.sleep(0.01)

    r = await connect(redis_cluster.url)
    nodes: list[Any] = [aredis.Redis(port=p) for p in ports]
    try:
        async with Client(redis_url=redis_cluster.url, namespace=ns) as client:
            await wait_eligible(client, "test.echo", agents, timeout=40)
            burst = await echo_burst(client, r, ns, n, while_running=watch)
            # idle: heartbeat rounds and wake-up waits only
            with anyio.move_on_after(2.0):
                await watch()
            # after the idle time, requests wake their agents again
            later: list[Any] = []

            async def ask(i: int) -> None:
                later.append((await client.request("test.echo", n + i, timeout_s=30))["echo"])

            async with anyio.create_task_group() as tg:
                for i in range(AFTER_IDLE):
                    tg.start_soon(ask, i)
            assert sorted(later) == list(range(n, n + AFTER_IDLE))
        subscribed = []
        for node in nodes:
            counts = await node.execute_command(
                "PUBSUB", "SHARDNUMSUB", *[Keys(ns).wake(a) for a in agents]
            )
            subscribed.append([int(x) for x in counts[1::2]])
        assert [answer["echo"] for _, answer in sorted(burst.answers.items())] == list(range(n))
        done = await effects(r, ns, "echo")
        assert len(done) == 2 * n + AFTER_IDLE and set(done.values()) == {1}
        handled = await handled_by_agent(r, ns, "echo")
        assert set(handled) == set(agents), handled
        assert proc.poll() is None
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        for node in nodes:
            await node.aclose()
        await r.aclose()
    fallbacks = heartbeat_fallbacks(out)
    report = (
        f"6 agents in one process, {n} requests + {n} sends: connections per master at most "
        f"{peak}; wake-up subscribers per channel per master {subscribed}; heartbeat rounds "
        f"the thread sent itself (its own connections) {fallbacks}"
    )
    print(report)
    record_property("cluster_host_connections", report)
    # every agent's channel subscribed once, on the master of its inbox (the others 0)
    assert [sum(col) for col in zip(*subscribed, strict=True)] == [1] * len(agents), report
    assert all(1 <= c <= WORKER_PER_NODE for c in peak), report

"""A 3-master Redis Cluster on loopback, built from Python for the tests.

Slots are split with ``CLUSTER ADDSLOTSRANGE``, nodes joined with ``CLUSTER MEET``, and the
cluster is ready when every node reports ``cluster_state:ok`` and knows every other node.
"""

from __future__ import annotations

import time
from typing import Self

import redis

from reach.embedded import RedisServer, ServerBinary
from tests.support.server_group import ServerGroup

SLOTS = 16384


class RedisTestCluster(ServerGroup):
    def __init__(self, *, binary: ServerBinary, masters: int = 3) -> None:
        self.nodes = [RedisServer(binary=binary, cluster=True) for _ in range(masters)]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, *, timeout_s: float = 30.0) -> Self:
        for n in self.nodes:
            n.start()
        clients = [redis.Redis(port=n.port) for n in self.nodes]
        try:
            per = SLOTS // len(self.nodes)
            for i, c in enumerate(clients):
                lo = i * per
                hi = SLOTS - 1 if i == len(self.nodes) - 1 else lo + per - 1
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for n in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                infos = [c.execute_command("CLUSTER", "INFO") for c in clients]
                texts = [i.decode() if isinstance(i, bytes) else str(i) for i in infos]
                if all(
                    "cluster_state:ok" in t and f"cluster_known_nodes:{len(self.nodes)}" in t
                    for t in texts
                ):
                    return self
                time.sleep(0.05)
            raise RuntimeError(f"test cluster not ready within {timeout_s}s: {texts}")
        finally:
            for c in clients:
                c.close()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def master_of_slot(slot: int, masters: int = 3) -> int:
    """Index of the test cluster's master that owns ``slot`` (the split :meth:`start` made)."""
    return min(slot // (SLOTS // masters), masters - 1)


class RedisTestClusterWithReplicas(RedisTestCluster):
    """:class:`RedisTestCluster` plus one replica per master, and a short
    ``cluster-node-timeout`` (``node_timeout_ms``) so that a killed master's replica is
    promoted within a few seconds. ``masters[i]`` and ``replicas[i]`` are a pair; a test
    that kills a master should own its cluster (function scope)."""

    def __init__(self, *, binary: ServerBinary, masters: int = 3, node_timeout_ms: int = 500):
        # no 5 s wait before the first full sync of a replica (repl-diskless-sync-delay)
        opts = ("--cluster-node-timeout", str(node_timeout_ms), "--repl-diskless-sync-delay", "0")
        self.nodes = [
            RedisServer(binary=binary, cluster=True, extra_args=opts) for _ in range(masters)
        ]
        self.replicas = [
            RedisServer(binary=binary, cluster=True, extra_args=opts) for _ in range(masters)
        ]

    @property
    def masters(self) -> list[RedisServer]:
        return self.nodes

    def start(self, *, timeout_s: float = 30.0) -> Self:
        super().start(timeout_s=timeout_s)
        for n in self.replicas:
            n.start()
        first = redis.Redis(port=self.nodes[0].port)
        clients = [redis.Redis(port=n.port) for n in self.replicas]
        try:
            ids = [
                as_str(redis.Redis(port=m.port).execute_command("CLUSTER", "MYID"))
                for m in self.nodes
            ]
            for n in self.replicas:
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)
            deadline = time.monotonic() + timeout_s
            pending = set(range(len(self.replicas)))
            while pending and time.monotonic() < deadline:
                for i in sorted(pending):
                    try:  # the replica must know its master first (gossip)
                        clients[i].execute_command("CLUSTER", "REPLICATE", ids[i])
                        pending.discard(i)
                    except redis.ResponseError:
                        pass
                time.sleep(0.05)
            while time.monotonic() < deadline:
                links = [c.info("replication").get("master_link_status") for c in clients]
                states = [as_str(c.execute_command("CLUSTER", "INFO")) for c in clients]
                if all(link == "up" for link in links) and all(
                    "cluster_state:ok" in s and f"cluster_known_nodes:{2 * len(self.nodes)}" in s
                    for s in states
                ):
                    return self
                time.sleep(0.05)
            raise RuntimeError(f"test cluster replicas not ready within {timeout_s}s")
        finally:
            first.close()
            for c in clients:
                c.close()

    def stop(self) -> None:
        for n in self.replicas:
            n.stop()
        super().stop()


def as_str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

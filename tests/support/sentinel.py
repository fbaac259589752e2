"""A Redis Sentinel deployment on loopback, built from Python for the tests.

One master, one replica (``--replicaof``) and three sentinels (``redis-server <conf>
--sentinel``), every one on a free port, monitoring the master as ``mymaster`` with quorum
2, ``down-after-milliseconds 1000`` and a short ``failover-timeout``. Ready when the
replica's link is up and every sentinel sees the replica and the two other sentinels (a
failover needs a majority of sentinels that know each other). :meth:`kill_master` SIGKILLs
the master; :meth:`wait_failover` waits until every sentinel names the promoted replica.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Self

import redis

from reach.embedded import RedisServer, ServerBinary
from tests.support.server_group import ServerGroup

SERVICE = "mymaster"


class SentinelServer(RedisServer):
    """``redis-server <dir>/sentinel.conf --sentinel`` (a sentinel needs a config file it
    can rewrite); started, polled and stopped like any :class:`RedisServer`."""

    def __init__(
        self,
        *,
        binary: ServerBinary,
        master_port: int,
        service: str = SERVICE,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
    ) -> None:
        super().__init__(binary=binary)
        self.master_port = master_port
        self.service = service
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def _conf(self) -> str:
        """Built at start: a taken port makes start() retry on another, as may the master."""
        service = self.service
        return "\n".join(
            [
                f"port {self.port}",
                "bind 127.0.0.1",
                "protected-mode no",
                "daemonize no",
                f'dir "{self.data_dir}"',
                "logfile server.log",
                f"sentinel monitor {service} 127.0.0.1 {self.master_port} {self.quorum}",
                f"sentinel down-after-milliseconds {service} {self.down_after_ms}",
                f"sentinel failover-timeout {service} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {service} 1",
                "",
            ]
        )

    def _args(self) -> list[str]:
        path = Path(self.data_dir) / "sentinel.conf"
        if not self._ever_started:  # a restart keeps what the sentinel rewrote
            path.write_text(self._conf())
        return [self.binary.path, str(path), "--sentinel"]


class RedisTestSentinel(ServerGroup):
    """1 master + 1 replica + 3 sentinels; ``url`` is the ``redis+sentinel://`` URL."""

    def __init__(
        self,
        *,
        binary: ServerBinary,
        service: str = SERVICE,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
    ) -> None:
        self.binary = binary
        self.service = service
        # No 5 s wait before a full sync (the diskless default): the replica is up at once.
        self.fast = ("--repl-diskless-sync-delay", "0")
        self.master = RedisServer(binary=binary, extra_args=self.fast)
        self.replica = RedisServer(binary=binary, extra_args=self.fast)  # --replicaof at start
        self.sentinels = [
            SentinelServer(
                binary=binary,
                master_port=self.master.port,  # set again at start
                service=service,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for _ in range(sentinels)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    @property
    def servers(self) -> list[RedisServer]:
        return [self.master, self.replica, *self.sentinels]

    def start(self, *, timeout_s: float = 60.0) -> Self:
        self.master.start()  # on another port than chosen if that one was taken meanwhile
        self.replica.extra_args = (*self.fast, "--replicaof", "127.0.0.1", str(self.master.port))
        self.replica.start()
        deadline = time.monotonic() + timeout_s
        self._wait(
            lambda: _replication(self.replica.port).get("master_link_status") == "up",
            deadline,
            "replica link up",
        )
        for s in self.sentinels:
            s.master_port = self.master.port
            s.start()
        self._wait(self._sentinels_ready, deadline, "sentinels to know each other")
        self.ready_s = time.monotonic() - (deadline - timeout_s)
        return self

    def _sentinels_ready(self) -> bool:
        want = len(self.sentinels) - 1
        for s in self.sentinels:
            st = sentinel_state(s.port, self.service)
            if not st or int(st.get("num-other-sentinels", 0)) < want:
                return False
            if int(st.get("num-slaves", 0)) < 1 or int(st.get("port", 0)) != self.master.port:
                return False
        return True

    @staticmethod
    def _wait(cond, deadline: float, what: str) -> None:  # type: ignore[no-untyped-def]
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except (redis.RedisError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"test sentinel deployment: timed out waiting for {what}")

    def master_address(self) -> set[tuple[str, int]]:
        """What each answering sentinel says the master is (one element when they agree)."""
        out: set[tuple[str, int]] = set()
        for s in self.sentinels:
            try:
                with redis.Redis(port=s.port, socket_timeout=1, decode_responses=True) as c:
                    host, port = c.sentinel_get_master_addr_by_name(self.service)
                out.add((host, int(port)))
            except (redis.RedisError, OSError, TypeError):
                continue
        return out

    def kill_master(self) -> int:
        """SIGKILL the current master (a crash); returns its port."""
        port = self.master.port
        self.master.kill()
        return port

    def wait_failover(self, old_port: int, *, timeout_s: float = 30.0) -> int:
        """Wait until all sentinels name a new master and it answers as master; its port."""
        deadline = time.monotonic() + timeout_s
        new: list[int] = []

        def promoted() -> bool:
            addrs = self.master_address()
            if len(addrs) != 1:
                return False
            port = next(iter(addrs))[1]
            if port == old_port or _replication(port).get("role") != "master":
                return False
            new[:] = [port]
            return True

        self._wait(promoted, deadline, "the failover")
        if new[0] == self.replica.port:  # the roles swapped: keep the names meaningful
            self.master, self.replica = self.replica, self.master
        return new[0]

    def stop(self) -> None:
        for s in [*self.sentinels, self.replica, self.master]:
            s.stop()


def _replication(port: int) -> dict[str, str]:
    with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as c:
        info = c.info("replication")
    return {k: str(v) for k, v in info.items()}


def sentinel_state(port: int, service: str) -> dict[str, str] | None:
    """``SENTINEL MASTER <service>`` of the sentinel on ``port``, as a dict."""
    with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as c:
        raw = c.execute_command("SENTINEL", "MASTER", service)
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    return {str(raw[i]): str(raw[i + 1]) for i in range(0, len(raw), 2)}

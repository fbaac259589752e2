"""Redis Sentinel: ``redis+sentinel://`` URLs and the clients of a service's current master.

::

    redis+sentinel://[user:password@]host1[:port1][,host2[:port2],...]/service_name[/db][?opts]

* the hosts are the *sentinels* (port 26379 when left out; IPv6 as ``[::1]:26379``);
  ``service_name`` is the name they monitor (``sentinel monitor <service_name> ...``);
  ``db`` defaults to 0;
* ``user:password@`` authenticate to the master (``requirepass`` / ACL user), not to the
  sentinels; for sentinels with a password of their own add ``?sentinel_password=...``
  (and ``&sentinel_username=...`` for an ACL user);
* other options: ``master_wait_s`` (how long a connection waits for the sentinels to name
  a reachable master, default 10: longer than ``down-after-milliseconds`` plus the
  election), ``socket_timeout`` (seconds a reply may take, default 10: keep it above the
  longest ``BLOCK`` you issue; reach's own blocking reads use 1 s) and
  ``socket_connect_timeout`` (default 2).

Example: ``redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3/mymaster/0``.

The client is a :class:`redis.asyncio.Redis` (``is_cluster`` is False) over redis-py's
``SentinelConnectionPool``, with three changes for failovers:

* every (re)connection asks the sentinels for the master, and while they name none that
  answers (failover in progress) keeps asking for up to ``master_wait_s``; a command whose
  connection broke is sent once more on such a connection. So a call made while the master
  dies waits for the promoted replica instead of failing (worst case ~2 x
  ``master_wait_s``, then :class:`~reach.errors.RedisUnavailable` from reach's callers);
* while the client is in use, the sentinels are asked at most once a second, in the
  background, whether the master moved; if so, every connection is dropped. This covers a
  failover whose old master stays up (``SENTINEL FAILOVER``, a partition): it keeps taking
  writes, later thrown away, until the sentinels turn it into a replica ~10 s later;
* a ``READONLY`` reply (a demoted master) drops the connection, as in redis-py.

Replication is asynchronous: writes acknowledged by a master just before it died can be
missing on the promoted replica (reach's redelivery and idempotency are the defence).
The sync client (``connect_sync``, used by the heartbeat thread) behaves the same.

:func:`reach.connection.connect` and :func:`~reach.connection.connect_sync` come here for a
Sentinel URL; the names are re-exported there.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.asyncio as aredis
from redis import exceptions as rexc
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from ._pool import _KW, POOL_WAIT_S, _WaitingPool
from ._redis_url import is_sentinel_url, redact, unreachable
from .errors import ConfigError

# The connection module's logger: a master that moved is logged as it was before the
# Sentinel support had a module of its own.
log = logging.getLogger("reach.connection")


SENTINEL_PORT = 26379
_SENTINEL_OPTS = {
    "sentinel_username",
    "sentinel_password",
    "socket_timeout",
    "socket_connect_timeout",
    "master_wait_s",
}


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL (see the module docstring)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    socket_timeout: float = 10.0
    socket_connect_timeout: float = 2.0
    master_wait_s: float = 10.0


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse ``redis+sentinel://[user:password@]h1:p1[,h2:p2...]/service[/db][?opts]``."""

    def bad(why: str) -> ConfigError:
        return ConfigError(
            f"Bad Sentinel URL {redact(url)!r}: {why}. Use "
            "redis+sentinel://[user:password@]host1:port1[,host2:port2,...]/service_name[/db]"
            "[?sentinel_password=...]."
        )

    if not is_sentinel_url(url):
        raise bad("it must start with redis+sentinel://")
    parts = urlsplit(url)
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        cred, netloc = netloc.rsplit("@", 1)
        user, _, pw = cred.partition(":")
        username, password = unquote(user) or None, unquote(pw) or None
    hosts: list[tuple[str, int]] = []
    for item in netloc.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [ipv6]:port
            host, _, rest = item[1:].partition("]")
            port_s = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_s = item.partition(":")
        if not host:
            raise bad(f"sentinel address {item!r} has no host")
        try:
            port = int(port_s) if port_s else SENTINEL_PORT
        except ValueError:
            raise bad(f"sentinel address {item!r} has a bad port") from None
        hosts.append((host, port))
    if not hosts:
        raise bad("no sentinel address")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise bad("the path must be /service_name or /service_name/db")
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise bad(f"db {path[1]!r} is not a number") from None
    opts: dict[str, Any] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _SENTINEL_OPTS:
            raise bad(f"unknown option {name!r} (known: {', '.join(sorted(_SENTINEL_OPTS))})")
        if name.startswith("socket_") or name == "master_wait_s":
            try:
                opts[name] = float(value)
            except ValueError:
                raise bad(f"{name} must be a number of seconds") from None
        else:
            opts[name] = value or None
    return SentinelURL(tuple(hosts), path[0], db, username, password, **opts)


# A command whose connection broke (or timed out) is sent again once, on a connection that
# waited for a master as above: worst case about 2 x master_wait_s before the error.
_RETRIES = 1
_BACKOFF = {"cap": 0.5, "base": 0.05}
MASTER_WAIT_S = 10.0


def _master_kw(su: SentinelURL, decode_responses: bool) -> dict[str, Any]:
    return {
        "db": su.db,
        "username": su.username,
        "password": su.password,
        "decode_responses": decode_responses,
        "socket_timeout": su.socket_timeout,
        "socket_connect_timeout": su.socket_connect_timeout,
        "socket_keepalive": True,
        "health_check_interval": _KW["health_check_interval"],
    }


def _sentinel_kw(su: SentinelURL) -> dict[str, Any]:
    # Sentinels are asked one after the other: one that is down must cost little (no retry).
    return {
        "username": su.sentinel_username,
        "password": su.sentinel_password,
        "socket_timeout": 2.0,
        "socket_connect_timeout": 1.0,
    }


# How a connection to the master is (re)opened. redis-py asks the sentinels only when the
# pool hands out a connection, with its command retry policy, and a command retried after
# its connection broke reconnects to the same, possibly dead, address (redis/redis-py#3874,
# open in 8.1). Here every (re)connection asks the sentinels, and keeps asking for up to
# ``master_wait_s`` while there is no reachable master (a failover in progress):
# ``down-after-milliseconds`` plus the election. A wrong password is not waited for.
_NO_WAIT = (rexc.AuthenticationError, rexc.AuthorizationError)


class _MasterWait:
    """One (re)connection's wait for a reachable master: pauses growing from 50 ms to 0.5 s
    until the pool's ``master_wait_s`` is spent."""

    def __init__(self, pool: Any) -> None:
        self.deadline = time.monotonic() + getattr(pool, "master_wait_s", MASTER_WAIT_S)
        self.delay = 0.05

    def pause_after(self, e: Exception) -> float:
        """The pause before the next try after the connection failure ``e``; raises ``e``
        again when no wait can help (a wrong password) or when the time is spent."""
        if isinstance(e, _NO_WAIT) or time.monotonic() + self.delay >= self.deadline:
            raise e
        pause, self.delay = self.delay, min(self.delay * 2, 0.5)
        return pause


class _SentinelConnection(AsyncSentinelConnection):
    async def connect(self) -> None:
        if self.is_connected:
            return
        wait = _MasterWait(self.connection_pool)
        while True:
            try:
                address = await self.connection_pool.get_master_address()
                await self.connect_to(address)  # type: ignore[no-untyped-call]
                return
            except (rexc.ConnectionError, rexc.TimeoutError) as e:
                pause = wait.pause_after(e)
            await asyncio.sleep(pause)

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if retry_socket_connect and not self.is_connected:
            await self.connect()  # a command's reconnection: through the sentinels too
            return
        await super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )


class _SyncSentinelConnection(SentinelManagedConnection):
    def connect(self) -> None:
        if self._sock:
            return
        wait = _MasterWait(self.connection_pool)
        while True:
            try:
                self.connect_to(self.connection_pool.get_master_address())  # type: ignore[no-untyped-call]
                return
            except (rexc.ConnectionError, rexc.TimeoutError) as e:
                pause = wait.pause_after(e)
            time.sleep(pause)

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if retry_socket_connect and not self._sock:
            self.connect()
            return
        super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )


class _SentinelPool(AsyncSentinelPool, _WaitingPool):
    """A bounded pool whose callers wait for a free connection (see :func:`connect`) that
    also asks the sentinels who the master is at most once per ``recheck_s`` while the
    client is in use (in the background, never delaying a command).

    redis-py asks only when it opens a connection. After a failover whose old master is
    still up (``SENTINEL FAILOVER``, a network partition), pooled connections to the old
    master keep working for the ~10 s sentinels take to turn it into a replica, and what is
    written there is then thrown away. When the answer changes, every connection is
    dropped; commands in flight are retried on the new master.
    """

    recheck_s = 1.0
    master_wait_s: float  # set by _connect_sentinel; read by _SentinelConnection
    _checked = 0.0
    _check_task: asyncio.Task[None] | None = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if self.is_master and now - self._checked >= self.recheck_s:
            self._checked = now
            if self._check_task is None or self._check_task.done():
                self._check_task = asyncio.get_running_loop().create_task(self._recheck())
        return await super().get_connection(*args, **kwargs)

    async def _recheck(self) -> None:
        try:
            address = await self.sentinel_manager.discover_master(self.service_name)
        except (rexc.ConnectionError, rexc.TimeoutError, OSError):
            return  # no answer now: connection errors lead to a rediscovery anyway
        old = self.master_address
        if old is not None and address != old:
            log.warning(
                "Sentinel %s: the master moved from %s:%s to %s:%s; reconnecting",
                self.service_name,
                *old,
                *address,
            )
            self.master_address = address
            await self.disconnect(inuse_connections=True)

    def stop_checks(self) -> None:
        if self._check_task is not None:
            self._check_task.cancel()
            self._check_task = None


class _SyncSentinelPool(SentinelConnectionPool):
    """The synchronous :class:`_SentinelPool` (the check runs in a short-lived thread)."""

    recheck_s = 1.0
    _checked = 0.0
    _checking = False

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if self.is_master and not self._checking and now - self._checked >= self.recheck_s:
            self._checked, self._checking = now, True
            threading.Thread(target=self._recheck, name="reach-sentinel-check", daemon=True).start()
        return super().get_connection(*args, **kwargs)

    def _recheck(self) -> None:
        try:
            address = self.sentinel_manager.discover_master(self.service_name)
            old = self.master_address
            if old is not None and address != old:
                log.warning(
                    "Sentinel %s: the master moved from %s:%s to %s:%s; reconnecting",
                    self.service_name,
                    *old,
                    *address,
                )
                # redis-py keeps the address on a proxy object (a property of the pool)
                holder: Any = getattr(self, "proxy", self)
                holder.master_address = address
                self._cut_connections()
        except (rexc.RedisError, OSError):
            pass  # no answer now (or closed meanwhile): connection errors rediscover anyway
        finally:
            self._checking = False

    def _cut_connections(self) -> None:
        """Shut the socket of every connection of the pool down, idle or in use: each is
        opened again, to the new master, by the thread that uses it next (its next read
        finds the socket closed, a ConnectionError redis-py reconnects after). Not
        ``disconnect(inuse_connections=True)``: that also resets a connection's parser,
        which another thread may be reading with at that moment (it then failed there
        with an AttributeError instead of a ConnectionError)."""
        with self._lock:
            connections = [*self._available_connections, *self._in_use_connections]
        for c in connections:
            sock = c._sock  # the owner may drop it meanwhile: this reference stays valid
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed meanwhile


class SentinelRedis(aredis.Redis):
    """An asyncio client of the current master of a Sentinel service; closing it also
    closes its connections to the sentinels."""

    sentinel_manager: AsyncSentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        pool = self.connection_pool
        if isinstance(pool, _SentinelPool):
            pool.stop_checks()
        try:
            await super().aclose(close_connection_pool)
        finally:
            sentinel, self.sentinel_manager = self.sentinel_manager, None
            if sentinel is not None:
                for s in sentinel.sentinels:
                    await s.aclose()


class SyncSentinelRedis(redis.Redis):
    """The synchronous :class:`SentinelRedis`."""

    sentinel_manager: Sentinel | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            sentinel, self.sentinel_manager = self.sentinel_manager, None
            if sentinel is not None:
                for s in sentinel.sentinels:
                    s.close()


async def _connect_sentinel(
    url: str, decode_responses: bool, max_connections: int, client_name: str | None
) -> SentinelRedis:
    su = parse_sentinel_url(url)
    no_retry = AsyncRetry(NoBackoff(), 0)
    sentinel = AsyncSentinel(  # type: ignore[no-untyped-call]
        list(su.sentinels), sentinel_kwargs={**_sentinel_kw(su), "retry": no_retry}
    )
    client: SentinelRedis = sentinel.master_for(
        su.service,
        redis_class=SentinelRedis,
        connection_pool_class=_SentinelPool,
        connection_class=_SentinelConnection,
        retry=AsyncRetry(ExponentialWithJitterBackoff(**_BACKOFF), _RETRIES),
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        client_name=client_name,
        **_master_kw(su, decode_responses),
    )
    client.sentinel_manager = sentinel
    cast(_SentinelPool, client.connection_pool).master_wait_s = su.master_wait_s
    try:
        # Ask the sentinels first: a wrong address or service name fails fast, not after
        # the retries of a connection to a master that cannot be found.
        await sentinel.discover_master(su.service)
        await client.ping()
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
        await client.aclose()
        raise unreachable(url, e) from e
    return client


def _connect_sentinel_sync(url: str, decode_responses: bool) -> SyncSentinelRedis:
    su = parse_sentinel_url(url)
    no_retry = Retry(NoBackoff(), 0)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(su.sentinels), sentinel_kwargs={**_sentinel_kw(su), "retry": no_retry}
    )
    client: SyncSentinelRedis = sentinel.master_for(  # type: ignore[no-untyped-call]
        su.service,
        redis_class=SyncSentinelRedis,
        connection_pool_class=_SyncSentinelPool,
        connection_class=_SyncSentinelConnection,
        retry=Retry(ExponentialWithJitterBackoff(**_BACKOFF), _RETRIES),
        **_master_kw(su, decode_responses),
    )
    client.sentinel_manager = sentinel
    # The connections see the pool through a proxy object in redis-py >= 5.1.
    seen_by_connections: Any = getattr(client.connection_pool, "proxy", client.connection_pool)
    seen_by_connections.master_wait_s = su.master_wait_s
    try:
        sentinel.discover_master(su.service)  # type: ignore[no-untyped-call]
        client.ping()
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
        client.close()
        raise unreachable(url, e) from e
    return client

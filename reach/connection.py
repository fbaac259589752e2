"""Open Redis connections from a URL: standalone, Sentinel or Cluster, asyncio or sync.

``redis://`` and ``rediss://`` URLs are probed once with ``INFO cluster``; a server with
``cluster_enabled:1`` gets a :class:`redis.asyncio.RedisCluster` client instead.
Connection failures become :class:`~reach.errors.RedisUnavailable` with a hint.

A cluster URL names one node. A process remembers, per URL, the nodes (masters and
replicas) its cluster clients saw, and a client made from that URL while its node does not
answer (after a failover, say) starts from those instead. A process started while the
URL's node is down knows no others: give it the URL of a live node.

Redis Sentinel
--------------
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
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.asyncio as aredis
from redis import exceptions as rexc
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import ClusterNode as SyncClusterNode
from redis.cluster import RedisCluster
from redis.connection import HiredisRespSerializer
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    from hiredis import pack_command as _hiredis_pack

from ._pool import _POOL_EMPTY, POOL_WAIT_S, _WaitingPool
from ._redislike import AnyRedis as AnyRedis  # noqa: PLC0414 (re-exported: every module imports it from here)
from ._redislike import RedisLike as RedisLike  # noqa: PLC0414
from .errors import ConfigError, ConnectionsExhausted, ReachError, RedisUnavailable

log = logging.getLogger("reach.connection")


def as_text(value: Any) -> str:
    """A Redis reply value as text: bytes decoded as UTF-8, anything else through str()."""
    return value.decode() if isinstance(value, bytes) else str(value)


DEFAULT_URL = "redis://localhost:6379/0"


def is_pool_exhausted(exc: BaseException) -> bool:
    """True when ``exc`` says a connection pool had no free connection (not a network error)."""
    return isinstance(exc, rexc.MaxConnectionsError) or (
        isinstance(exc, rexc.ConnectionError) and str(exc) == _POOL_EMPTY
    )


# What a waiting pool raises when its wait for a connection timed out (the words of
# redis-py's BlockingConnectionPool).


def unreachable(url: str, exc: BaseException) -> RedisUnavailable:
    """The error for a Redis that cannot be reached, with what to do about it.

    A pool that ran out of connections is not an unreachable Redis: that gets
    :class:`ConnectionsExhausted`, which says so.
    """
    if is_pool_exhausted(exc):
        return ConnectionsExhausted(
            f"All connections to {redact(url)} stayed busy for {POOL_WAIT_S:.0f} s ({exc}). "
            "Redis answers too slowly for the work in flight (check its latency and "
            "`INFO commandstats`), or raise max_connections (connect(), "
            "Client(max_connections=...), ?max_connections= in the URL)."
        )
    if is_sentinel_url(url):
        return RedisUnavailable(
            f"Cannot reach the Redis master through the sentinels of {redact(url)} ({exc}). "
            "Check that the sentinels run, that they monitor this service name, and that "
            "a master is up (a failover may be in progress)."
        )
    return RedisUnavailable(
        f"Cannot reach Redis at {redact(url)} ({exc}). Start one with `reach redis`, "
        "or set --redis-url / REACH_REDIS_URL to a running Redis >= 7."
    )


ACL_HINT = "grant it to the user in the Redis URL (docs/operations.md shows an ACL for reach)"


def probe_failed(url: str, exc: BaseException) -> ReachError:
    """The error for a first command (``INFO``) that failed: what is wrong and what to do,
    never a raw redis-py error (wrong password, missing ACL permission, a DB index out of
    range, a server that is not Redis)."""
    at = redact(url)
    if isinstance(exc, (rexc.AuthenticationError, rexc.AuthenticationWrongNumberOfArgsError)):
        return RedisUnavailable(
            f"Redis at {at} refused the credentials ({exc}). Check the user and password in "
            "the URL (redis://user:password@host:port/db)."
        )
    if isinstance(exc, rexc.NoPermissionError):
        return RedisUnavailable(
            f"Redis at {at} refused a command reach needs ({exc}). The Redis user lacks an "
            f"ACL permission: {ACL_HINT}."
        )
    if isinstance(exc, rexc.ResponseError) and "DB index is out of range" in str(exc):
        return ConfigError(
            f"Redis at {at} says the DB index is out of range: the number at the end of the "
            "URL must be below the server's `databases` setting (16 by default); most "
            "setups use /0."
        )
    if isinstance(exc, rexc.InvalidResponse):
        return RedisUnavailable(
            f"The server at {at} does not answer like a Redis server ({exc}). Check the host "
            "and port of the URL."
        )
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError, OSError)):
        return unreachable(url, exc)
    return RedisUnavailable(f"Redis at {at} refused reach's first command (INFO): {exc}")


def redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages and logs): the one
    before ``@`` and any ``...password=`` query parameter (e.g. ``sentinel_password``)."""
    if "://" not in url:
        return url
    base, sep, query = url.partition("?")
    if query:
        query = "&".join(_redact_param(p) for p in query.split("&"))
    if "@" in base:
        scheme, rest = base.split("://", 1)
        cred, host = rest.rsplit("@", 1)
        user = cred.split(":", 1)[0] if ":" in cred else ""
        base = f"{scheme}://{user}:***@{host}"
    return base + sep + query


def _redact_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    return f"{name}=***" if eq and "password" in name.lower() else param


SENTINEL_SCHEME = "redis+sentinel://"


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def _check_scheme(url: str) -> None:
    if not url.startswith(("redis://", "rediss://", "unix://", SENTINEL_SCHEME)):
        raise ConfigError(
            f"Unsupported Redis URL {redact(url)!r}: use redis://host:port/db, "
            "rediss://... (TLS), unix:///path/to/socket or "
            "redis+sentinel://host1:port1,host2:port2/service_name/db (Sentinel)."
        )


# -- Sentinel ------------------------------------------------------------------------------
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
                self.disconnect(inuse_connections=True)
        except (rexc.RedisError, OSError):
            pass  # no answer now (or closed meanwhile): connection errors rediscover anyway
        finally:
            self._checking = False


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


_KW: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "health_check_interval": 15,
    "retry_on_timeout": True,
}


class _HiredisPackConnection(aredis.Connection):
    """redis-py's asyncio connection packs commands in Python (~26 µs for a 35-argument
    script call here); its sync connection uses hiredis's packer (~10 µs). Use that one:
    the hot path sends long script calls (claim, settle) for every batch."""

    _packer = HiredisRespSerializer() if HIREDIS_AVAILABLE else None

    def pack_command(self, *args: Any) -> list[bytes]:
        if self._packer is None:
            return super().pack_command(*args)
        first = args[0]
        if type(first) is str and " " not in first:
            # The usual call (one command word, arguments hiredis takes as they are):
            # packed without redis-py's look at every argument, which costs more than the
            # packing on a long script call. Anything hiredis refuses (a memoryview, a
            # bytearray) goes the whole way below.
            try:
                return [_hiredis_pack(args)]
            except TypeError:
                pass
        return self._packer.pack(*args)  # type: ignore[no-any-return]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        # redis-py bounds each write with asyncio.wait_for, which on Python 3.11 starts a
        # task per command (three extra event-loop turns per round trip). asyncio.timeout
        # bounds it the same way without one.
        timeout, self.socket_timeout = self.socket_timeout, None
        try:
            async with asyncio.timeout(timeout):
                await super().send_packed_command(command, check_health)
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise rexc.TimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = timeout


# -- bounded pools ---------------------------------------------------------------------------
DEFAULT_MAX_CONNECTIONS = 64
"""Connections one :func:`connect` client opens at most (per node on a Cluster)."""


# Set while a task runs a command under a cluster client's gate: redis-py may issue
# commands from inside a pipeline (redirections), and those must not wait for a second slot.
_in_gate: contextvars.ContextVar[bool] = contextvars.ContextVar("reach_in_gate", default=False)


class _GatedCluster(AsyncRedisCluster):
    """A :class:`redis.asyncio.RedisCluster` whose callers wait when ``max_connections``
    commands (or pipelines) are in flight, instead of failing with ``MaxConnectionsError``.

    Each node's connection list is bounded by ``max_connections`` too; one command or
    pipeline holds at most one connection per node, so a node can never run out.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gate = asyncio.Semaphore(int(self.connection_kwargs["max_connections"]))

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if _in_gate.get():
            return await self._run(args, kwargs)
        async with self._gate:
            token = _in_gate.set(True)
            try:
                return await self._run(args, kwargs)
            finally:
                _in_gate.reset(token)

    async def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # redis-py finds the keys of XREAD/XREADGROUP (movable keys) by asking its parser's
        # node, before its retry loop (where it reloads a map marked stale): when that node
        # is the one that died, the error never marks the map, nor would a mark be read
        # before the next lookup, and every such command would fail the same way for as
        # long as nothing else reloads the map. So: a failure marks it, and a marked map is
        # reloaded before the lookup.
        if self._initialize:
            await self.initialize()
        parser_follows_map(self)
        try:
            return await super().execute_command(*args, **kwargs)
        except (rexc.ConnectionError, rexc.TimeoutError):
            self._initialize = True
            raise

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> AsyncClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # redis-py's own error
        return _GatedPipeline(self, transaction)  # type: ignore[abstract]


class _GatedPipeline(AsyncClusterPipeline):
    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        gate = cast(_GatedCluster, self.cluster_client)._gate
        parser_follows_map(self.cluster_client)
        if _in_gate.get():
            return await super().execute(raise_on_error, allow_redirections)
        async with gate:
            token = _in_gate.set(True)
            try:
                return await super().execute(raise_on_error, allow_redirections)
            finally:
                _in_gate.reset(token)


def parser_follows_map(client: Any) -> None:
    """Point ``client``'s command parser at the map's current default node.

    redis-py's cluster client asks one node (``commands_parser.node``, set when the client
    initializes) for the keys of movable-key commands such as ``XREAD``. A reload of the
    slot map made by ``nodes_manager.initialize()`` alone (as the auto-pipeline does after
    a failure) leaves it on the old node, which after a failover may be dead: every
    ``XREAD`` would then fail before reaching any node of the map.
    """
    parser = getattr(client, "commands_parser", None)
    node = client.nodes_manager.default_node
    if parser is not None and node is not None and getattr(parser, "node", node) is not node:
        parser.node = node


async def connect(
    url: str,
    *,
    decode_responses: bool = False,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    client_name: str | None = None,
) -> AnyRedis:
    """Return a connected asyncio client for ``url`` (Cluster- and Sentinel-aware).

    The client opens at most ``max_connections`` connections (default 64; on a Cluster,
    that many per node) and any number of concurrent callers share them: a caller that
    finds them all busy waits for one (up to :data:`POOL_WAIT_S`, then
    :class:`ConnectionsExhausted`). Each blocking read in flight (a Client's reply reader
    and registry tail, a worker's inbox read) holds one connection for up to its block
    time (1 s), so keep the bound well above the number of those (a handful per process).
    A ``?max_connections=`` in a ``redis://`` URL wins over the argument.
    ``client_name`` names the connections in ``CLIENT LIST`` (no spaces).
    """
    _check_scheme(url)
    if max_connections < 1:
        raise ConfigError(f"max_connections must be >= 1 (got {max_connections}).")
    if client_name is not None:
        client_name = _safe_name(client_name)
    if is_sentinel_url(url):
        return await _connect_sentinel(url, decode_responses, max_connections, client_name)
    extra: dict[str, Any] = {}
    if url.startswith("redis://"):  # plain TCP; TLS and unix sockets keep their own classes
        extra["connection_class"] = _HiredisPackConnection
    if client_name:
        extra["client_name"] = client_name
    try:
        pool = _WaitingPool.from_url(
            url,
            decode_responses=decode_responses,
            max_connections=max_connections,
            timeout=POOL_WAIT_S,
            **_KW,
            **extra,
        )
    except ValueError as e:  # a bad query-string option
        raise ConfigError(f"Bad Redis URL {redact(url)!r}: {e}") from e
    client: AnyRedis = aredis.Redis.from_pool(pool)
    try:
        info = await client.info("cluster")
    except (rexc.RedisError, OSError) as e:
        await client.aclose()
        if not (_is_down(e) and _other_nodes(url)):
            raise probe_failed(url, e) from e
        info = {"cluster_enabled": 1}  # a cluster whose node of the URL is down
    if info.get("cluster_enabled") in (1, "1"):
        await client.aclose()
        # redis.asyncio.RedisCluster takes no retry_on_timeout (it retries by its own policy)
        ckw = {k: v for k, v in _KW.items() if k != "retry_on_timeout"}
        if client_name:
            ckw["client_name"] = client_name
        client = _GatedCluster.from_url(
            url,
            decode_responses=decode_responses,
            max_connections=max_connections,
            startup_nodes=[AsyncClusterNode(h, p) for h, p in _other_nodes(url)],
            **ckw,
        )
        try:
            await client.initialize()
        except (rexc.RedisError, OSError) as e:
            await client.aclose()
            raise unreachable(url, e) from e
        _remember_nodes(url, client)
    return client


# -- a Cluster whose node of the URL is down ---------------------------------------------------
# A cluster URL names one node. Once that node is gone for good (a failover promoted its
# replica), a client made from the URL again (a worker's heartbeat thread or wake-up read
# reconnecting after an error) must still find the cluster: each process remembers the
# nodes its cluster clients saw, per URL, and starts from them when the URL's node does
# not answer. A process started while the URL's node is down cannot know the others: give
# it the URL of a live node.
_KNOWN_NODES: dict[str, tuple[tuple[str, int], ...]] = {}


def _remember_nodes(url: str, client: Any) -> None:
    """Remember the nodes (masters and replicas) ``client`` knows, as seen from ``url``."""
    nodes = tuple((str(n.host), int(n.port)) for n in client.get_nodes())
    if nodes:
        _KNOWN_NODES[url] = nodes


def _other_nodes(url: str) -> list[tuple[str, int]]:
    """The remembered nodes of the cluster of ``url``, the URL's own node left out."""
    parts = urlsplit(url)
    own = (parts.hostname, parts.port or 6379)
    return [n for n in _KNOWN_NODES.get(url, ()) if n != own]


def _is_down(exc: BaseException) -> bool:
    """True when ``exc`` says the server did not answer (not a refusal or a bad reply)."""
    if isinstance(exc, (rexc.AuthenticationError, rexc.AuthorizationError)):
        return False
    return isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError, OSError))


def _safe_name(name: str) -> str:
    # CLIENT SETNAME refuses spaces and newlines: a bad name must not break connecting.
    return "".join(c if c.isprintable() and not c.isspace() else "_" for c in name)[:128]


def pool_connections(client: AnyRedis) -> int:
    """How many connections ``client`` has open now (pooled, busy or idle; all nodes)."""
    if isinstance(client, AsyncRedisCluster):
        return sum(len(n._connections) for n in client.get_nodes())
    # A standalone or Sentinel client (the protocol does not expose its pool)
    pool = cast(aredis.Redis, client).connection_pool
    return len(pool._available_connections) + len(pool._in_use_connections)


def connect_sync(url: str, *, decode_responses: bool = False) -> Any:
    """Return a connected synchronous client for ``url`` (Cluster- and Sentinel-aware)."""
    _check_scheme(url)
    if is_sentinel_url(url):
        return _connect_sentinel_sync(url, decode_responses)
    client: Any = redis.Redis.from_url(url, decode_responses=decode_responses, **_KW)
    try:
        info = client.info("cluster")
    except (rexc.RedisError, OSError) as e:
        client.close()
        if not (_is_down(e) and _other_nodes(url)):
            raise probe_failed(url, e) from e
        info = {"cluster_enabled": 1}  # a cluster whose node of the URL is down
    if info.get("cluster_enabled") in (1, "1"):
        client.close()
        try:
            client = RedisCluster.from_url(
                url,
                decode_responses=decode_responses,
                startup_nodes=[
                    SyncClusterNode(h, p)  # type: ignore[no-untyped-call]
                    for h, p in _other_nodes(url)
                ],
                **_KW,
            )
        except (rexc.RedisError, OSError) as e:
            raise unreachable(url, e) from e
        _remember_nodes(url, client)
    return client


def is_cluster(client: AnyRedis) -> bool:
    return isinstance(client, (AsyncRedisCluster, RedisCluster))

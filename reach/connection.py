"""Open Redis connections from a URL: standalone, Sentinel or Cluster, asyncio or sync.

``redis://`` and ``rediss://`` URLs are probed once with ``INFO cluster``; a server with
``cluster_enabled:1`` gets a :class:`redis.asyncio.RedisCluster` client instead.
Connection failures become :class:`~reach.errors.RedisUnavailable` with a hint.

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
* other options: ``socket_timeout`` (seconds a reply may take on the master, default 10:
  keep it above the longest ``BLOCK`` you issue; reach's own blocking reads use 1 s) and
  ``socket_connect_timeout`` (default 2).

Example: ``redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3/mymaster/0``.

The client is a :class:`redis.asyncio.Redis` (``is_cluster`` is False) over redis-py's
``SentinelConnectionPool``: every new connection asks the sentinels for the current master
(and skips one they consider down), and a ``READONLY`` reply from a demoted master drops
the connection. A command that fails with a connection error or a timeout is retried
with a short exponential backoff (about 7 s on average, at most ~15 s, before the error
reaches the caller), long enough to ride through a failover at typical test settings;
after a longer failover the next command reconnects to the promoted replica by itself.
Replication is asynchronous: writes acknowledged by a master just before it died can be
missing on the promoted replica (reach's redelivery and idempotency are the defence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.asyncio as aredis
from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from .errors import ConfigError, RedisUnavailable

AnyRedis = Any  # redis.asyncio.Redis | RedisCluster: their common surface is what we use

DEFAULT_URL = "redis://localhost:6379/0"


def unreachable(url: str, exc: BaseException) -> RedisUnavailable:
    """The error for a Redis that cannot be reached, with what to do about it."""
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
_SENTINEL_OPTS = {"sentinel_username", "sentinel_password", "socket_timeout",
                  "socket_connect_timeout"}  # fmt: skip


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
        if name.startswith("socket_"):
            try:
                opts[name] = float(value)
            except ValueError:
                raise bad(f"{name} must be a number of seconds") from None
        else:
            opts[name] = value or None
    return SentinelURL(tuple(hosts), path[0], db, username, password, **opts)


# Commands that fail on a connection error or a timeout are retried: up to 4 times with
# full-jitter exponential backoff (0.2, 0.4, 0.8, 1 s caps). redis-py applies the same
# policy to each (re)connection attempt, which asks the sentinels for the master again,
# so a call rides out about 7 s of failover on average (~15 s at most) before it raises.
_RETRIES = 4
_BACKOFF = {"cap": 1.0, "base": 0.1}


def _master_kw(su: SentinelURL, decode_responses: bool) -> dict[str, Any]:
    return {
        "db": su.db, "username": su.username, "password": su.password,
        "decode_responses": decode_responses, "socket_timeout": su.socket_timeout,
        "socket_connect_timeout": su.socket_connect_timeout, "socket_keepalive": True,
        "health_check_interval": _KW["health_check_interval"],
    }  # fmt: skip


def _sentinel_kw(su: SentinelURL) -> dict[str, Any]:
    # Sentinels are asked one after the other: one that is down must cost little (no retry).
    return {
        "username": su.sentinel_username, "password": su.sentinel_password,
        "socket_timeout": 2.0, "socket_connect_timeout": 1.0,
    }  # fmt: skip


# redis-py (up to 8.1 at least, issue redis/redis-py#3874) asks the sentinels for the master
# only when the pool hands out a connection: a command that lost its connection and is
# retried reconnects to the same, possibly dead, address until its retries run out. These
# connection classes send that reconnection through the sentinels too.
class _SentinelConnection(AsyncSentinelConnection):
    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if retry_socket_connect and not self.is_connected:
            await self.connect()  # -> the master's address -> connect_to -> here, without retry
            return
        await super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )


class _SyncSentinelConnection(SentinelManagedConnection):
    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if retry_socket_connect and not self._sock:
            self.connect()
            return
        super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )


class SentinelRedis(aredis.Redis):
    """An asyncio client of the current master of a Sentinel service; closing it also
    closes its connections to the sentinels."""

    sentinel: AsyncSentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            sentinel, self.sentinel = self.sentinel, None
            if sentinel is not None:
                for s in sentinel.sentinels:
                    await s.aclose()


class SyncSentinelRedis(redis.Redis):
    """The synchronous :class:`SentinelRedis`."""

    sentinel: Sentinel | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            sentinel, self.sentinel = self.sentinel, None
            if sentinel is not None:
                for s in sentinel.sentinels:
                    s.close()


async def _connect_sentinel(url: str, decode_responses: bool) -> SentinelRedis:
    su = parse_sentinel_url(url)
    no_retry = AsyncRetry(NoBackoff(), 0)
    sentinel = AsyncSentinel(
        list(su.sentinels), sentinel_kwargs={**_sentinel_kw(su), "retry": no_retry}
    )
    client = sentinel.master_for(
        su.service, redis_class=SentinelRedis, connection_class=_SentinelConnection,
        retry=AsyncRetry(ExponentialWithJitterBackoff(**_BACKOFF), _RETRIES),
        **_master_kw(su, decode_responses),
    )  # fmt: skip
    client.sentinel = sentinel
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
    sentinel = Sentinel(list(su.sentinels), sentinel_kwargs={**_sentinel_kw(su), "retry": no_retry})
    client = sentinel.master_for(
        su.service, redis_class=SyncSentinelRedis, connection_class=_SyncSentinelConnection,
        retry=Retry(ExponentialWithJitterBackoff(**_BACKOFF), _RETRIES),
        **_master_kw(su, decode_responses),
    )  # fmt: skip
    client.sentinel = sentinel
    try:
        sentinel.discover_master(su.service)
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


async def connect(url: str, *, decode_responses: bool = False) -> AnyRedis:
    """Return a connected asyncio client for ``url`` (Cluster- and Sentinel-aware)."""
    _check_scheme(url)
    if is_sentinel_url(url):
        return await _connect_sentinel(url, decode_responses)
    client: AnyRedis = aredis.Redis.from_url(url, decode_responses=decode_responses, **_KW)
    try:
        info = await client.info("cluster")
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
        await client.aclose()
        raise unreachable(url, e) from e
    if info.get("cluster_enabled") in (1, "1"):
        await client.aclose()
        # redis.asyncio.RedisCluster takes no retry_on_timeout (it retries by its own policy)
        ckw = {k: v for k, v in _KW.items() if k != "retry_on_timeout"}
        client = AsyncRedisCluster.from_url(url, decode_responses=decode_responses, **ckw)
        try:
            await client.initialize()
        except (rexc.RedisError, OSError) as e:
            await client.aclose()
            raise unreachable(url, e) from e
    return client


def connect_sync(url: str, *, decode_responses: bool = False) -> Any:
    """Return a connected synchronous client for ``url`` (Cluster- and Sentinel-aware)."""
    _check_scheme(url)
    if is_sentinel_url(url):
        return _connect_sentinel_sync(url, decode_responses)
    client: Any = redis.Redis.from_url(url, decode_responses=decode_responses, **_KW)
    try:
        info = client.info("cluster")
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
        client.close()
        raise unreachable(url, e) from e
    if info.get("cluster_enabled") in (1, "1"):
        client.close()
        try:
            client = RedisCluster.from_url(url, decode_responses=decode_responses, **_KW)
        except (rexc.RedisError, OSError) as e:
            raise unreachable(url, e) from e
    return client


def is_cluster(client: AnyRedis) -> bool:
    return isinstance(client, (AsyncRedisCluster, RedisCluster))

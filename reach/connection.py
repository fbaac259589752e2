"""Open Redis connections from a URL: standalone or Cluster, asyncio or sync.

``redis://`` and ``rediss://`` URLs are probed once with ``INFO cluster``; a server with
``cluster_enabled:1`` gets a :class:`redis.asyncio.RedisCluster` client instead.
Connection failures become :class:`~reach.errors.RedisUnavailable` with a hint.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis
from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from .errors import ConfigError, RedisUnavailable

AnyRedis = Any  # redis.asyncio.Redis | RedisCluster: their common surface is what we use

DEFAULT_URL = "redis://localhost:6379/0"


def unreachable(url: str, exc: BaseException) -> RedisUnavailable:
    """The error for a Redis that cannot be reached, with what to do about it."""
    return RedisUnavailable(
        f"Cannot reach Redis at {redact(url)} ({exc}). Start one with `reach redis`, "
        "or set --redis-url / REACH_REDIS_URL to a running Redis >= 7."
    )


def redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages and logs)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    cred, host = rest.rsplit("@", 1)
    user = cred.split(":", 1)[0] if ":" in cred else ""
    return f"{scheme}://{user}:***@{host}"


def _check_scheme(url: str) -> None:
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"Unsupported Redis URL {redact(url)!r}: use redis://host:port/db, "
            "rediss://... (TLS) or unix:///path/to/socket."
        )


_KW: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "health_check_interval": 15,
    "retry_on_timeout": True,
}


async def connect(url: str, *, decode_responses: bool = False) -> AnyRedis:
    """Return a connected asyncio client for ``url`` (Cluster-aware); checks with PING."""
    _check_scheme(url)
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
    """Return a connected synchronous client for ``url`` (Cluster-aware)."""
    _check_scheme(url)
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

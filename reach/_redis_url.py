"""A Redis URL as reach reads it, and what a failure to reach it says.

The scheme checked, the password redacted for messages and logs, and the errors that say
what to do when the Redis a URL names cannot be reached or refuses reach's first command.
Apart from :mod:`reach.connection` (which re-exports every name) so that the Sentinel
support (:mod:`reach._sentinel`) uses them without importing the module that imports it.
"""

from __future__ import annotations

from redis import exceptions as rexc

from ._pool import _POOL_EMPTY, POOL_WAIT_S
from .errors import ConfigError, ConnectionsExhausted, ReachError, RedisUnavailable

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

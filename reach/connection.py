"""Open Redis connections from a URL: standalone, Sentinel or Cluster, asyncio or sync.

``redis://`` and ``rediss://`` URLs are probed once with ``INFO cluster``; a server with
``cluster_enabled:1`` gets a :class:`redis.asyncio.RedisCluster` client instead.
Connection failures become :class:`~reach.errors.RedisUnavailable` with a hint.

A cluster URL names one node. A process remembers, per URL, the nodes (masters and
replicas) its cluster clients saw, and a client made from that URL while its node does not
answer (after a failover, say) starts from those instead. A process started while the
URL's node is down knows no others: give it the URL of a live node.

Redis Sentinel (``redis+sentinel://``) is :mod:`reach._sentinel`, whose docstring says
what the URL holds and how its clients ride out a failover; the URL helpers and the errors
with hints are :mod:`reach._redis_url`. Their names are re-exported here (``__all__``),
where code imports them from.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, cast
from urllib.parse import urlsplit

import redis
import redis.asyncio as aredis
from redis import exceptions as rexc
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode as SyncClusterNode
from redis.cluster import RedisCluster
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    from hiredis import pack_command as _hiredis_pack

from ._expiry import expire_after
from ._pool import _KW, POOL_WAIT_S, _WaitingPool
from ._redis_url import (
    ACL_HINT,
    DEFAULT_URL,
    SENTINEL_SCHEME,
    _check_scheme,
    is_pool_exhausted,
    is_sentinel_url,
    probe_failed,
    redact,
    unreachable,
)
from ._redislike import AnyRedis, RedisLike
from ._sentinel import (
    MASTER_WAIT_S,
    SENTINEL_PORT,
    SentinelRedis,
    SentinelURL,
    SyncSentinelRedis,
    _connect_sentinel,
    _connect_sentinel_sync,
    _MasterWait,
    parse_sentinel_url,
)
from .errors import ConfigError, ConnectionsExhausted

__all__ = [
    "ACL_HINT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_URL",
    "MASTER_WAIT_S",
    "POOL_WAIT_S",
    "SENTINEL_PORT",
    "SENTINEL_SCHEME",
    "AnyRedis",
    "ConnectionsExhausted",
    "RedisLike",
    "SentinelRedis",
    "SentinelURL",
    "SyncSentinelRedis",
    "_MasterWait",
    "as_text",
    "connect",
    "connect_sync",
    "is_cluster",
    "is_pool_exhausted",
    "is_sentinel_url",
    "parse_sentinel_url",
    "parser_follows_map",
    "pool_connections",
    "probe_failed",
    "redact",
    "unreachable",
]

log = logging.getLogger("reach.connection")


def as_text(value: Any) -> str:
    """A Redis reply value as text: bytes decoded as UTF-8, anything else through str()."""
    return value.decode() if isinstance(value, bytes) else str(value)


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
        # task per command (three extra event-loop turns per round trip). expire_after
        # bounds it the same way without one (nor a timer of its own: reach._expiry).
        timeout, self.socket_timeout = self.socket_timeout, None
        try:
            with expire_after(timeout):
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

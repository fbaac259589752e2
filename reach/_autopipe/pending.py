"""What every path of the auto-pipeline shares: its limits, the queued command
(:class:`_Pending`) and how a reply or a failure reaches its caller.

Held apart so the multiplexed connection (:mod:`.mux`), the Cluster routing
(:mod:`.cluster`) and the batching core (:mod:`.core`) all import it and none of them
imports another for these (see the package docstring for the design)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from redis import exceptions as rexc
from redis.client import EMPTY_RESPONSE, NEVER_DECODE

DEFAULT_MAX_PIPELINES = 4
"""``multiplex=False``: batches in flight at once, the connections batched commands use
(per node on a Cluster). Otherwise one multiplexed connection (per node) is used."""

DEFAULT_MAX_BATCH = 512
"""Commands in one batch (one write) at most; more go in the next."""

DEFAULT_MAX_IN_FLIGHT = 8192
"""Multiplexed connection: commands written and not yet answered at most (the rest wait
in the queue), per connection (per node on a Cluster). A bound on memory, not on speed:
16 writes of ``max_batch``."""

IDLE_RELEASE_S = 1.0
"""Multiplexed connection: given back to the pool after this long with nothing to send or
read (its tasks end too), taken again at the next command. An auto-pipeline that is
dropped without :meth:`AutoPipeline.aclose` (a Client over a shared client only drains
its own) so holds no connection for long."""

_NO_EMPTY = object()  # a command without EMPTY_RESPONSE
_CLEAN = frozenset({NEVER_DECODE, EMPTY_RESPONSE, "keys"})  # options no callback takes

# redis-py refused these before writing anything: the batch may be sent again one by one.
_BEFORE_WRITE = (rexc.DataError, rexc.RedisClusterException)

# Multi-key commands a Cluster pipeline cannot route when their keys are in several slots
# (the plain Cluster client splits them by slot): sent on their own there.
_MULTI_KEY = frozenset({"delete", "exists"})


# Cluster error replies saying the command did not run on this node (a slot that moved or
# is moving, a cluster without a quorum): it is sent where the cluster says, not answered.
_REDIRECTS = (rexc.AskError, rexc.TryAgainError, rexc.ClusterDownError)  # MovedError is an AskError

MAX_REDIRECTS = 16
"""Cluster: redirections one command follows at most (redis-py's ``RedisClusterRequestTTL``);
past that its caller gets the last one as its error."""

# Commands whose keys follow a STREAMS word (movable keys: redis-py would ask the server).
_STREAMS = frozenset({"XREAD", "XREADGROUP"})


# Methods queued by their command word (a Cluster pipeline blocks the script methods; the
# words themselves go through: redis-py routes them by their keys).
_BY_WORD = {"evalsha": "EVALSHA", "eval": "EVAL"}


@dataclass(slots=True)
class _Pending:
    """One queued command: the client method, its arguments, and where its reply goes."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    fut: asyncio.Future[Any]
    tries: int = field(default=0)  # NOSCRIPT resends
    # Multiplexed connection: the command's words and how its reply is parsed (captured
    # once, kept for a resend), and the connection failures it met.
    words: tuple[Any, ...] | None = None
    never_decode: bool = False
    empty: Any = _NO_EMPTY
    options: dict[str, Any] | None = None
    failures: int = 0
    # Cluster: the redirections (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) it followed, the node
    # an ASK sent it to (``(host, port)``, used once), and whether it is the ``ASKING``
    # written before such a command (nobody waits for its reply).
    redirects: int = 0
    ask: tuple[str, int] | None = None
    asking: bool = False

    @classmethod
    def raw(cls, words: tuple[Any, ...], fut: asyncio.Future[Any]) -> _Pending:
        """A command given by its words (no redis-py method, no reply callback options)."""
        return cls("execute_command", words, {}, fut, words=words, options={})


def _answer(p: _Pending, reply: Any) -> None:
    if p.fut.done():
        return  # its caller was cancelled meanwhile
    if isinstance(reply, Exception):
        p.fut.set_exception(reply)
    else:
        p.fut.set_result(reply)


def _as_error(e: BaseException) -> Exception:
    return e if isinstance(e, Exception) else rexc.ConnectionError(f"interrupted ({e!r})")


def _policy_of(retry: Any) -> tuple[Any, int, tuple[type[BaseException], ...]]:
    """A redis-py ``Retry``'s retries and retryable errors."""
    supported = getattr(retry, "_supported_errors", (rexc.ConnectionError, rexc.TimeoutError))
    return retry, retry.get_retries(), supported


def _backoff(retry: Any, failures: int) -> float:
    """The pause a redis-py ``Retry`` makes before try ``failures + 1``."""
    backoff = getattr(retry, "_backoff", None)
    if not failures or backoff is None:
        return 0.0
    return float(backoff.compute(failures))


def _consumed(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # nobody waits for it: no "exception never retrieved" warning

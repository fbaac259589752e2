"""Auto-pipelining: the commands that concurrent tasks issue in one event-loop turn go to
Redis in one write, over one connection (standalone, Sentinel) or one per node (Cluster)
whatever the concurrency.

Redis serves one connection's commands in order, so one connection carrying the commands
of many coroutines, written at once and answered in order, is both faster than a
connection per command and bounded. :class:`AutoPipeline` wraps an asyncio client
(standalone, Sentinel or Cluster) and is itself one (:class:`~reach.connection.RedisLike`):

* a command is queued, not sent; the commands queued while the tasks that are ready now
  run go out together once they have run (the writer is woken with ``call_soon``): a lone
  command therefore waits for nothing but the end of the current turn (no timer);
* each caller gets its own reply or its own error: Redis's error replies come back in
  place, so one refused command fails only its caller. A command redis-py refuses before
  anything is written (an argument it cannot encode, an empty ``HSET`` mapping, keys of
  different Cluster slots) fails only its caller;
* ``EVALSHA`` answered with NOSCRIPT (a restarted or failed-over server) did not run: the
  scripts are loaded (:func:`reach.scripts.load_all`) and just those commands are sent
  again, as :func:`reach.scripts.run_pipeline` does;
* a caller cancelled before its command was written is left out (nothing is sent for it);
  once written, its command runs and the reply is dropped.

Standalone and Sentinel: one multiplexed connection
---------------------------------------------------
The commands go out on one connection taken from the client's pool (given back after
:data:`IDLE_RELEASE_S` with nothing in flight, taken again by the next command): a writer
task writes each batch (at most ``max_batch`` commands, packed by the connection as
redis-py's pipeline packs them) as soon as it is ready, without waiting for the replies of
the batches before it, and a reader task takes the replies in order (Redis answers one
connection's commands in order, as ioredis and StackExchange.Redis rely on) and parses
each as redis-py's ``parse_response`` does (``NEVER_DECODE``, ``EMPTY_RESPONSE``, the
client's ``response_callbacks``), resolving its caller's future. redis-py's command
methods make the words: each call is captured from a redis-py pipeline's
``execute_command`` (so its checks, options and callbacks are redis-py's own). At most
``max_in_flight`` commands are written and unanswered at once (memory); more wait in the
queue. So batched commands use one connection whatever the concurrency, and fetch, claim
and settle of a worker no longer wait for each other's round trips.

A connection that fails (an error reading or writing, a reply that takes longer than the
connection's ``socket_timeout``, a Sentinel ``READONLY`` demotion) fails every command
written on it and not yet answered. As redis-py does for a pipeline today, those commands
are sent again after reconnecting, following the connection's ``Retry`` policy (its
retries, backoff and retryable errors: one retry here, see :mod:`reach.connection`), and
get the error once the retries are spent: such a command may have run, so it may run
twice, exactly as with a plain redis-py call retried after a broken connection (reach's
redelivery and idempotency are built for that); what the policy does not retry gets the
error at once. Commands not yet written wait for the reconnection; a reconnection that
fails counts as a failure for every command waiting, so no caller waits longer than the
policy's retries of a connection attempt: each gets a reply or an error, none hangs. On
Sentinel the reconnection asks the sentinels for the master, so after a failover the
commands go to the new master; while the connection is in use the pool is asked at most
once a second whether the master moved, as when it hands out a connection.

Cluster: one multiplexed connection per node
--------------------------------------------
Each command goes to the multiplexed connection (as above) of the master that holds its
keys' slot: redis-py's own routing (``RedisCluster._determine_slot``, the slot map of its
``nodes_manager``), run without asking a server; ``XREAD``/``XREADGROUP`` by the keys
after ``STREAMS``. A node's connection is taken from redis-py's ``ClusterNode`` but held
apart from its ``max_connections`` (the plain client's commands keep all of those) and
given back after :data:`IDLE_RELEASE_S` idle. So batched commands use one connection per
master whatever the concurrency, and a node's batches do not wait for another's. A
command without a key, with keys of several slots, or one redis-py sends to chosen nodes
or whose replies it merges (``PING``, ``SCRIPT LOAD``, ``target_nodes=``) goes through
the plain cluster client instead: correct, on a connection of the client's pool.

The slot map moves (resharding, failover) and a node says so in a reply; such a command
did not run there, and its caller does not see it:

* ``MOVED``: the slot map is patched as redis-py does (``nodes_manager.move_slot``; read
  again whole every ``reinitialize_steps`` moves) and the command goes to the new owner;
* ``ASK`` (a slot being migrated): ``ASKING`` and the command are written one after the
  other on the target node's connection, this once;
* ``TRYAGAIN`` (keys of a slot half moved): sent again after 50 ms; ``CLUSTERDOWN``: the
  map is read again after 250 ms and the command sent where it says;

each at most :data:`MAX_REDIRECTS` times (redis-py's TTL), then the caller gets the last
reply as its error. NOSCRIPT is reloaded on the node that answered it. A node's connection
that fails (a killed or failed-over master) fails its written, unanswered commands as
above, with the cluster client's ``Retry`` policy (redis-py's default: 10 retries, backoff
10 ms doubling up to 1 s); those it retries are sent again, after the slot map is read
again (the failed node asked last, as redis-py does), to whichever node holds their slot
then; so are those waiting to be written when the node cannot be reached. Commands
issued meanwhile wait for the map. A command may so run twice, as on standalone.
redis-py's startup nodes keep the connection they read the slot map on: it is closed, so a
client holds no idle connection beside its node connections and its blocking reads.

With ``multiplex=False``: pipelines
-----------------------------------
A batch goes out as one redis-py pipeline (``transaction=False``; on a Cluster
``ClusterPipeline`` splits it by node and follows MOVED/ASK). A batch of one is sent as
the plain command. At most ``max_pipelines`` batches are in flight; while they are, new
commands gather in the next batch, so the connections used are ``max_pipelines`` (per
node) plus the blocking reads. A command redis-py refuses before writing sends its batch
again one command at a time; an error of the connection (after redis-py's own retries)
fails the whole batch. A client pinned to one connection of its own
(``single_connection_client``) gets this mode too.

Commands that wait on the server (``XREAD``/``XREADGROUP`` with ``block``) and those that
are not one request and one reply (``scan_iter``, ``SCRIPT LOAD`` on every primary,
``INFO``, a ``MULTI`` pipeline) pass through to the wrapped client on a connection of their
own. ``pipeline(transaction=False)`` gives a pipeline whose commands join the current
batch, so code written with explicit pipelines shares the connection too.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Self

from redis import exceptions as rexc
from redis.client import EMPTY_RESPONSE, NEVER_DECODE

from .connection import AnyRedis, is_cluster, parser_follows_map
from .errors import ConfigError
from .scripts._loader import is_noscript, load_all

log = logging.getLogger("reach.autopipe")

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


def _batched(name: str) -> Callable[..., Awaitable[Any]]:
    """The method ``name`` of :class:`AutoPipeline`: redis-py's, sent in the current batch."""

    async def method(self: AutoPipeline, *args: Any, **kwargs: Any) -> Any:
        return await self._enqueue(name, args, kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` of redis-py, sent in the current batch."
    return method


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


class _MuxScripts:
    """What :func:`load_all` needs (``script_load``), sent on one multiplexed connection
    (on a Cluster, the node's that answered NOSCRIPT): the NOSCRIPT recovery opens no
    connection of its own."""

    def __init__(self, mux: _Mux) -> None:
        self._mux = mux

    async def script_load(self, source: str) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._mux.submit(_Pending.raw(("SCRIPT", "LOAD", source), fut))
        return await fut


class _Mux:
    """The multiplexed connection of an :class:`AutoPipeline` (see the module docstring):
    a writer task writes the queued commands without waiting for earlier replies, a reader
    task reads the replies in the order the commands were written.

    Standalone and Sentinel: one, over the client's pool. Cluster: one per node, over
    that node's connections (``pool`` a :class:`_NodePool`), fed by the ``router``
    (:class:`_ClusterRouter`), to which it gives back what must go elsewhere: a command
    answered with a redirection, and those a failed connection leaves to be sent again
    (after the slot map is refreshed)."""

    def __init__(
        self,
        auto: AutoPipeline,
        pool: Any = None,
        router: _ClusterRouter | None = None,
        node: Any = None,
    ) -> None:
        redis: Any = auto.redis
        self.auto = auto
        self.redis = redis
        self.pool: Any = redis.connection_pool if pool is None else pool
        self.router = router
        self.node = node
        self.queue: collections.deque[_Pending] = collections.deque()  # to write, in order
        self.inflight: collections.deque[_Pending] = collections.deque()  # written, unanswered
        self.conn: Any = None  # the pooled connection, kept until aclose
        self.gen = 0  # bumped when the connection fails: a reader of an older one stops
        self.broken = False  # the connection failed: reset it before the next write
        self.backoff = 0.0  # the Retry policy's pause before the next write
        self.writer: asyncio.Task[None] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self._wake_writer: asyncio.Future[None] | None = None
        self._wake_reader: asyncio.Future[None] | None = None
        self.noscript: list[_Pending] = []  # answered NOSCRIPT, resent once the scripts load
        self.loading = False
        self.closed = False
        self._checked = time.monotonic()
        self._capture: Any = None  # a redis-py pipeline: its execute_command queues words
        self._stale: Any = None  # the connection of an event loop used before this one

    # -- queueing ---------------------------------------------------------------------------
    def submit(self, p: _Pending) -> None:
        if self.closed:
            p.fut.set_exception(rexc.ConnectionError("the client is closed"))
            return
        loop = asyncio.get_running_loop()
        if self.writer is not None and self.writer.get_loop() is not loop:
            self._moved_loop()
        self.queue.append(p)
        if self.writer is None or self.writer.done():
            self.writer = loop.create_task(self._write_loop())
        else:
            self._kick_writer()

    def _moved_loop(self) -> None:
        """Used from another event loop than before (the old one ended): start afresh.
        The old loop's tasks and futures stay with it; its connection goes back to the
        pool (reconnected when used: a socket belongs to one loop)."""
        self.gen += 1
        if self.conn is not None:
            self._stale, self.conn = self.conn, None
        self.writer = self.reader = None
        self._wake_writer = self._wake_reader = None
        self.queue = collections.deque()
        self.inflight = collections.deque()
        self.noscript = []
        self.tasks = set()
        self.broken = self.loading = False
        self.backoff = 0.0

    def _kick_writer(self) -> None:
        w = self._wake_writer
        if w is not None and not w.done():
            w.set_result(None)

    def _kick_reader(self) -> None:
        w = self._wake_reader
        if w is not None and not w.done():
            w.set_result(None)

    def waiting(self) -> list[asyncio.Future[Any]]:
        """The futures of every command not answered yet."""
        return [p.fut for q in (self.queue, self.inflight, self.noscript) for p in q]

    def _capture_words(self, p: _Pending) -> None:
        """redis-py's words and reply options for ``p`` (its own checks may refuse it)."""
        cap = self._capture
        if cap is None:
            cap = self._capture = self.redis.pipeline(transaction=False)
        cap.command_stack.clear()
        getattr(cap, p.method)(*p.args, **p.kwargs)
        words, options = cap.command_stack.pop()
        p.words = words
        p.never_decode = NEVER_DECODE in options
        p.empty = options.get(EMPTY_RESPONSE, _NO_EMPTY)
        p.options = {k: v for k, v in options.items() if k not in _CLEAN}

    # -- the writer -------------------------------------------------------------------------
    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        auto = self.auto
        while True:
            if not self.queue or len(self.inflight) >= auto.max_in_flight:
                if self.closed and not self.queue:
                    return
                idle = not self.queue and not self.inflight and self.conn is not None
                self._wake_writer = loop.create_future()
                try:
                    async with asyncio.timeout(IDLE_RELEASE_S if idle else None):
                        await self._wake_writer
                except TimeoutError:
                    if not self.queue and not self.inflight:
                        await self._release()
                        if not self.queue:
                            return  # the next command starts a writer again
                finally:
                    self._wake_writer = None
                continue
            if self.backoff > 0:
                pause, self.backoff = self.backoff, 0.0
                await asyncio.sleep(pause)
                continue
            try:
                conn = await self._connection()
            except Exception as e:  # noqa: BLE001 - no connection: the waiting commands' failure
                self._connect_failed(e)
                continue
            try:
                await self._write(conn, loop)
            except Exception as e:  # a bug: the commands must still get an answer
                log.exception("auto-pipeline writer failed; failing the commands in flight")
                self._fail_all(e)

    async def _connection(self) -> Any:
        """The connection to write on: taken from the pool once, reset after a failure
        (the reader of the failed one stopped first, so no read mixes two sockets)."""
        pool = self.pool
        if self._stale is not None:
            stale, self._stale = self._stale, None
            try:
                await stale.disconnect(nowait=True)
            except Exception:  # its loop is gone: only the socket is dropped
                log.debug("closing a connection of an ended event loop failed", exc_info=True)
            await pool.release(stale)
        if self.conn is None:
            self.conn = await pool.get_connection()
        conn = self.conn
        if self.broken:
            reader = self.reader
            if reader is not None and not reader.done():
                reader.cancel()
                await asyncio.wait([reader])
            self.broken = False
            await conn.disconnect(nowait=True)
        self._check_master()
        if not conn.is_connected:
            await conn.connect()
        if self.reader is None or self.reader.done():
            # The connection's socket_timeout bounds each reply, taken now: redis-py's
            # hiredis-packing connection (reach.connection) clears it while a write waits.
            limit = conn.socket_timeout
            self.reader = asyncio.get_running_loop().create_task(
                self._read_loop(conn, self.gen, limit)
            )
        return conn

    def _check_master(self) -> None:
        # reach's Sentinel pool asks the sentinels whether the master moved when it hands
        # out a connection (at most once per recheck_s, in the background). This connection
        # is handed out once: ask here, as often, while it is in use.
        pool = self.pool
        recheck = getattr(pool, "_recheck", None)
        if recheck is None or not getattr(pool, "is_master", False):
            return
        now = time.monotonic()
        if now - self._checked < getattr(pool, "recheck_s", 1.0):
            return
        self._checked = now
        pool._checked = now
        task = getattr(pool, "_check_task", None)
        if task is None or task.done():
            pool._check_task = asyncio.get_running_loop().create_task(recheck())

    async def _write(self, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        auto = self.auto
        room = min(auto.max_batch, auto.max_in_flight - len(self.inflight))
        chunks: list[bytes] = []
        batch: list[_Pending] = []
        queue = self.queue
        while queue and len(batch) < room:
            p = queue.popleft()
            if p.fut.done():
                continue  # cancelled before the write: nothing is sent for it
            try:
                if p.words is None:
                    self._capture_words(p)
                assert p.words is not None
                chunks.extend(conn.pack_command(*p.words))
            except Exception as e:  # noqa: BLE001 - refused before the write: its own error
                _answer(p, e)
                continue
            batch.append(p)
        if not batch:
            return
        gen = self.gen
        self.inflight.extend(batch)
        self._kick_reader()
        auto.batches += 1
        auto.commands += len(batch)
        try:
            await conn.send_packed_command(chunks, check_health=False)
        except BaseException as e:
            if gen == self.gen:
                self._broken(e)
            if not isinstance(e, Exception):
                raise

    async def _release(self) -> None:
        """Give the connection back to the pool (nothing is in flight on it)."""
        reader, self.reader = self.reader, None
        if reader is not None and not reader.done():
            reader.cancel()  # it waits for commands: no read is under way
            await asyncio.wait([reader])
        conn, self.conn = self.conn, None
        self.broken = False
        if conn is not None:
            await self.pool.release(conn)

    # -- the reader -------------------------------------------------------------------------
    async def _read_loop(self, conn: Any, gen: int, limit: float | None) -> None:
        loop = asyncio.get_running_loop()
        inflight = self.inflight
        callbacks = self.redis.response_callbacks
        while gen == self.gen:
            if not inflight:
                self._wake_reader = loop.create_future()
                try:
                    await self._wake_reader
                finally:
                    self._wake_reader = None
                continue
            p = inflight[0]
            try:
                async with asyncio.timeout(limit):
                    reply = await conn.read_response(
                        disable_decoding=p.never_decode, timeout=math.inf
                    )
            except rexc.ResponseError as e:  # an error reply: the connection is fine
                redirect = self.router is not None and isinstance(e, _REDIRECTS)
                reply = e if p.empty is _NO_EMPTY or redirect else p.empty
            except TimeoutError:  # the reply took longer than socket_timeout
                if gen == self.gen:
                    self._broken(rexc.TimeoutError(f"Timeout reading from {conn._host_error()}"))
                return
            except BaseException as e:
                if gen == self.gen:
                    self._broken(e)
                if not isinstance(e, Exception):
                    raise
                return
            if gen != self.gen:
                return  # its commands were queued again: this reply is not theirs
            inflight.popleft()
            if self._wake_writer is not None and (self.queue or not inflight):
                self._kick_writer()  # room again for the writer, or idle: it may release
            if self.router is not None and isinstance(reply, _REDIRECTS) and not p.asking:
                if not p.fut.done():  # it did not run here: the router sends it on
                    self.router.redirected(p, reply)
                continue
            if not isinstance(reply, Exception):
                assert p.words is not None and p.options is not None
                cb = callbacks.get(p.words[0])
                if cb is not None:
                    try:
                        reply = cb(reply, **p.options)
                        if inspect.isawaitable(reply):
                            reply = await reply
                    except Exception as e:  # noqa: BLE001 - its caller's error
                        reply = e
            if isinstance(reply, Exception) and p.tries == 0 and is_noscript(reply):
                if not p.fut.done():
                    self._reload(p)
                continue
            _answer(p, reply)

    # -- failures ---------------------------------------------------------------------------
    def _policy(self) -> tuple[Any, int, tuple[type[BaseException], ...]]:
        # A Cluster's node connections retry nothing (redis-py retries a command at the
        # client, after refreshing the slot map): the client's policy is the one.
        retry = self.router.redis.retry if self.router is not None else self.conn.retry
        return _policy_of(retry)

    def _pause(self, retry: Any, failures: int) -> None:
        self.backoff = max(self.backoff, _backoff(retry, failures))

    def _again(self, again: list[_Pending], retry: Any, worst: int) -> None:
        """Send ``again`` (in order, before the rest) after the policy's pause: on this
        connection, or on a Cluster wherever the refreshed slot map says."""
        if self.router is not None:
            for p in again:
                if p.asking:  # its command is sent again without it
                    _answer(p, rexc.ConnectionError("ASKING not sent"))
            again = [p for p in again if not p.asking]
            self.router.failed(self, again, _backoff(retry, worst))
            return
        self.queue.extendleft(reversed(again))
        self._pause(retry, worst)

    def _broken(self, exc: BaseException) -> None:
        """The connection failed: every command written on it and unanswered is queued
        again (first, in order) or gets the error, per the connection's Retry policy."""
        self.gen += 1
        self.broken = True
        err = _as_error(exc)
        retry, retries, supported = self._policy()
        again: list[_Pending] = []
        worst = 0
        for p in self.inflight:
            if p.fut.done():
                continue
            p.failures += 1
            if isinstance(err, supported) and (retries < 0 or p.failures <= retries):
                again.append(p)
                worst = max(worst, p.failures)
            else:
                _answer(p, err)
        self.inflight.clear()
        self._again(again, retry, worst)
        self._kick_writer()

    def _connect_failed(self, exc: Exception) -> None:
        """No connection (after redis-py's own tries): a failure for every waiting command."""
        self.broken = True
        retry: Any = None
        retries = 0
        supported: tuple[type[BaseException], ...] = ()
        if self.conn is not None or self.router is not None:  # else no connection at all
            retry, retries, supported = self._policy()
        keep: list[_Pending] = []
        worst = 0
        for p in self.queue:
            if p.fut.done():
                continue
            p.failures += 1
            if isinstance(exc, supported) and (retries < 0 or p.failures <= retries):
                keep.append(p)
                worst = max(worst, p.failures)
            else:
                _answer(p, exc)
        self.queue = collections.deque()
        self._again(keep, retry, worst)

    def _fail_all(self, exc: Exception) -> None:
        self.gen += 1
        self.broken = True
        for q in (self.inflight, self.queue):
            for p in q:
                _answer(p, exc)
            q.clear()

    # -- NOSCRIPT ---------------------------------------------------------------------------
    def _reload(self, p: _Pending) -> None:
        p.tries += 1
        self.noscript.append(p)
        if not self.loading:
            self.loading = True
            task = asyncio.get_running_loop().create_task(self._load())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _load(self) -> None:
        # The scripts are not in the server's cache: load them (on this connection) and
        # send just those commands again (they did not run).
        err: Exception | None = None
        try:
            await load_all(_MuxScripts(self))
        except Exception as e:  # noqa: BLE001 - the waiting callers' error
            err = e
        finally:
            self.loading = False
        waiting, self.noscript = self.noscript, []
        if err is not None:
            for p in waiting:
                _answer(p, err)
            return
        self.queue.extendleft(reversed(waiting))
        if self.queue:
            if self.writer is None or self.writer.done():
                self.writer = asyncio.get_running_loop().create_task(self._write_loop())
            self._kick_writer()

    # -- closing ----------------------------------------------------------------------------
    async def aclose(self) -> None:
        self.closed = True
        self._kick_writer()
        for t in (self.writer, self.reader, *self.tasks):
            if t is not None and not t.done():
                t.cancel()
        await asyncio.gather(
            *(t for t in (self.writer, self.reader, *self.tasks) if t is not None),
            return_exceptions=True,
        )
        self._fail_all(rexc.ConnectionError("the client is closed"))
        for p in self.noscript:
            _answer(p, rexc.ConnectionError("the client is closed"))
        self.noscript = []
        conn, self.conn = self.conn, None
        if conn is not None:
            await self.pool.release(conn)


class _NodePool:
    """A Cluster node's connections (redis-py's ``ClusterNode``) as a :class:`_Mux`'s
    pool: the mux takes one and keeps it while it is in use, outside the node's count
    (the plain client's commands keep every one of ``max_connections``: reach's gate lets
    that many run at once, and one more would fail with ``MaxConnectionsError``)."""

    def __init__(self, node: Any) -> None:
        self.node = node

    async def get_connection(self) -> Any:
        node = self.node
        conn = node.acquire_connection()
        node._connections.remove(conn)  # held apart from the pool until released
        if getattr(conn, "should_reconnect", bool)():  # marked by a map refresh: a new socket
            await conn.disconnect()
        return conn

    async def release(self, conn: Any) -> None:
        node = self.node
        # A master turned replica (a failover) gets no more commands: nothing kept open.
        if node.server_type != "replica" and len(node._connections) < node.max_connections:
            node._connections.append(conn)
            node.release(conn)
        else:
            await conn.disconnect()


class _ClusterRouter:
    """Cluster, multiplexed: each command goes to the multiplexed connection of the node
    that holds its keys' slot (redis-py's own routing: ``_determine_slot``, the slot map
    of its ``nodes_manager``). A redirection or a failed connection sends the command on
    after the slot map is patched or refreshed as redis-py does (``move_slot``,
    ``nodes_manager.initialize``); what it cannot route (no key, keys of several slots, a
    command redis-py sends to chosen nodes) goes through the plain cluster client."""

    def __init__(self, auto: AutoPipeline) -> None:
        self.auto = auto
        self.redis: Any = auto.redis
        self.muxes: dict[str, _Mux] = {}  # by node name
        self.retired: list[_Mux] = []  # of node objects the slot map replaced
        self.backlog: collections.deque[_Pending] = collections.deque()  # wait for the map
        self.moves: list[Exception] = []  # MOVED replies not applied to the slot map yet
        self.refresh = False  # reload the whole slot map before routing the backlog
        self.failed_node: str | None = None
        self.pause = 0.0
        self.task: asyncio.Task[None] | None = None  # refreshes, then routes the backlog
        self.plain: set[asyncio.Task[None]] = set()  # commands sent by the plain client
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._kinds: dict[str, str] = {}  # how a command word's slot is found
        self.followed: collections.Counter[str] = collections.Counter()
        """Redirections followed so far, by kind (``MovedError``, ``AskError``, ...)."""
        # The words of a command, as a standalone pipeline makes them (a Cluster pipeline
        # refuses some methods, EVALSHA among them); nothing is connected.
        self._capture: Any = None

    # -- routing ----------------------------------------------------------------------------
    def submit(self, p: _Pending) -> None:
        if self.closed:
            p.fut.set_exception(rexc.ConnectionError("the client is closed"))
            return
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            if self.loop is not None:
                self._moved_loop()
            self.loop = loop
            self._tidy_later()
        if p.words is None:
            try:
                self._capture_words(p)
            except Exception as e:  # noqa: BLE001 - refused before the write: its own error
                _answer(p, e)
                return
        if self.task is not None or self.backlog or self.redis._initialize:
            self.backlog.append(p)  # after the commands waiting for the slot map
            self._start()
            return
        self._route(p)

    def _tidy_later(self) -> None:
        task = asyncio.get_running_loop().create_task(self._tidy())
        self.plain.add(task)
        task.add_done_callback(self.plain.discard)

    async def _tidy(self) -> None:
        """Close the idle connections of redis-py's startup nodes (the objects it asks
        for the slot map, not those it sends commands to): each keeps the connection it
        read the map on, one more per node than the commands need. Reopened when the map
        is read again."""
        nodes = self.redis.nodes_manager
        for name, node in list(getattr(nodes, "startup_nodes", {}).items()):
            close = getattr(node, "disconnect_free_connections", None)
            if close is not None and nodes.nodes_cache.get(name) is not node and node._free:
                try:
                    await close()
                except Exception:  # only a socket left open
                    log.debug("closing a startup node's connection failed", exc_info=True)

    def _moved_loop(self) -> None:
        # The old loop's tasks and futures stay with it (each mux starts afresh too).
        self.backlog = collections.deque()
        self.moves = []
        self.task = None
        self.plain = set()
        self.pause = 0.0

    def _capture_raw(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        cap = self._capture
        if cap is None:
            from redis.asyncio import Redis  # only its pipeline's command methods are used

            cap = self._capture = Redis().pipeline(transaction=False)
        cap.command_stack.clear()
        getattr(cap, method)(*args, **kwargs)
        words, options = cap.command_stack.pop()
        return words, options

    def _capture_words(self, p: _Pending) -> None:
        words, options = self._capture_raw(p.method, p.args, p.kwargs)
        p.words = words
        p.never_decode = NEVER_DECODE in options
        p.empty = options.get(EMPTY_RESPONSE, _NO_EMPTY)
        p.options = {k: v for k, v in options.items() if k not in _CLEAN}

    def _route(self, p: _Pending) -> None:
        if p.fut.done():
            return
        nodes = self.redis.nodes_manager
        if p.ask is not None:
            (host, port), p.ask = p.ask, None
            node = nodes.get_node(host=host, port=port)
            if node is None:  # a node the slot map does not know yet: redis-py follows it
                self._send_plain(p)
                return
            mux = self._mux(node)
            asking: asyncio.Future[Any] = p.fut.get_loop().create_future()
            asking.add_done_callback(_consumed)
            ask = _Pending.raw(("ASKING",), asking)
            ask.asking = True
            mux.submit(ask)  # right before the command, on the same connection
            mux.submit(p)
            return
        slot = self._slot(p)
        if slot is None:
            self._send_plain(p)
            return
        try:
            node = nodes.get_node_from_slot(slot)
        except rexc.SlotNotCoveredError:  # redis-py refreshes the map, or fails it
            self._send_plain(p)
            return
        self._mux(node).submit(p)

    def _mux(self, node: Any) -> _Mux:
        mux = self.muxes.get(node.name)
        if mux is None or mux.node is not node:
            if mux is not None:  # kept until it is done with what it holds
                self.retired = [m for m in self.retired if m.waiting() or m.conn is not None]
                self.retired.append(mux)
            mux = self.muxes[node.name] = _Mux(self.auto, _NodePool(node), self, node)
        return mux

    def _slot(self, p: _Pending) -> int | None:
        """The slot of ``p``'s keys as redis-py computes it, or None: no key, keys of
        several slots, or a command redis-py does not route by one slot."""
        assert p.words is not None and p.options is not None
        words = p.words
        cmd = words[0]
        if not isinstance(cmd, str) or "target_nodes" in p.options:
            return None
        kind = self._kinds.get(cmd)
        if kind is None:
            kind = self._kind_of(cmd)
        if kind == "one":  # its one key is its first argument (GET, HSET, XADD, ...)
            return self.redis.keyslot(words[1]) if len(words) > 1 else None
        if kind == "script":  # EVAL/EVALSHA: numkeys keys (none: any node, the plain way)
            try:
                keys = words[3 : 3 + int(words[2])]
            except (IndexError, ValueError, TypeError):
                return None
            return self._one_slot(keys)
        if kind == "streams":
            return self._streams_slot(words)
        if kind == "plain":
            return None
        # redis-py's routing coroutine, run to its end at once: with the checks of
        # _kind_of it only reads tables (a suspension would be a server call: not here).
        coro = self.redis._determine_slot(*words)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value if isinstance(done.value, int) else None
        except (rexc.RedisError, ValueError, IndexError, TypeError):
            return None  # no key, keys in several slots: the plain client's error
        coro.close()
        return None

    def _kind_of(self, cmd: str) -> str:
        """How the slot of command ``cmd`` is found (kept per command word): ``one``,
        ``script``, ``streams``, ``keys`` (redis-py's key table), or ``plain`` (not by
        one slot: sent by the plain client)."""
        r = self.redis
        commands = r.commands_parser.commands
        word = cmd.upper()
        kind = "keys"
        if word in r.command_flags or word in r.result_callbacks:
            kind = "plain"  # sent to chosen nodes, or its replies are merged
        elif self._has_policy(cmd):
            kind = "plain"  # a request policy of its own (redis-py >= 7)
        elif word in ("EVAL", "EVALSHA"):
            kind = "script"
        elif word in _STREAMS:
            kind = "streams"
        else:
            info = commands.get(cmd.lower().split()[0])
            if not isinstance(info, dict) or "movablekeys" in info.get("flags", ()):
                kind = "plain"  # redis-py would ask a node (COMMAND GETKEYS)
            elif " " not in cmd and info.get("first_key_pos") == 1 == info.get("last_key_pos"):
                kind = "one"
        if commands:  # the table is read (else ask again once it is)
            self._kinds[cmd] = kind
        return kind

    def _has_policy(self, cmd: str) -> bool:
        resolver = getattr(self.redis, "_policy_resolver", None)
        if resolver is None:
            return False
        coro = resolver.resolve(cmd.lower())
        try:
            coro.send(None)
        except StopIteration as done:
            return bool(done.value)
        except Exception:  # noqa: BLE001 - unknown to it: routed the plain way
            return True
        coro.close()  # it would wait on something: the plain way
        return True

    def _one_slot(self, keys: Any) -> int | None:
        slots = {self.redis.keyslot(k) for k in keys}
        return slots.pop() if len(slots) == 1 else None

    def _streams_slot(self, words: tuple[Any, ...]) -> int | None:
        for i, w in enumerate(words):
            if (
                isinstance(w, (str, bytes))
                and str(w if isinstance(w, str) else w.decode()).upper() == "STREAMS"
            ):
                rest = words[i + 1 :]
                return self._one_slot(rest[: len(rest) // 2])
        return None

    def _send_plain(self, p: _Pending) -> None:
        """Through the plain cluster client (redis-py's routing, redirections, retries)."""
        task = p.fut.get_loop().create_task(self._plain(p))
        self.plain.add(task)
        task.add_done_callback(self.plain.discard)

    async def _plain(self, p: _Pending) -> None:
        self.auto.commands += 1
        try:
            reply = await getattr(self.redis, p.method)(*p.args, **p.kwargs)
        except Exception as e:  # noqa: BLE001 - its caller's error
            reply = e
        _answer(p, reply)

    async def blocking(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A blocking ``XREAD``/``XREADGROUP`` by the plain client, on a connection of its
        own, sent straight to the node of its streams' slot. redis-py would first ask a
        node for the keys of this movable-keys command (``COMMAND GETKEYS``: one more round
        trip, on one more connection of that node, for every blocking read); anything that
        goes wrong that way is sent again the plain way (redis-py's retries, redirections)."""
        plain = getattr(self.redis, method)
        try:
            words, options = self._capture_raw(method, args, kwargs)
        except Exception:  # noqa: BLE001 - redis-py's own refusal, raised the plain way
            return await plain(*args, **kwargs)
        slot = self._streams_slot(words)
        if slot is None or self.redis._initialize:
            return await plain(*args, **kwargs)
        try:
            node = self.redis.nodes_manager.get_node_from_slot(slot)
        except rexc.SlotNotCoveredError:
            return await plain(*args, **kwargs)
        try:
            return await self.redis.execute_command(*words, target_nodes=node, **options)
        except (rexc.ConnectionError, rexc.TimeoutError, rexc.ClusterError, rexc.AskError):
            return await plain(*args, **kwargs)

    # -- redirections and failures --------------------------------------------------------------
    def redirected(self, p: _Pending, e: Exception) -> None:
        """A node answered ``p`` with MOVED, ASK, TRYAGAIN or CLUSTERDOWN: it did not run."""
        p.redirects += 1
        p.tries = 0  # another node: its script cache is its own
        self.followed[type(e).__name__] += 1
        if p.redirects > MAX_REDIRECTS:
            _answer(p, e)
            return
        if isinstance(e, rexc.MovedError):  # the slot moved: patch the map, then route
            self.moves.append(e)
        elif isinstance(e, rexc.AskError):  # the slot is moving: this once, to that node
            p.ask = (e.host, e.port)
            if self.task is None and not self.backlog:
                self._route(p)
                return
        elif isinstance(e, rexc.TryAgainError):  # keys of a slot being moved: soon again
            self.pause = max(self.pause, 0.05)
        else:  # CLUSTERDOWN: a failover under way
            self.refresh = True
            self.pause = max(self.pause, 0.25)
        self.backlog.append(p)
        self._start()

    def failed(self, mux: _Mux, again: list[_Pending], pause: float) -> None:
        """``mux``'s connection failed: ``again`` go (first) where the refreshed slot map
        says, after ``pause``; the node is asked last for the map (as redis-py does)."""
        self.refresh = True
        name = getattr(mux.node, "name", None)
        self.failed_node = name
        mover = getattr(self.redis.nodes_manager, "move_node_to_end_of_cached_nodes", None)
        if mover is not None and name is not None:
            mover(name)
        self.pause = max(self.pause, pause)
        for p in again:
            p.tries = 0  # maybe another node (a failover): its script cache is its own
        self.backlog.extendleft(reversed(again))
        self._start()

    def _start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        """Refresh the slot map as needed, then route the backlog; again while some wait."""
        try:
            while self.backlog and not self.closed:
                if self.pause > 0:
                    pause, self.pause = self.pause, 0.0
                    await asyncio.sleep(pause)
                err: Exception | None = None
                try:
                    await self._refresh()
                except Exception as e:  # noqa: BLE001 - no slot map: the backlog's failure
                    err = e
                waiting, self.backlog = self.backlog, collections.deque()
                for p in waiting:
                    if err is None:
                        self._route(p)
                    else:
                        self._no_map(p, err)
        finally:
            if self.task is asyncio.current_task():
                self.task = None
        if self.backlog and not self.closed:  # came while it ended
            self._start()

    async def _refresh(self) -> None:
        r = self.redis
        nodes = r.nodes_manager
        moves, self.moves = self.moves, []
        if r._initialize:  # closed by redis-py after an error (a plain command's)
            self.refresh = False
            await r.initialize()
            await self._tidy()
            return
        seen: set[tuple[Any, ...]] = set()
        for e in moves:  # as redis-py: patch the map, reload it every reinitialize_steps
            where = (e.slot_id, e.host, e.port)  # type: ignore[attr-defined]
            if where in seen:
                continue
            seen.add(where)
            r.reinitialize_counter += 1
            if r.reinitialize_steps and r.reinitialize_counter % r.reinitialize_steps == 0:
                r.reinitialize_counter = 0
                self.refresh = True
            else:
                moved = nodes.move_slot(e)
                if inspect.isawaitable(moved):  # a coroutine in redis-py >= 7
                    await moved
        if self.refresh:
            self.refresh = False
            failed, self.failed_node = self.failed_node, None
            kwargs: dict[str, Any] = {}
            if failed and "last_failed_node_name" in inspect.signature(nodes.initialize).parameters:
                kwargs["last_failed_node_name"] = failed
            await nodes.initialize(**kwargs)
            parser_follows_map(r)
            await self._tidy()

    def _no_map(self, p: _Pending, err: Exception) -> None:
        """The slot map could not be read: a failure of ``p``, retried per the policy."""
        if p.fut.done():
            return
        retry, retries, supported = _policy_of(self.redis.retry)
        p.failures += 1
        if isinstance(err, supported) and (retries < 0 or p.failures <= retries):
            self.backlog.append(p)
            self.pause = max(self.pause, _backoff(retry, p.failures))
        else:
            _answer(p, err)

    # -- waiting and closing ----------------------------------------------------------------
    def waiting(self) -> list[asyncio.Future[Any]]:
        futs: list[asyncio.Future[Any]] = [p.fut for p in self.backlog]
        for mux in (*self.muxes.values(), *self.retired):
            futs.extend(mux.waiting())
        futs.extend(self.plain)
        return futs

    async def aclose(self) -> None:
        self.closed = True
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for p in self.backlog:
            _answer(p, rexc.ConnectionError("the client is closed"))
        self.backlog.clear()
        for mux in (*self.muxes.values(), *self.retired):
            await mux.aclose()
        if self.plain:
            await asyncio.gather(*self.plain, return_exceptions=True)


class AutoPipeline:
    """An asyncio Redis client (see the module docstring) over ``redis``.

    Unless ``multiplex=False``: one multiplexed connection (standalone, Sentinel), one per
    node (Cluster), each with at most ``max_in_flight`` (8192) commands written and
    unanswered, in writes of at most ``max_batch`` (512). ``multiplex=False``:
    ``max_pipelines`` (default 4) batches in flight at most, each of at most ``max_batch``
    commands. The wrapped client stays usable on its own;
    closing this one (:meth:`aclose`) waits for the commands in flight and closes the
    wrapped client; :meth:`drain` only waits.
    """

    def __init__(
        self,
        redis: AnyRedis,
        *,
        max_pipelines: int = DEFAULT_MAX_PIPELINES,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        multiplex: bool = True,
    ) -> None:
        if max_pipelines < 1 or max_batch < 1 or max_in_flight < 1:
            raise ConfigError(
                "max_pipelines, max_batch and max_in_flight must be >= 1 (got "
                f"{max_pipelines}, {max_batch}, {max_in_flight})."
            )
        self.redis = redis
        self.max_pipelines = max_pipelines
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.cluster = is_cluster(redis)
        # One multiplexed connection where the client is one pool's (not a Cluster, not a
        # client pinned to one connection of its own).
        self._mux = (
            _Mux(self)
            if multiplex
            and not self.cluster
            and hasattr(redis, "connection_pool")
            and getattr(redis, "connection", None) is None
            else None
        )
        # Cluster: one multiplexed connection per node (redis-py's asyncio RedisCluster).
        self._router = (
            _ClusterRouter(self)
            if multiplex
            and self.cluster
            and hasattr(redis, "nodes_manager")
            and hasattr(redis, "commands_parser")
            else None
        )
        self._open: list[_Pending] = []  # the batch that gathers commands now
        self._full: collections.deque[list[_Pending]] = collections.deque()
        self._running = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Batches written so far (pipelines, or plain commands for a batch of one)."""
        self.commands = 0
        """Commands written so far (a NOSCRIPT resend counts again)."""

    # -- the queue ------------------------------------------------------------------------
    def _enqueue(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Queue ``method(*args, **kwargs)`` in the current batch; its reply's future."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._mux is not None:
            self._mux.submit(_Pending(method, args, kwargs, fut))
            return fut
        if self._router is not None:
            self._router.submit(_Pending(method, args, kwargs, fut))
            return fut
        self._open.append(_Pending(method, args, kwargs, fut))
        if len(self._open) >= self.max_batch:
            self._full.append(self._open)
            self._open = []
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        """Start batches while fewer than ``max_pipelines`` are in flight (the rest wait
        for one to finish: :meth:`_run` calls this again)."""
        self._scheduled = False
        while self._running < self.max_pipelines:
            if self._full:
                batch = self._full.popleft()
            elif self._open:
                batch, self._open = self._open, []
            else:
                return
            batch = [p for p in batch if not p.fut.done()]  # cancelled callers: not sent
            if not batch:
                continue
            self._running += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Pending]) -> None:
        try:
            await self._send(batch)
        except BaseException as e:  # the batch's fate, whatever it is, is each caller's
            for p in batch:
                if not p.fut.done():
                    p.fut.set_exception(
                        e
                        if isinstance(e, Exception)
                        else rexc.ConnectionError(f"the command was interrupted ({e!r})")
                    )
            if not isinstance(e, Exception):
                raise
        finally:
            self._running -= 1
            if self._full or self._open:
                self._flush()

    async def _send(self, batch: list[_Pending]) -> None:
        self.batches += 1
        self.commands += len(batch)
        if len(batch) == 1:
            replies = [await self._one(batch[0])]
        else:
            replies = await self._pipeline(batch)
        retry: list[_Pending] = []
        for p, x in zip(batch, replies, strict=True):
            if isinstance(x, Exception) and is_noscript(x) and p.tries == 0:
                retry.append(p)
            else:
                _answer(p, x)  # answered now: a failure of the resend below is not theirs
        if retry:
            # The scripts are not in the server's cache: load them and send just those
            # commands again (they did not run).
            await load_all(self.redis)
            for p in retry:
                p.tries += 1
            again = await self._pipeline(retry) if len(retry) > 1 else [await self._one(retry[0])]
            for p, x in zip(retry, again, strict=True):
                _answer(p, x)

    async def _one(self, p: _Pending) -> Any:
        """The plain command; its error (a reply or redis-py's refusal) as its reply."""
        try:
            return await getattr(self.redis, p.method)(*p.args, **p.kwargs)
        except (rexc.ResponseError, *_BEFORE_WRITE) as e:
            return e

    async def _pipeline(self, batch: list[_Pending]) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        queued: list[int] = []
        replies: list[Any] = [None] * len(batch)
        for i, p in enumerate(batch):
            try:
                word = _BY_WORD.get(p.method)
                if word is not None:  # redis-py's Cluster pipeline refuses the methods
                    pipe.execute_command(word, *p.args, **p.kwargs)
                else:
                    getattr(pipe, p.method)(*p.args, **p.kwargs)
            except Exception as e:  # noqa: BLE001 - refused as it was queued: its own error
                replies[i] = e
            else:
                queued.append(i)
        if not queued:
            return replies
        try:
            got = await pipe.execute(raise_on_error=False)
        except _BEFORE_WRITE:
            # Nothing was written: one command is bad for the whole pipeline (an argument
            # redis-py cannot encode, keys in different slots). Send each on its own, so
            # only that one fails.
            for i in queued:
                replies[i] = await self._one(batch[i])
            return replies
        for i, x in zip(queued, got, strict=True):
            replies[i] = x
        return replies

    @property
    def multiplexed(self) -> bool:
        """True when the commands go out on multiplexed connections (one, or one per node
        of a Cluster), not pipelines."""
        return self._mux is not None or self._router is not None

    async def drain(self) -> None:
        """Wait until every command queued so far has been answered."""
        mux = self._mux if self._mux is not None else self._router
        if mux is not None:
            while waiting := mux.waiting():
                await asyncio.wait(waiting)
            return
        while self._open or self._full or self._tasks:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            else:
                await asyncio.sleep(0)

    # -- the client surface: batched -------------------------------------------------------
    evalsha = _batched("evalsha")
    eval = _batched("eval")
    get = _batched("get")
    set = _batched("set")
    expire = _batched("expire")
    pexpire = _batched("pexpire")
    pttl = _batched("pttl")
    hdel = _batched("hdel")
    hget = _batched("hget")
    hgetall = _batched("hgetall")
    hincrby = _batched("hincrby")
    hmget = _batched("hmget")
    hset = _batched("hset")
    lrange = _batched("lrange")
    rpush = _batched("rpush")
    sadd = _batched("sadd")
    scard = _batched("scard")
    smembers = _batched("smembers")
    srem = _batched("srem")
    zadd = _batched("zadd")
    zcard = _batched("zcard")
    zrange = _batched("zrange")
    zrangebyscore = _batched("zrangebyscore")
    zrem = _batched("zrem")
    zscore = _batched("zscore")
    xack = _batched("xack")
    xadd = _batched("xadd")
    xdel = _batched("xdel")
    xgroup_create = _batched("xgroup_create")
    xinfo_groups = _batched("xinfo_groups")
    xinfo_stream = _batched("xinfo_stream")
    xlen = _batched("xlen")
    xpending = _batched("xpending")
    xpending_range = _batched("xpending_range")
    xrange = _batched("xrange")
    xrevrange = _batched("xrevrange")

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """A command by its words (``"XADD", key, ...``), sent in the current batch."""
        return await self._enqueue("execute_command", args, options)

    def submit(self, *args: Any) -> asyncio.Future[Any]:
        """A command by its words, queued in the current batch now, without waiting: the
        future of its reply (an error reply or a failure as its exception; NOSCRIPT is
        recovered as for any command). On the multiplexed connection the writer sends it
        at the next turn of the event loop, so the caller can prepare its next commands
        while Redis runs these (``send_many``'s chunks, :mod:`reach._delivery`).
        Cancelling the future drops the command if it is not written yet."""
        return self._enqueue("execute_command", args, {})

    async def delete(self, *names: Any) -> Any:
        return await self._keyed("delete", names)

    async def exists(self, *names: Any) -> Any:
        return await self._keyed("exists", names)

    async def _keyed(self, method: str, names: tuple[Any, ...]) -> Any:
        if self.cluster and len(names) > 1:  # the Cluster client splits them by slot
            return await getattr(self.redis, method)(*names)
        return await self._enqueue(method, names, {})

    async def xread(self, *args: Any, **kwargs: Any) -> Any:
        """``XREAD``; with ``block`` it waits on the server, on a connection of its own."""
        if kwargs.get("block") is not None:
            if self._router is not None:
                return await self._router.blocking("xread", args, kwargs)
            return await self.redis.xread(*args, **kwargs)
        return await self._enqueue("xread", args, kwargs)

    async def xreadgroup(self, *args: Any, **kwargs: Any) -> Any:
        """``XREADGROUP``; with ``block`` it waits on the server, on a connection of its own."""
        if kwargs.get("block") is not None:
            if self._router is not None:
                return await self._router.blocking("xreadgroup", args, kwargs)
            return await self.redis.xreadgroup(*args, **kwargs)
        return await self._enqueue("xreadgroup", args, kwargs)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        """``transaction=False``: a pipeline whose commands join the current batch (see
        :class:`BatchPipeline`); a transaction (``MULTI``) is the wrapped client's own."""
        if transaction or shard_hint is not None:
            return self.redis.pipeline(transaction, shard_hint)
        return BatchPipeline(self)

    # -- the client surface: passed through ------------------------------------------------
    def info(self, *args: Any, **kwargs: Any) -> Any:
        return self.redis.info(*args, **kwargs)

    def ping(self, *args: Any, **kwargs: Any) -> Any:
        return self.redis.ping(*args, **kwargs)

    def script_load(self, *args: Any, **kwargs: Any) -> Any:
        return self.redis.script_load(*args, **kwargs)

    def scan_iter(self, *args: Any, **kwargs: Any) -> Any:
        return self.redis.scan_iter(*args, **kwargs)

    async def aclose(self, *args: Any, **kwargs: Any) -> Any:
        """Wait for the commands queued so far, then close the wrapped client."""
        await self.drain()
        if self._mux is not None:
            await self._mux.aclose()
        if self._router is not None:
            await self._router.aclose()
        return await self.redis.aclose(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Anything else redis-py offers: the wrapped client's own, not batched.
        return getattr(self.redis, name)


class BatchPipeline:
    """``AutoPipeline.pipeline(transaction=False)``: queue commands as on redis-py's
    pipeline, then ``await execute()`` sends them in the current batch of the auto-pipeline
    (with whatever other tasks issued in the same turn) and returns their replies in order.

    ``execute(raise_on_error=True)`` raises the first error (after every reply came, as
    redis-py does); ``raise_on_error=False`` returns every error in its command's place,
    a failed connection's too (the commands may be in different writes: some may have run
    when another failed, and each command's own outcome is what its caller needs).
    """

    def __init__(self, auto: AutoPipeline) -> None:
        self._auto = auto
        self._stack: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self._stack)

    def __getattr__(self, name: str) -> Callable[..., BatchPipeline]:
        if name.startswith("_"):
            raise AttributeError(name)

        def queue(*args: Any, **kwargs: Any) -> BatchPipeline:
            self._stack.append((name, args, kwargs))
            return self

        return queue

    def execute_command(self, *args: Any, **options: Any) -> BatchPipeline:
        self._stack.append(("execute_command", args, options))
        return self

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack, self._stack = self._stack, []
        if not stack:
            return []
        futs = [self._auto._enqueue(m, a, k) for m, a, k in stack]
        replies: list[Any] = []
        try:
            for fut in futs:
                try:
                    replies.append(await fut)
                except Exception as e:  # noqa: BLE001 - each command's error in its place
                    replies.append(e)
        except BaseException:
            for fut in futs:  # cancelled, or the connection failed: nobody reads the rest
                if not fut.done():
                    fut.cancel()
                elif not fut.cancelled():
                    fut.exception()  # retrieved: no "never retrieved" warning
            raise
        if raise_on_error:
            for x in replies:
                if isinstance(x, Exception):
                    raise x
        return replies

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stack = []

    def reset(self) -> None:
        self._stack = []

"""The multiplexed connection (:class:`_Mux`): the standalone and Sentinel path, and
each Cluster node's connection: a writer task writes the queued commands without
waiting for earlier replies, a reader task resolves each caller's future in order.
See the package docstring for the design."""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from redis import exceptions as rexc
from redis.client import EMPTY_RESPONSE, NEVER_DECODE

from .._expiry import expire_after
from ..scripts._loader import is_noscript, load_all
from .pending import (
    _CLEAN,
    _NO_EMPTY,
    _REDIRECTS,
    IDLE_RELEASE_S,
    _answer,
    _as_error,
    _backoff,
    _Pending,
    _policy_of,
)

if TYPE_CHECKING:  # annotations only: the router and the core import this module
    from .cluster import _ClusterRouter
    from .core import AutoPipeline

log = logging.getLogger("reach.autopipe")


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
        elif not self._write_now():
            self._kick_writer()

    def _write_now(self) -> bool:
        """Write the one queued command at once, in the caller's own turn, when the writer
        waits idle on a healthy connection with nothing in flight and nothing in its socket
        buffer: a lone command (a request's send, a worker's settle) then saves the writer
        task's wake-up, an event-loop turn per round trip. True when the command is dealt with
        (written, or refused before the write); False leaves it to the writer. Standalone
        and Sentinel only (a Cluster node's commands may carry redirections)."""
        w = self._wake_writer
        conn = self.conn
        if (
            w is None
            or w.done()
            or self.router is not None
            or len(self.queue) != 1
            or conn is None
            or self.broken
            or self.backoff
            or self.inflight
        ):
            return False
        writer = getattr(conn, "_writer", None)
        reader = self.reader
        if writer is None or reader is None or reader.done() or not conn.is_connected:
            return False
        transport = writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False  # the writer's drain paces a socket that is behind
        p = self.queue.popleft()
        try:
            if p.words is None:
                self._capture_words(p)
            assert p.words is not None
            chunks = conn.pack_command(*p.words)
        except Exception as e:  # noqa: BLE001 - refused before the write: its own error
            _answer(p, e)
            return True
        self._check_master()
        self.inflight.append(p)
        self._kick_reader()
        self.auto.batches += 1
        self.auto.commands += 1
        try:
            writer.writelines(chunks)
        except Exception as e:  # noqa: BLE001 - the socket failed: as a failed write
            self._broken(e)
        return True

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
                    with expire_after(IDLE_RELEASE_S if idle else None):
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
                with expire_after(limit):  # the reply's bound, one loop timer for all
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

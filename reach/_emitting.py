"""Streamed results, the worker's side: the chunks a handler emits, written in order to
its caller's reply stream while it runs (docs/concepts.md, *Streamed results*).

A handler streams by being an async generator (each value it yields is a chunk; see
:func:`streamed`) or by calling ``await ctx.emit(chunk)``. The chunks of one run are
numbered from 0 and written by one :class:`ChunkWriter`: chunks emitted while a write is
under way wait and go together in the next *chunk entry* (a reply with status ``chunk``,
``seq`` the number of its first chunk, ``result`` the msgpack array of its chunks;
docs/protocol.md, *Chunk*), so a slow producer's chunk goes out at once and a fast one's
go many to a round trip, with no timer. One write at a time, each awaited before the
next, so the entries reach the stream in order; the runtime waits for the last one
before it settles the message, so the final reply comes after every chunk.

Each entry is also kept in the message's kept-chunks stream (``lua/keep_chunks.lua``, in
the slot of its idempotency record), so that the stream can be resumed from any process
(:mod:`reach.resume`), bounded by :class:`KeepBounds`: by a task of its own, beside the
writes, every entry written since its last call in one call, the calls at least
:data:`KEEP_INTERVAL_S` apart (a slow producer's one-chunk entries share a call); the run
waits for the last one before it settles, as for its last write.

A chunk is not part of the atomic settle: a chunk written by a run that later fails, or
by a worker killed mid-stream, stays written. A redelivered message runs again from the
start and numbers its chunks from 0 again; the caller drops the numbers it has seen
(:mod:`reach._chunks`), so it gets each number once.

A write Redis refuses because it is away or full (a restart, a failover, ``maxmemory``)
is tried again, every :data:`RETRY_FIRST_S` doubling to :data:`RETRY_MAX_S`, until it
goes through or the message's deadline passes; the chunks emitted meanwhile wait with it
(``emit`` waits past :data:`MAX_PENDING_CHUNKS`). The handler runs on, and its outcome is
held as any outcome Redis refuses (reach/_worker/settlement.py): failing the run for it
would run the handler again, on another agent when there is one. A write resent after
its answer was lost repeats chunk numbers the caller already has, which it drops. The
same holds for keeping the chunks for a resume (``keep_chunks.lua``): a keep refused is
tried again, and one resent keeps each chunk number once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
from redis import exceptions as rexc

from .connection import AnyRedis
from .envelope import CHUNK, Envelope, Reply, encode, encode_payload, now_ms
from .errors import ReachError, RedisUnavailable
from .keys import Keys
from .scripts.codes import StreamBound
from .scripts.keeping import keep_call
from .signing import sign_reply_for
from .tasks import TASK_TTL_MS

if TYPE_CHECKING:
    from .context import Context

REPLIES = int(StreamBound.REPLIES)

KEEP_CHUNKS = 10_000
"""Default of ``RuntimeOptions.stream_keep_chunks``: the newest chunks kept per message."""
KEEP_BYTES = 8 * 1024 * 1024
"""Default of ``RuntimeOptions.stream_keep_bytes``: the newest entries' bytes kept per
message."""
KEEP_S = 3600.0
"""Default of ``RuntimeOptions.stream_keep_s``: how long the kept chunks stay after the
latest was written."""


@dataclass(frozen=True, slots=True)
class KeepBounds:
    """How much of a streamed message's output is kept for a resume: at most ``chunks``
    chunks and ``bytes`` bytes of entries (the oldest go first), for ``seconds`` after the
    latest write. ``chunks`` 0: nothing is kept."""

    chunks: int = KEEP_CHUNKS
    bytes: int = KEEP_BYTES
    seconds: float = KEEP_S


MAX_ENTRY_CHUNKS = 256
"""At most this many chunks in one chunk entry."""
MAX_ENTRY_BYTES = 256 * 1024
"""A chunk entry stops taking chunks once it holds this many bytes of them."""
KEEP_INTERVAL_S = 0.1
"""A run's ``keep_chunks.lua`` calls start at least this far apart: the entries written
meanwhile go in the next call (a resume sees a chunk this much later at most; the run's
end keeps what waits at once)."""
KEEP_CALL_ENTRIES = 256
"""At most this many entries per ``keep_chunks.lua`` call."""
MAX_PENDING_CHUNKS = 4096
"""Chunks emitted and not written yet past which ``emit`` waits for the writes (a handler
producing faster than Redis takes them is slowed down, not buffered without bound)."""
RETRY_FIRST_S = 0.1
"""First pause before a chunk write Redis refused (away or full) is tried again."""
RETRY_MAX_S = 2.0
"""The pause doubles up to this."""

_AWAY = (
    rexc.ConnectionError,  # BusyLoadingError too: a restarted Redis loading its data
    rexc.TimeoutError,
    rexc.OutOfMemoryError,
    rexc.ReadOnlyError,  # a failover: the old master's connection
    OSError,
)
"""What a write meets while Redis is away or full, not a fault of the write itself."""


class ChunkWriter:
    """The chunks of one run of the handler of ``env``, written by agent ``agent_id`` to
    the reply stream of ``env.reply_to`` through ``redis`` (nothing is written when the
    message has no ``reply_to``: the chunks are only counted)."""

    def __init__(
        self,
        redis: AnyRedis,
        keys: Keys,
        env: Envelope,
        agent_id: str,
        *,
        record: str = "",
        keep: KeepBounds | None = None,
    ) -> None:
        self.redis = redis
        self.namespace = keys.namespace
        self.stream = keys.replies(env.reply_to) if env.reply_to else ""
        # record: the message's idempotency record ("": none, nothing is kept); the kept
        # chunks go to the stream in its slot, whatever reply_to is (a send() is resumable).
        self.record = record if keep is not None and keep.chunks > 0 else ""
        self.kept = keys.kept_chunks(env.key) if self.record else ""
        self.keep = keep or KeepBounds()
        # Past a bound whole entries go, the oldest first: entries of at most a quarter of
        # each bound keep three quarters of it at least (the defaults leave them as they are).
        self.entry_chunks, self.entry_bytes = MAX_ENTRY_CHUNKS, MAX_ENTRY_BYTES
        if self.kept:
            self.entry_chunks = min(MAX_ENTRY_CHUNKS, max(1, self.keep.chunks // 4))
            self.entry_bytes = min(MAX_ENTRY_BYTES, max(1, self.keep.bytes // 4))
        self.msg_id = env.msg_id
        self.attempt = env.attempt
        self.deadline_ms = env.deadline_ms
        self.agent_id = agent_id
        self.emitted = 0
        """Chunks emitted so far (the next chunk's number)."""
        self.written = 0
        """Chunks written to the reply stream so far."""
        self._pending: list[msgspec.Raw] = []
        self._task: asyncio.Task[None] | None = None
        # Entries written and not kept yet (seq, chunks, bytes), and the task keeping them.
        self._to_keep: list[tuple[int, int, bytes]] = []
        self._keep_task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._expire = True  # the first write also gives the reply stream its TTL

    async def emit(self, chunk: Any) -> None:
        """Queue ``chunk`` for the caller: written at once if no write is under way, else
        with the chunks emitted meanwhile right after it. Raises
        :class:`~reach.errors.ConfigError` for a chunk that cannot be encoded,
        :class:`~reach.errors.RedisUnavailable` once a write of an earlier chunk failed for
        good (refused for itself, or Redis away or full up to the deadline: the run fails
        and is retried, its chunks are then sent again, and the caller drops those it has),
        :class:`~reach.errors.ReachError` after the handler returned."""
        if self._closed:
            raise ReachError(
                f"ctx.emit() after the handler of msg {self.msg_id} returned: emit chunks "
                "before returning (its final reply closed the stream)."
            )
        raw = encode_payload(chunk)
        if self._error is not None:
            raise self._failed()
        self.emitted += 1
        if not self.stream and not self.kept:
            return
        self._pending.append(raw)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write_all())
            # One turn for the writer to issue this chunk's write now: a producer that does
            # not wait between chunks would otherwise hold its first chunk back.
            await asyncio.sleep(0)
        elif len(self._pending) >= MAX_PENDING_CHUNKS:
            await self._wait_writes()
        if len(self._to_keep) >= MAX_PENDING_CHUNKS and self._keep_task is not None:
            await asyncio.wait({self._keep_task})  # keeping lags far behind: wait for it

    async def _write_all(self) -> None:
        """Write the pending chunks, an entry at a time, until none is left."""
        try:
            while self._pending:
                take, size = 0, 0
                for raw in self._pending:
                    if take >= self.entry_chunks or (take and size + len(raw) > self.entry_bytes):
                        break
                    take += 1
                    size += len(raw)
                batch = self._pending[:take]
                reply = Reply(
                    msg_id=self.msg_id,
                    status=CHUNK,
                    result=msgspec.Raw(encode(batch)),
                    agent_id=self.agent_id,
                    attempt=self.attempt,
                    seq=self.written,
                )
                data = sign_reply_for(self.namespace, self.agent_id, reply)
                if self.kept:
                    self._to_keep.append((self.written, take, data))
                    if self._keep_task is None:
                        self._keep_task = asyncio.get_running_loop().create_task(self._keep_all())
                if self.stream:
                    await self._write(data)
                del self._pending[:take]
                self.written += take
        except Exception as e:  # noqa: BLE001 - kept for the handler: its run fails with it
            self._error = e
            self._pending.clear()
        finally:
            self._task = None

    async def _keep_all(self) -> None:
        """Keep the entries written since the last keep, one ``keep_chunks.lua`` call for
        all of them (up to :data:`KEEP_CALL_ENTRIES`), until none is left; after a call,
        the next waits :data:`KEEP_INTERVAL_S` from its start (unless the run is ending),
        so that a slow producer's entries, one chunk each, share a call."""
        loop = asyncio.get_running_loop()
        keep = self.keep
        try:
            while self._to_keep:
                batch = self._to_keep[:KEEP_CALL_ENTRIES]
                t0 = loop.time()
                call = keep_call(
                    self.record,
                    self.kept,
                    batch,
                    max_chunks=keep.chunks,
                    max_bytes=keep.bytes,
                    keep_ms=max(1, int(keep.seconds * 1000)),
                )
                await self._retrying(partial(call.run, self.redis))
                del self._to_keep[: len(batch)]
                wait = KEEP_INTERVAL_S - (loop.time() - t0)
                if wait > 0 and not self._closed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._hurry.wait(), wait)
        except Exception as e:  # noqa: BLE001 - kept for the handler: its run fails with it
            self._error = e
            self._to_keep.clear()
        finally:
            self._keep_task = None

    async def _write(self, data: bytes) -> None:
        """One chunk entry to the caller's reply stream."""

        async def add() -> None:
            # Bounded as settle bounds the stream's replies (StreamBound.REPLIES).
            xadd = self.redis.xadd(self.stream, {"r": data}, maxlen=REPLIES, approximate=True)
            if self._expire:
                await asyncio.gather(xadd, self.redis.pexpire(self.stream, TASK_TTL_MS))
                self._expire = False
            else:
                await xadd

        await self._retrying(add)

    async def _retrying(self, write: Callable[[], Awaitable[Any]]) -> None:
        """``write()``, tried again while Redis is away or full, up to the deadline (a
        refused chunk or keep must not fail the run: its retry would run the handler again)."""
        pause_s = RETRY_FIRST_S
        while True:
            try:
                await write()
                return
            except _AWAY:
                if self.deadline_ms and now_ms() + pause_s * 1000 >= self.deadline_ms:
                    raise  # the run ends at its deadline anyway
                await asyncio.sleep(pause_s)
                pause_s = min(RETRY_MAX_S, pause_s * 2)

    async def _wait_writes(self) -> None:
        """Wait for the writer; cancelled, stop it too (nothing waits for its chunks)."""
        task = self._task
        if task is None:
            return
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise

    def _failed(self) -> RedisUnavailable:
        err = RedisUnavailable(
            f"writing the chunks of msg {self.msg_id} to its caller failed ({self._error}); "
            "the run fails and is retried when attempts remain."
        )
        err.__cause__ = self._error
        return err

    async def close(self) -> None:
        """Wait until every chunk emitted is written (later ``emit`` calls raise); raises
        :class:`~reach.errors.RedisUnavailable` when a write failed."""
        self._closed = True
        self._hurry.set()  # what waits to be kept goes now
        while self._task is not None:
            await self._wait_writes()
        while self._keep_task is not None:  # the writer hands entries to keep: it ends first
            await asyncio.wait({self._keep_task})
        if self._error is not None:
            raise self._failed()

    async def finish(self, err: BaseException | None) -> BaseException | None:
        """The end of the run: every chunk written before its outcome is settled. Returns
        the run's error: ``err`` (the handler's own) if any, else the error of a failed
        write (the run then fails: a caller must not get a final result whose chunks were
        lost), else None."""
        try:
            await self.close()
        except RedisUnavailable as e:
            return err if err is not None else e
        return err


def streamed(
    gen_fn: Callable[[Any, Context], AsyncIterator[Any]],
) -> Callable[[Any, Context], Awaitable[Any]]:
    """An async-generator handler as a coroutine handler: each value yielded is emitted as
    a chunk, and the final result is ``ctx.result`` (None unless the handler set it)."""

    async def run(payload: Any, ctx: Context) -> Any:
        gen = gen_fn(payload, ctx)
        async with contextlib.aclosing(gen):  # type: ignore[type-var]
            async for chunk in gen:
                await ctx.emit(chunk)
        return ctx.result

    run.__name__ = getattr(gen_fn, "__name__", "handler")
    run.__qualname__ = getattr(gen_fn, "__qualname__", run.__name__)
    run.__doc__ = gen_fn.__doc__
    return run

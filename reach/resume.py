"""Resuming a stream: a streamed message's chunks read again, from any process, after a
given chunk (:meth:`reach.Client.resume`; docs/concepts.md, *Resuming a stream*).

The worker keeps each chunk entry it writes in the message's kept-chunks stream too
(``lua/keep_chunks.lua``, in the slot of the message's idempotency record), bounded in
chunks, bytes and time; the record counts the chunks kept (``chunks``, the number of the
last one, from 1) and the oldest still held (``chunks_from``). Chunk ``k`` is the ``k``-th
chunk of the stream: the first is 1, and a caller that has seen ``n`` chunks resumes with
``after=n``.

A resume subscribes to the record's change channel and marks the record watched (as
:mod:`reach.watch` does), so ``keep_chunks.lua`` announces every entry kept from then on
and the scripts that end the task announce its end. Then, in a loop: read the record's
status and counts in one ``HMGET`` (one moment: a record whose status is final has every
chunk there will be, since ``keep_chunks.lua`` keeps nothing once it is), hand out the
kept chunks past the last one handed out (``XREAD`` of the kept stream from the entry id
``<n>-<max>``: an entry's id is ``<its last chunk>-<its first new chunk>``), and when
there are none and the task is not over, wait for the channel. A channel lost is
subscribed again and the record read again; nothing is missed, since the reads, not the
channel's messages, say what is there.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Self

import msgspec
from redis import exceptions as rexc

from ._chunks import ChunkSink
from ._replies import outcome_of
from .connection import AnyRedis, as_text
from .envelope import BadEnvelope, Reply, decode_reply
from .errors import Cancelled, ChunksNotKept, ConfigError, DeadlineExceeded, RemoteError
from .outcomes import Status
from .scripts.watching import watch_call
from .tasks import get_status
from .untrusted import safe_int, safe_text
from .watch import ENDS, READ_S, _Channel, _open

if TYPE_CHECKING:
    from .client import Client

READ_ENTRIES = 64
"""Kept entries read at once (each up to 256 chunks)."""
LAST_OF_ID = 18446744073709551615
"""The largest sequence part of a stream id: ``<n>-<this>`` is past every entry whose last
chunk is ``n``."""
_NOT_YET = object()


class Resumed:
    """The chunks of a streamed message after chunk ``after``, then its final result; see
    :meth:`reach.Client.resume`. ``async for chunk in resumed`` yields chunk ``after + 1``,
    ``after + 2``, ... each once, in order, and ends when the task ended (then
    :attr:`result` holds its final result, or the loop raised its error after the last
    chunk). :attr:`seq` is the number of the chunk last handed out."""

    def __init__(
        self, client: Client, msg_id: str, *, after: int = 0, timeout_s: float | None = None
    ) -> None:
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ConfigError(
                f"resume after= must be a chunk number >= 0 (0: from the first chunk), "
                f"got {after!r}."
            )
        if timeout_s is not None and not (
            isinstance(timeout_s, (int, float))
            and not isinstance(timeout_s, bool)
            and timeout_s > 0
        ):
            raise ConfigError(
                f"resume timeout_s must be a number > 0 (or None), got {timeout_s!r}."
            )
        self._client = client
        self.msg_id = msg_id
        self.after = after
        self.seq = after
        """The number of the chunk last handed out (``after`` before the first)."""
        self._timeout_s = timeout_s
        self._end: float | None = None
        self._sink = ChunkSink()
        self._sink.next_seq = after  # chunk k is the one its run numbers k - 1
        self._record = ""
        self._kept = ""
        self._channel: _Channel | None = None
        self._opened = False
        self._skipped: tuple[int, int] | None = None  # the last entry read that gave nothing
        self._done = False
        self._result: Any = _NOT_YET

    @property
    def result(self) -> Any:
        """The final result, once the iteration ended; :class:`LookupError` before."""
        if self._result is _NOT_YET:
            raise LookupError(
                f"the resumed stream of msg {self.msg_id} has no final result yet: iterate "
                "it to the end first (async for chunk in resumed: ...)."
            )
        return self._result

    def __aiter__(self) -> Self:
        return self

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop reading (the connection this resume subscribes with is closed)."""
        self._done = True
        if self._channel is not None:
            await self._channel.close()

    async def __anext__(self) -> Any:
        chunks = self._sink.chunks
        while True:
            if chunks:
                self.seq += 1
                return chunks.popleft()
            if self._done:
                raise StopAsyncIteration
            try:
                await self._fill()
            except BaseException:
                await self.aclose()
                raise

    async def _fill(self) -> None:
        """Take the next kept chunks into the sink, or end (``_done``, the final outcome
        set or raised), waiting for the channel while neither is there."""
        client = self._client
        commands: AnyRedis = client.commands
        if not self._opened:
            await self._open(commands)
        assert self._channel is not None
        while True:
            status, done, chunks, first = await commands.hmget(
                self._record, "status", "done", "chunks", "chunks_from"
            )
            if status is None and done is None:
                raise ChunksNotKept(
                    f"No task {self.msg_id} (never sent, or its record expired): there is no "
                    "stream to resume.",
                    msg_id=self.msg_id,
                    after=self.after,
                )
            kept = safe_int(chunks)
            have = self._sink.next_seq
            if kept > have:
                self._check_kept(have, safe_int(first) or 1)
                if await self._read(commands, have):
                    return
                continue
            if done == b"1" or safe_text(status) in ENDS:
                self._done = True
                await self._finish()
                return
            await self._wait()

    async def _open(self, commands: AnyRedis) -> None:
        client, keys = self._client, self._client.keys
        if self._timeout_s is not None:
            self._end = time.monotonic() + self._timeout_s
        pointer = await commands.get(keys.task(self.msg_id))
        key = as_text(pointer) if pointer else self.msg_id
        self._record = keys.idem(key)
        self._kept = keys.kept_chunks(key)
        self._channel = _Channel(client.commands.redis, keys.task_changes(key))
        self._opened = True
        await self._subscribe(commands)

    async def _subscribe(self, commands: AnyRedis) -> None:
        assert self._channel is not None
        await _open(self._channel, self._end)
        # Marked watched once subscribed: each entry kept from now on is announced to us.
        await watch_call(self._record).run(commands)

    def _check_kept(self, have: int, first: int) -> None:
        """Raise :class:`ChunksNotKept` when chunk ``have + 1`` is no longer held."""
        if first > have + 1:
            raise ChunksNotKept(
                f"Chunks {have + 1}..{first - 1} of msg {self.msg_id} are no longer kept "
                f"(the oldest kept is {first}): a stream keeps its newest chunks only, within "
                "the worker's stream_keep_chunks / stream_keep_bytes. Resume with "
                f"after={first - 1} or later to read what is kept.",
                msg_id=self.msg_id,
                after=have,
                first=first,
            )

    async def _read(self, commands: AnyRedis, have: int) -> bool:
        """Read the kept entries past chunk ``have`` (and past those read already that gave
        nothing: unsigned or unreadable, never read twice); True when chunks came."""
        start = (have, LAST_OF_ID)
        if self._skipped is not None and self._skipped > start:
            start = self._skipped
        res = await commands.xread({self._kept: f"{start[0]}-{start[1]}"}, count=READ_ENTRIES)
        entries = [e for _, es in res or () for e in es]
        if not entries:
            # The record counts chunks the stream no longer has: it expired (keep_s).
            raise ChunksNotKept(
                f"The chunks of msg {self.msg_id} after {have} are no longer kept (they "
                "expired: the worker keeps them stream_keep_s after the latest).",
                msg_id=self.msg_id,
                after=have,
            )
        sink = self._sink
        signer = self._client.signer
        for entry_id, fields in entries:
            data = fields.get(b"r") or fields.get("r")
            try:
                reply: Reply = decode_reply(data)
            except (BadEnvelope, msgspec.DecodeError, msgspec.ValidationError, TypeError):
                continue  # not an entry reach wrote: never handed out
            if signer is not None and signer.check_reply(reply) is not None:
                continue  # unsigned or forged: as the reply reader drops it
            before = sink.dropped
            sink.add(reply)
            if sink.dropped != before:  # it starts past what we have: trimmed meanwhile
                first = safe_int(safe_text(entry_id).rpartition("-")[2])
                self._check_kept(sink.next_seq, max(first, sink.next_seq + 2))
        if not sink.chunks:
            last, _, first_new = safe_text(entries[-1][0]).partition("-")
            self._skipped = (safe_int(last), safe_int(first_new))
        return bool(sink.chunks)

    async def _wait(self) -> None:
        """Wait for a message on the record's channel (a chunk kept, a status), or for
        :data:`reach.watch.READ_S`; a lost channel is subscribed again."""
        assert self._channel is not None
        wait = READ_S if self._end is None else min(READ_S, self._end - time.monotonic())
        if wait <= 0:
            raise DeadlineExceeded(
                f"Msg {self.msg_id}'s stream did not end within the resume's timeout_s="
                f"{self._timeout_s}: resume again with after={self.seq} to go on."
            )
        try:
            await self._channel.read(wait)
        except (rexc.ConnectionError, rexc.TimeoutError):
            await self._channel.close()
            await self._subscribe(self._client.commands)

    async def _finish(self) -> None:
        """The task ended: its final result as :attr:`result`, or its error raised."""
        client = self._client
        st = await get_status(client.commands, client.keys, self.msg_id)
        capability = st.capability or "message"
        reply = st.reply
        if reply is not None and (
            client.signer is None or client.signer.check_reply(reply) is None
        ):
            self._result = outcome_of(
                capability, self.msg_id, msgspec.structs.replace(reply, msg_id=self.msg_id)
            )
            return
        if st.status == Status.CANCELLED:
            raise Cancelled(f"{capability!r} (msg {self.msg_id}) was cancelled: {st.error}")
        if st.status == Status.EXPIRED:
            raise DeadlineExceeded(
                f"{capability!r} (msg {self.msg_id}) passed its deadline: {st.error}"
            )
        if st.status == Status.SUCCEEDED:
            raise RemoteError(
                f"The stored result of msg {self.msg_id} is missing or its signature does not "
                "verify with this client's keys.",
                type="Unauthenticated",
                retryable=False,
            )
        raise RemoteError(
            st.error or f"msg {self.msg_id} ended {st.status}",
            type=st.error_type or "Error",
            retryable=False,
        )

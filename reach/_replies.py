"""The caller's reply stream: one background reader for every waiting call of a client.

A :class:`~reach.client.Client` owns one :class:`ReplyReader`. A call registers the
message it waits for (:meth:`ReplyReader.expect`), the reader task reads the client's reply
stream (``XREAD BLOCK``) and wakes that call, and the call takes its reply
(:meth:`ReplyReader.wait`). A reply to a message this client sent (:meth:`ReplyReader.sent`)
that no call waits for yet is kept, bounded, for ``Client.result``; a reply to a message it
never sent (an earlier run's, or written by someone else) is dropped and counted
(:attr:`ReplyReader.strays`); replies read and answered or dropped are deleted from the
stream in batches.

The reader knows nothing of the client: it is given the reply stream's key and the
connections to read it with, and it is called, never calls back.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
from redis import exceptions as rexc

from . import logs
from ._autopipe import AutoPipeline
from ._blocking import HeldReads, stream_reply
from ._chunks import ChunkSink
from ._expiry import expire_after
from .callpath import path_of
from .connection import AnyRedis
from .envelope import CHUNK, Envelope, Reply, decode_payload, decode_reply, now_ms
from .errors import (
    Cancelled,
    DeadlineExceeded,
    Forbidden,
    GuardRefused,
    HopLimitExceeded,
    LoopDetected,
    Rejected,
    RemoteError,
)
from .guards import rule_of
from .outcomes import DeadReason, Status, is_rejection, is_retryable
from .signing import Signer

# The client's logger: the reader's lines are the client's (operators filter on it).
log = logging.getLogger("reach.client")

_RETRY_MIN_S, _RETRY_MAX_S = 0.1, 1.0  # the reader's pause after a failed read
_BLOCK_MS = 1000  # the blocking read's wait: a quiet stream answers nil after it
_READ_SLACK_S = 10.0  # past the wait, a reply that never comes is a dead connection
# Entries per read: up to READ_COUNT, fewer while entries are large (chunk entries hold up
# to 256 KiB: 500 of them made one reply of 128 MB, held several times over while decoded),
# so that one read brings about READ_BYTES.
READ_COUNT, READ_MIN_COUNT, READ_BYTES = 500, 4, 4 * 1024 * 1024
_DROP_LOG_EVERY_S = 60.0
_DONE_KEPT = 10_000  # msg_ids of calls over, so a late duplicate reply is dropped
_SENT_KEPT = 100_000  # msg_ids sent with a reply wanted and not answered yet, newest kept


class ReplyReader:
    """Read one client's reply stream ``key`` and hand each reply to the call waiting on it.

    ``client_id`` names the client in log lines. A reply to a message this client sent
    (:meth:`sent`) that no call waits for is kept for ``unclaimed_ttl_s`` seconds, at most
    ``max_unclaimed`` of them, oldest dropped first (a dropped one is deleted from the
    stream). A reply to a message it never sent is dropped at once, deleted from the stream
    and counted in :attr:`strays`: memory is never spent on replies nobody here asked for
    (``Client.result`` of an earlier run's message reads its task record). With a ``verifier`` (the client's secret), a
    reply that is unsigned or whose signature does not verify is dropped (deleted from the
    stream) and counted in :attr:`forged`, never handed to a call. A chunk entry (status
    ``chunk``: a streamed call's output) goes to the :class:`~reach._chunks.ChunkSink` of
    its call in :attr:`streams`, verified alike; with no sink (a ``request()`` of a
    streaming handler) it is dropped. :meth:`start` starts the reader task once;
    until then nothing is read.
    """

    def __init__(
        self,
        key: str,
        *,
        client_id: str,
        max_unclaimed: int,
        unclaimed_ttl_s: float,
        verifier: Signer | None = None,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        self.key = key
        self.client_id = client_id
        self.max_unclaimed = max_unclaimed
        self.unclaimed_ttl_s = unclaimed_ttl_s
        self.events: dict[str, anyio.Event] = {}  # msg_id -> set when its reply is read
        self.streams: dict[str, ChunkSink] = {}  # msg_id -> its chunks (Client.stream)
        self.replies: dict[str, Reply] = {}
        # msg_id -> (when read, entry id) of the replies in `replies` that no call waited
        # for, oldest first: bounded by max_unclaimed and unclaimed_ttl_s.
        self.unclaimed: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self.answered: list[Any] = []  # reply entries read and answered, to delete
        self.done: OrderedDict[str, None] = OrderedDict()
        # msg_ids sent by this client with a reply wanted, not answered yet (bounded).
        self.sent_ids: OrderedDict[str, None] = OrderedDict()
        self.strays = 0  # replies dropped: for a message this client never sent
        self._strays_logged = 0
        self._strays_logged_at = -_DROP_LOG_EVERY_S
        self.last_id: Any = "0"
        self.outage = logs.OutageLog(log, f"client {client_id}: reading its replies")
        self.started = False
        self.last_failed_at = -1e18  # time.monotonic() of the last failed read
        self._dropped = 0  # unclaimed replies dropped since the last line about it
        self._dropped_logged = 0.0
        self._redis: AnyRedis | None = None
        self._held: HeldReads | None = None  # the blocking reads' own connection
        self._commands: AutoPipeline | None = None
        self._quiet = False  # the last read returned nothing
        self._count = READ_COUNT  # entries asked for by the next read
        self.verifier = verifier
        # Told the reason of each reply dropped unread ('unauthenticated', 'not_sent'):
        # the client counts them in its metrics.
        self.on_drop = on_drop
        self.forged = 0  # replies dropped: unsigned or forged (with a verifier only)
        self._forged_logged = 0  # self.forged at the last line about them
        self._forged_logged_at = -_DROP_LOG_EVERY_S

    def start(self, tg: anyio.abc.TaskGroup, *, redis: AnyRedis, commands: AutoPipeline) -> None:
        """Start the reader task in ``tg`` (once; later calls do nothing): it reads with
        ``redis`` (the blocking read) and deletes answered replies through ``commands``."""
        if self.started:
            return
        self.started = True
        self._redis, self._commands = redis, commands
        self._held = HeldReads(redis)
        tg.start_soon(self.run)

    async def run(self) -> None:
        """Read the reply stream and wake the waiting calls, until cancelled.

        Never stops on an error: Redis away, a reply stream that is not a stream, an entry
        that does not decode -- each is logged (an outage as a few lines, see
        :class:`reach.logs.OutageLog`) and the reader goes on. Answered replies are deleted
        in batches (every 64, or when the stream went quiet), not one round trip per reply.
        """
        delay = _RETRY_MIN_S
        try:
            while True:
                try:
                    await self.read_batch()
                except Exception as e:  # noqa: BLE001 - the reader must outlive any error
                    self.outage.failed(e)
                    self.last_failed_at = time.monotonic()
                    await anyio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX_S)
                else:
                    delay = _RETRY_MIN_S
        finally:
            if self._held is not None:
                await self._held.aclose()

    async def read_batch(self) -> None:
        assert self._redis is not None, "start() first"
        delete = self.answered
        # Deleted 64 at a time, or once the stream went quiet (a read that waited its whole
        # block): never a round trip between a reply and the next read.
        if delete and (len(delete) >= 64 or self._quiet):
            await self.delete_answered()
        held = self._held
        if held is not None and held.usable:  # read on a connection of its own (reach._blocking)
            res = stream_reply(
                await held.call(
                    "XREAD",
                    "COUNT",
                    self._count,
                    "BLOCK",
                    _BLOCK_MS,
                    "STREAMS",
                    self.key,
                    self.last_id,
                    timeout_s=_BLOCK_MS / 1000 + _READ_SLACK_S,
                )
            )
        else:
            res = await self._redis.xread(
                {self.key: self.last_id}, block=_BLOCK_MS, count=self._count
            )
        self._quiet = not res
        self.outage.ok()
        now = time.monotonic()
        size = 0
        for _, entries in res or ():
            for entry_id, fields in entries:
                self.last_id = entry_id
                size += sum(len(v) for v in fields.values() if isinstance(v, bytes))
                try:
                    self._on_reply(entry_id, fields, now)
                except Exception as e:  # noqa: BLE001 - one bad entry is dropped alone
                    log.warning("unreadable reply entry %r dropped: %s", entry_id, e)
                    delete.append(entry_id)
        if size > READ_BYTES:
            self._count = max(READ_MIN_COUNT, self._count * READ_BYTES // size)
        elif self._count < READ_COUNT:
            self._count = min(READ_COUNT, self._count * 2)
        self._expire_unclaimed(now)
        if res:
            # The calls just woken return before the next read is sent (packing and writing
            # it came first otherwise: ~0.1 ms more on each lone request's reply).
            await anyio.lowlevel.checkpoint()

    def _on_reply(self, entry_id: Any, fields: Any, now: float) -> None:
        data = fields.get(b"r") or fields.get("r")
        reply = decode_reply(data)
        if self.verifier is not None:
            why = self.verifier.check_reply(reply)
            if why is not None:
                self._forged_reply(reply, why, now)
                self.answered.append(entry_id)  # deleted: no call may ever take it
                return
        msg_id = reply.msg_id
        if reply.status == CHUNK:  # a streamed call's chunks; nobody else takes them
            self.answered.append(entry_id)
            sink = self.streams.get(msg_id)
            if sink is not None:
                sink.add(reply)
            return
        if msg_id in self.done:
            self.answered.append(entry_id)  # a duplicate of an answered call
            return
        ev = self.events.get(msg_id)
        if ev is None and msg_id not in self.sent_ids:
            self._stray_reply(reply, now)
            self.answered.append(entry_id)  # deleted: nobody here will ever take it
            return
        self.replies[msg_id] = reply
        if ev is not None:
            ev.set()
            if self.streams:
                sink = self.streams.get(msg_id)
                if sink is not None:
                    sink.wake()
            self.answered.append(entry_id)
            return
        old = self.unclaimed.pop(msg_id, None)
        if old is not None:
            self.answered.append(old[1])  # a duplicate: the latest copy is kept
        self.unclaimed[msg_id] = (now, entry_id)

    def _forged_reply(self, reply: Reply, why: str, now: float) -> None:
        """Count a reply dropped for its signature; one log line a minute at most (a
        flood of forged replies must not flood the log)."""
        self.forged += 1
        if self.on_drop is not None:
            self.on_drop("unauthenticated")
        if now - self._forged_logged_at < _DROP_LOG_EVERY_S:
            return
        log.warning(
            "client %s: dropped %d unauthenticated replies (latest: msg %s from agent %r, "
            "%s); only replies signed with this client's secret are taken",
            self.client_id,
            self.forged - self._forged_logged,
            reply.msg_id[:64],
            reply.agent_id[:64],
            why,
        )
        self._forged_logged, self._forged_logged_at = self.forged, now

    def _stray_reply(self, reply: Reply, now: float) -> None:
        """Count a reply to a message this client never sent (or forgot: it sent more than
        ``_SENT_KEPT`` unanswered); one log line a minute at most."""
        self.strays += 1
        if self.on_drop is not None:
            self.on_drop("not_sent")
        if now - self._strays_logged_at < _DROP_LOG_EVERY_S:
            return
        log.info(
            "client %s: dropped %d replies to messages this client did not send (latest: "
            "msg %s from agent %r); `reach task <msg_id>` has the outcome of any message",
            self.client_id,
            self.strays - self._strays_logged,
            reply.msg_id[:64],
            reply.agent_id[:64],
        )
        self._strays_logged, self._strays_logged_at = self.strays, now

    def _expire_unclaimed(self, now: float) -> None:
        """Drop (and delete from the stream) unclaimed replies past the count or age bound."""
        unclaimed, cutoff = self.unclaimed, now - self.unclaimed_ttl_s
        dropped = 0
        while unclaimed:
            msg_id, (seen, entry_id) = next(iter(unclaimed.items()))
            if len(unclaimed) <= self.max_unclaimed and seen > cutoff:
                break
            del unclaimed[msg_id]
            self.replies.pop(msg_id, None)
            self.answered.append(entry_id)
            dropped += 1
        if not dropped:
            return
        self._dropped += dropped
        if now - self._dropped_logged >= _DROP_LOG_EVERY_S:
            log.warning(
                "client %s: dropped %d replies no call waited for (kept: at most %d, for "
                "%.0f s; `reach task <msg_id>` still has their outcome)",
                self.client_id,
                self._dropped,
                self.max_unclaimed,
                self.unclaimed_ttl_s,
            )
            self._dropped, self._dropped_logged = 0, now

    async def delete_answered(self) -> None:
        """Delete the answered replies from the stream (nothing to do before :meth:`start`)."""
        if self._commands is None:
            return
        ids, self.answered[:] = list(self.answered), []
        for i in range(0, len(ids), 1000):
            try:  # answered replies: if Redis is away, the stream's TTL removes them
                await self._commands.xdel(self.key, *ids[i : i + 1000])
            except (rexc.RedisError, OSError) as e:
                self.outage.failed(e)
                return

    def failed_since(self, t: float) -> bool:
        """A read failed (Redis away, ...) at or after ``time.monotonic()`` ``t``."""
        return self.last_failed_at >= t

    # -- the waiting calls --------------------------------------------------------------
    def sent(self, msg_id: str) -> None:
        """This client sent ``msg_id`` wanting a reply: a reply read before anyone waits for
        it is kept (for ``Client.result``), not dropped as a stray."""
        ids = self.sent_ids
        ids[msg_id] = None
        if len(ids) > _SENT_KEPT:
            ids.popitem(last=False)

    def expect(self, msg_id: str) -> anyio.Event:
        """Register a call waiting for the reply of ``msg_id``; its event is set when read."""
        ev = self.events[msg_id] = anyio.Event()
        return ev

    async def wait(self, env: Envelope, ev: anyio.Event) -> Reply:
        """The reply of ``env`` (``ev`` from :meth:`expect`), waited for until a little past
        its deadline; raises :class:`DeadlineExceeded` when none came."""
        if env.msg_id in self.replies:
            return self.take(env.msg_id)
        timeout = (env.deadline_ms - now_ms()) / 1000 if env.deadline_ms else None
        # A little grace past the deadline, so the worker's own deadline reply can arrive.
        # (expire_after: a limit per waiting call without a timer of its own.)
        try:
            with expire_after(None if timeout is None else max(timeout, 0) + 0.5):
                await ev.wait()
        except TimeoutError:
            raise DeadlineExceeded(
                f"No result for {env.capability!r} (msg {env.msg_id}) before its deadline; "
                f"see `reach task {env.msg_id}` for where it is."
            ) from None
        return self.take(env.msg_id)

    def take(self, msg_id: str) -> Reply:
        """The reply read for ``msg_id`` (it must be in :attr:`replies`): the call is over."""
        reply = self.replies.pop(msg_id)
        self.sent_ids.pop(msg_id, None)
        unclaimed = self.unclaimed.pop(msg_id, None)
        if unclaimed is not None:
            self.answered.append(unclaimed[1])  # answered now: delete it from the stream
        self._mark_done(msg_id)
        return reply

    def forget(self, msg_id: str) -> None:
        """The call of ``msg_id`` is over, answered or not: no longer waited for."""
        self.events.pop(msg_id, None)
        self.sent_ids.pop(msg_id, None)
        self.streams.pop(msg_id, None)
        if msg_id not in self.done:
            # Gave up (deadline, cancelled, not delivered): a late reply is dropped, not
            # kept in memory (nor in the reply stream) for a call nobody waits on.
            self.replies.pop(msg_id, None)
            self._mark_done(msg_id)

    def _mark_done(self, msg_id: str) -> None:
        self.done[msg_id] = None
        while len(self.done) > _DONE_KEPT:
            self.done.popitem(last=False)


def outcome_of(capability: str, msg_id: str, reply: Reply) -> Any:
    """The result a reply carries, or the error it stands for raised (what
    ``Client.request`` returns or raises for it)."""
    if reply.status == Status.SUCCEEDED:
        return decode_payload(reply.result)
    if reply.status == Status.EXPIRED:
        raise DeadlineExceeded(f"{capability!r} (msg {msg_id}) passed its deadline: {reply.error}")
    if reply.reason == DeadReason.CANCELLED:
        raise Cancelled(f"{capability!r} (msg {msg_id}) was cancelled: {reply.error}")
    if reply.reason == DeadReason.HOP_LIMIT:
        raise HopLimitExceeded(reply.error, path=path_of(reply.error))
    if reply.reason == DeadReason.LOOP:
        raise LoopDetected(reply.error, path=path_of(reply.error))
    if reply.reason == DeadReason.REFUSED_BY_GUARD:
        raise GuardRefused(reply.error, rule=rule_of(reply.error))
    if reply.reason == DeadReason.FORBIDDEN:
        raise Forbidden(f"{capability!r} refused this caller: {reply.error}")
    if reply.status == Status.DEAD and is_rejection(reply.reason):
        raise Rejected(f"{capability!r} was rejected: {reply.error}", reason=reply.reason)
    raise RemoteError(
        reply.error or "handler failed",
        type=reply.error_type or "Error",
        retryable=is_retryable(reply.reason),
    )


class ReplyFigures:
    """What a :class:`~reach.client.Client` shows of its reply reader (``_reader``): the
    replies it dropped and the bounds on the unclaimed ones it keeps."""

    _reader: ReplyReader

    @property
    def forged_replies(self) -> int:
        """Replies dropped because they were unsigned or their signature did not verify
        (only a client with a secret checks)."""
        return self._reader.forged

    @property
    def stray_replies(self) -> int:
        """Replies dropped because this client never sent their message (or sent more
        than 100,000 unanswered since): an earlier run's, or written by someone else.
        ``result()`` of such a message reads its task record instead."""
        return self._reader.strays

    @property
    def max_unclaimed_replies(self) -> int:
        return self._reader.max_unclaimed

    @max_unclaimed_replies.setter
    def max_unclaimed_replies(self, n: int) -> None:
        self._reader.max_unclaimed = n

    @property
    def unclaimed_reply_ttl_s(self) -> float:
        return self._reader.unclaimed_ttl_s

    @unclaimed_reply_ttl_s.setter
    def unclaimed_reply_ttl_s(self, seconds: float) -> None:
        self._reader.unclaimed_ttl_s = seconds

    @property
    def _last_reply_id(self) -> Any:
        return self._reader.last_id

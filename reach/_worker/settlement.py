"""Settling: writing each entry's outcome to Redis, in batches, then acking it.

An entry is settled in this order, so a crash between any two steps is safe: the fenced
completion of its idempotency key (written only if this worker's claim still holds;
refused = *fenced*, nothing else is written), then its reply, its dead letter or delayed
retry, and last ``XACK`` + ``XDEL`` of the inbox entry.

The writing is :func:`reach.scripts.delivery.settle`'s (one ``settle.lua`` call per batch
on standalone Redis, pipelined ``complete.lua`` calls and the rest on a Cluster): this
module queues entries, hands them over as they are (they read as
:class:`~reach.scripts.delivery.SettleItem` s), and reports what became of each. An entry
whose settling is refused for its data (a key of the wrong type) is dead-lettered as it was
read instead, so only the entry at fault is.

A batch Redis does not take (away, restarting, failing over, full) is kept: it goes back
to the front of the queue and is tried again with a backoff (:data:`RETRY_FIRST_S`
doubling to :data:`RETRY_MAX_S`) until it settles. Its entries stay held meanwhile, so the
pending scan passes them over and a copy of one of their keys waits (parked) as it would
while the handler runs: a handler whose work is done is not run again because Redis was
away when it ended. At most :data:`HOLD_MAX` outcomes are kept so; past that the oldest
are let go (left pending, to run again or replay), with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

import anyio
from redis import exceptions as rexc

from .._expiry import expire_after
from ..connection import as_text
from ..envelope import Envelope
from ..outcomes import Settled
from ..scripts import SettleCode, delivery
from ..scripts.delivery import SettleItem, SettleLike
from ..tasks import TASK_TTL_MS
from .auditing import CallAudit
from .items import Delivery, Settleable
from .letters import DeadLetters
from .recording import RecentIndex
from .state import Part, Shared

log = logging.getLogger("reach.runtime")

RETRY_FIRST_S = 0.1
"""After a batch Redis refused, the wait before it is tried again (doubled each time)."""
RETRY_MAX_S = 2.0
"""The longest wait between two tries of a refused batch."""
HOLD_MAX = 10_000
"""The most outcomes a worker keeps while Redis refuses them (a long outage): past this,
the oldest are let go, left pending as they were read (they run again, or replay a stored
result, once Redis is back), so that an outage cannot grow a worker without bound."""


class Settlement(Part):
    """The queue of entries waiting to be settled, and the settler that flushes it."""

    def __init__(self, shared: Shared, *, letters: DeadLetters) -> None:
        super().__init__(shared)
        self.letters = letters
        self._queue: list[Settleable] = []
        self._flushing = 0  # flushes under way
        self._writing = 0  # entries in those flushes
        self._wake = anyio.Event()
        # Whether _wake is set, or about to be (queue()'s wake-up on its way): read per
        # queued outcome without the event's two calls.
        self._woken = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the worker's, at first use
        # When the settler's wait ends (time.monotonic(); -inf while it is awake), and
        # whether it was woken only to wait again for index rows held since it slept.
        self._sleep_until = -math.inf
        self._rearm = False
        self._flushed = anyio.Event()  # set as each flush ends (what settle_rest waits on)
        self._retry_at: float | None = None  # a refused batch waits to be tried again
        self._backoff_s = RETRY_FIRST_S
        self.let_go = 0  # outcomes let go past HOLD_MAX (their messages run again)
        self._retried: set[Settleable] = set()  # queued again after a refused try
        self.index = RecentIndex(self.keys, self.agent_id, self.opts.recent_maxlen)
        self.audit = CallAudit(shared)  # calls of capabilities marked audited=True

    def kick(self) -> None:
        """Wake the settler if anything waits."""
        if self._queue:
            self._wake_up()

    def _wake_up(self) -> None:
        self._woken = True  # (a wake-up queue() deferred may be on its way: set it now)
        if not self._wake.is_set():
            self._wake.set()

    def _wake_if_queued(self) -> None:
        """queue()'s wake-up, one turn of the event loop later: the settler is woken if
        anything is still queued. A handler that settles its lone outcome itself (the
        pool's ``alone`` flush) has taken it off the queue by then, and the settler sleeps
        on rather than waking to an empty queue (a task switch and an empty flush per
        lone request)."""
        if self._queue:
            self._wake.set()
        elif not self._wake.is_set():
            self._woken = False

    def _index_due(self) -> None:
        """A flush the settler did not make (a handler's lone one) may have held index rows
        the sleeping settler does not know of: it is woken to wait for them instead (it
        writes them once due, if no batch takes them first)."""
        due = self.index.due_in()
        if due is not None and time.monotonic() + due < self._sleep_until - 0.001:
            self._rearm = True
            if not self._wake.is_set():
                self._wake.set()

    def _new_wake(self) -> None:
        self._wake, self._woken = anyio.Event(), False

    async def run(self) -> None:
        """The settler task: flush whatever was queued since the last flush."""
        while True:
            wait_s = self.index.due_in()  # held index rows: until due
            if self._retry_at is not None:
                retry_s = max(0.0, self._retry_at - time.monotonic())
                wait_s = retry_s if wait_s is None else min(wait_s, retry_s)
            # (expire_after: no cancel scope nor timer of its own per wake-up; a flush per
            # batch of outcomes waits here)
            self._sleep_until = math.inf if wait_s is None else time.monotonic() + wait_s
            with contextlib.suppress(TimeoutError), expire_after(wait_s):
                await self._wake.wait()
            self._sleep_until = -math.inf  # awake: the next wait is reckoned anew
            if self._rearm:
                self._rearm = False
                if not self._woken and self._retry_at is None:
                    # woken only to wait for index rows another flush held since
                    self._wake = anyio.Event()
                    continue
            if self._retry_at is not None:
                # Redis refused the last batch: what came since waits with it for the
                # retry (each try against an absent Redis costs a connect or a timeout).
                self._new_wake()
                if time.monotonic() >= self._retry_at:
                    await self.flush()
                continue
            if not self._woken:  # no batch to ride on: the index rows alone
                await self.index.flush(self.redis)
                continue
            self._new_wake()
            await self.flush()

    @property
    def alone(self) -> bool:
        """One entry waits and no flush is under way: nothing to batch it with, so a
        handler settles it now (:meth:`flush`), one event-loop turn sooner than the
        settler (a lone request's latency). A property, not an async method: asked after
        every handler, it costs no coroutine."""
        return not self._flushing and len(self._queue) == 1 and self._retry_at is None

    @property
    def pending(self) -> int:
        """Outcomes queued or being written: not settled yet."""
        return len(self._queue) + self._writing

    async def settle_rest(self, *, retry_s: float) -> int:
        """At the end of a drain: settle everything still queued and wait for the flushes
        already under way (each has taken its batch off the queue: returning before they
        end would let the worker leave with those outcomes unwritten). A batch that Redis
        refuses (restarting, failing over, full) is tried again, with the settler's
        backoff, for up to ``retry_s``. Returns how many outcomes are still unsettled
        then: they are let go, left pending (the message runs again or replays)."""
        with anyio.move_on_after(retry_s):
            while self._queue or self._flushing:
                if self._queue:
                    if self._retry_at is not None:
                        await anyio.sleep(max(0.0, self._retry_at - time.monotonic()))
                    await self.flush()
                    continue
                ev = self._flushed = anyio.Event()
                await ev.wait()
            # the index of recent messages: a view, flushed with the last outcomes
            with anyio.CancelScope(shield=True):
                await self.index.flush(self.redis)
        left = self.pending
        if self._queue:  # given up: left pending, as they were read
            batch, self._queue = self._queue, []
            self.state.release(batch)
            self._retried.difference_update(batch)
        return left

    async def flush(self) -> bool:
        """Settle what is queued now; False when Redis refused the batch (it is queued
        again, to be tried after the backoff). Shielded from cancellation: a settle cut
        halfway would leave an outcome computed and never written (the handler's work
        lost, the message run again), and the worker's stop cancels its tasks. Redis
        replies within the client's ``socket_timeout``, so this ends."""
        self.hooks.flush_handled()  # the metrics of these runs count before their replies go
        batch, self._queue = self._queue, []
        if not batch:
            self._retry_at = None  # nothing is left to try again (settled or let go)
            return True
        self._flushing += 1
        self._writing += len(batch)
        kept = False
        try:
            with anyio.CancelScope(shield=True):
                await self._settle(batch)
        except (rexc.RedisError, OSError) as e:
            # Not its data (delivery.settle dead-letters an entry refused for that): Redis
            # is away or full. Keep the outcomes, held, and try again after the backoff.
            self.outages.failed(f"settling {len(batch)} entries", e)
            self._queue[:0] = batch
            self._retried.update(batch)
            kept = True
            # Bounded while Redis refuses (counted here, not as outcomes come: those that
            # come as Redis is back are settled with the next try, not let go).
            if len(self._queue) > HOLD_MAX:
                self._let_go(len(self._queue) - HOLD_MAX)
            self._retry_at = time.monotonic() + self._backoff_s
            self._backoff_s = min(RETRY_MAX_S, self._backoff_s * 2)
            self._wake_up()  # the settler sleeps until the retry is due
            return False
        finally:
            self._flushing -= 1
            self._writing -= len(batch)
            if not kept:
                self.state.release(batch)
                self._retried.difference_update(batch)
            self._flushed.set()
            self._index_due()
        self._retry_at = None
        self._backoff_s = RETRY_FIRST_S
        return True

    def queue(self, it: Settleable) -> None:
        """Hand ``it`` over: its outcome is on its way to Redis."""
        it.queued = True
        self._queue.append(it)
        if not self._woken:  # once per batch: _woken stays set until the settler wakes
            self._woken = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._wake_if_queued)

    def retry_now(self) -> None:
        """Redis answers again (the consumer's reads work): a batch it refused is tried
        now rather than at the end of its backoff."""
        if self._retry_at is not None:
            self._retry_at = time.monotonic()
            self._wake_up()

    def _let_go(self, n: int) -> None:
        """Past :data:`HOLD_MAX` held outcomes (Redis refusing them for long): let the
        oldest ``n`` go, left pending as they were read, for the pending scan to redo
        once Redis is back (they run again, or replay a result that was stored)."""
        batch, self._queue = self._queue[:n], self._queue[n:]
        self.state.release(batch)
        self._retried.difference_update(batch)
        self.state.rescan = True
        self.let_go += n
        for it in batch:
            if isinstance(it, Delivery):
                self.hooks.on_outcome_dropped(it.env)
        log.warning(
            "%d outcomes let go unsettled: Redis refuses them and this worker keeps at "
            "most %d (%d let go so far); their messages stay pending and run again, or "
            "replay a stored result, once Redis is back",
            n,
            HOLD_MAX,
            self.let_go,
        )

    async def _settle(self, batch: list[Settleable]) -> None:
        def refused(i: int, _item: SettleLike, e: Exception) -> SettleItem:
            # Its record, reply stream or inbox holds a key of the wrong type (written
            # behind reach's back) or it is a bug: dead-letter the entry as it was read,
            # ack it, and never retry it.
            it = batch[i]
            self.letters.poison(it, e, "settling it", tell_caller=False)
            return settle_item(it)

        results = await delivery.settle(
            self.redis,
            batch,  # settled as they are (SettleLike): no copy per entry
            cluster=self.cluster,
            ttl_ms=TASK_TTL_MS,
            on_refused=refused,
            on_round_trip=self.hooks.on_round_trip,
            recent=self.index.take(batch),
        )
        settled: list[tuple[Envelope | None, str, str]] = []  # after_settle's, once per batch
        written: list[Settleable] | None = [] if self.audit.capabilities else None
        for it, res in zip(batch, results, strict=True):
            if res is SettleCode.SETTLED:
                settled.append(_settled_row(it))
                if written is not None:  # what the audit trail may record
                    written.append(it)
            elif res is SettleCode.FENCED and it in self._retried and await self._applied(it):
                settled.append(_settled_row(it))  # an earlier try was written, its answer lost
                if written is not None:
                    written.append(it)
            elif res is SettleCode.FENCED and isinstance(it, Delivery):
                self.hooks.on_fenced(it.env)
                log.warning(
                    "late completion of %s refused: another owner took it over", it.env.msg_id
                )
            elif isinstance(res, Exception) and self.cluster and isinstance(it, Delivery):
                # Its completion failed (a Redis error, not its data): it stays pending.
                log.warning("complete failed for %s: %s", it.env.msg_id, res)
            # Otherwise (standalone) it was refused even as a dead letter: delivery.settle
            # logged, acked and deleted it.
        self.hooks.after_settle_many(settled)
        if written:
            await self.audit.write(written)

    async def _applied(self, it: Settleable) -> bool:
        """Whether an earlier try of settling ``it`` was written after all (Redis ran the
        script, and the connection broke or timed out before its answer came): its
        record then holds this claim's fence, completed (no owner). Another owner's
        takeover or a cancel would have raised the fence."""
        if not isinstance(it, Delivery) or not it.fence:
            return False
        try:
            fence, owner = await self.redis.hmget(it.idem, ["fence", "owner"])
        except (rexc.RedisError, OSError):
            return False  # reported as fenced: the safe side (nothing more is written)
        return fence is not None and as_text(fence) == str(it.fence) and not owner


def _settled_row(it: Settleable) -> tuple[Envelope | None, str, str]:
    """What ``after_settle`` says of ``it``: (its envelope, outcome, reason)."""
    env = it.env if isinstance(it, Delivery) else None
    return env, it.outcome or Settled.ACKED, it.reason


def settle_item(it: Settleable) -> SettleItem:
    """What settling ``it`` writes, for :func:`reach.scripts.delivery.settle`."""
    if isinstance(it, Delivery):
        return SettleItem(
            inbox=it.stream,
            entry_id=it.entry_id,
            completion=it.complete,
            reply=it.reply,
            reply_stream=it.reply_key,
            follow_up=it.follow_up,
        )
    return SettleItem(inbox=it.stream, entry_id=it.entry_id, follow_up=it.follow_up)

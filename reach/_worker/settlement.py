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
"""

from __future__ import annotations

import logging

import anyio
from redis import exceptions as rexc

from ..outcomes import Settled
from ..scripts import SettleCode, delivery
from ..scripts.delivery import SettleItem, SettleLike
from ..tasks import TASK_TTL_MS
from .items import Delivery, Settleable
from .letters import DeadLetters
from .recording import RecentIndex
from .state import Part, Shared

log = logging.getLogger("reach.runtime")


class Settlement(Part):
    """The queue of entries waiting to be settled, and the settler that flushes it."""

    def __init__(self, shared: Shared, *, letters: DeadLetters) -> None:
        super().__init__(shared)
        self.letters = letters
        self._queue: list[Settleable] = []
        self._flushing = 0  # flushes under way
        self._wake = anyio.Event()
        self.index = RecentIndex(self.keys, self.agent_id, self.opts.recent_maxlen)

    def queue(self, it: Settleable) -> None:
        """Hand ``it`` over: its outcome is on its way to Redis."""
        it.queued = True
        self._queue.append(it)
        self._wake.set()

    def kick(self) -> None:
        """Wake the settler if anything waits."""
        if self._queue:
            self._wake.set()

    async def run(self) -> None:
        """The settler task: flush whatever was queued since the last flush."""
        while True:
            with anyio.move_on_after(self.index.due_in()):  # held index rows: until due
                await self._wake.wait()
            if not self._wake.is_set():  # no batch to ride on: the index rows alone
                await self.index.flush(self.redis)
                continue
            self._wake = anyio.Event()
            await self.flush()

    async def flush_if_alone(self) -> None:
        """Settle now when one entry waits and no flush is under way: nothing to batch it
        with, and one event-loop turn sooner than the settler (a lone request's latency)."""
        if not self._flushing and len(self._queue) == 1:
            await self.flush()

    async def settle_rest(self) -> None:
        """At the end of a drain: settle everything still queued (errors raise)."""
        while self._queue:
            batch, self._queue = self._queue, []
            await self._settle(batch)
        await self.index.flush(self.redis)

    async def flush(self) -> None:
        batch, self._queue = self._queue, []
        if not batch:
            return
        self._flushing += 1
        try:
            await self._settle(batch)
        except (rexc.RedisError, OSError) as e:
            # Entries stay pending: the next pending scan redoes them, and claim finds
            # the ones whose completion was stored (replay, not run again).
            self.outages.failed(f"settling {len(batch)} entries", e)
            self.state.rescan = True
        finally:
            self._flushing -= 1
            self.state.release(batch)

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
        for it, res in zip(batch, results, strict=True):
            if res is SettleCode.SETTLED:
                self._settled(it)
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

    def _settled(self, it: Settleable) -> None:
        env = it.env if isinstance(it, Delivery) else None
        self.hooks.after_settle(env, it.outcome or Settled.ACKED, it.reason)


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

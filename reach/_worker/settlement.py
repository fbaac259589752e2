"""Settling: writing each entry's outcome to Redis, in batches, then acking it.

An entry is settled in this order, so a crash between any two steps is safe: the fenced
completion of its idempotency key (``complete``: written only if this worker's claim
still holds; refused = *fenced*, nothing else is written), then its reply, its dead
letter or delayed retry, and last ``XACK`` + ``XDEL`` of the inbox entry.

On standalone Redis a whole batch is one ``settle.lua`` call (one round trip); on a
Cluster the completions are pipelined (one slot each), then the rest. A batch that
settle.lua refuses (a key of the wrong type) is settled one entry at a time, so only the
entry at fault is dead-lettered.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from redis import exceptions as rexc

from .. import scripts
from ..connection import AnyRedis
from ..keys import GROUP
from ..tasks import TASK_TTL_MS
from .batching import per_key
from .hookchain import HookChain
from .items import Delivery, Settleable
from .letters import DeadLetters
from .state import Outages, WorkerState

log = logging.getLogger("reach.runtime")


class Settlement:
    """The queue of entries waiting to be settled, and the settler that flushes it."""

    def __init__(
        self,
        *,
        state: WorkerState,
        redis: AnyRedis,
        cluster: bool,
        letters: DeadLetters,
        hooks: HookChain,
        outages: Outages,
    ) -> None:
        self.state = state
        self.redis = redis
        self.cluster = cluster
        self.letters = letters
        self.hooks = hooks
        self.outages = outages
        self._queue: list[Settleable] = []
        self._flushing = 0  # flushes under way
        self._wake = anyio.Event()

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
            await self._wake.wait()
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

    async def flush(self) -> None:
        batch, self._queue = self._queue, []
        if not batch:
            return
        self._flushing += 1
        try:
            try:
                await self._settle(batch)
            except rexc.ResponseError as e:
                if self.cluster or not scripts.is_data_error(e):
                    raise
                await self._settle_one_by_one(batch, e)
        except (rexc.RedisError, OSError) as e:
            # Entries stay pending: the next pending scan redoes them, and claim finds
            # the ones whose completion was stored (replay, not run again).
            self.outages.failed(f"settling {len(batch)} entries", e)
            self.state.rescan = True
        finally:
            self._flushing -= 1
            self.state.release(batch)

    async def _settle_one_by_one(self, batch: list[Settleable], first: Exception) -> None:
        """settle.lua refused a batch: a key of the wrong type (someone wrote over a reply
        stream, say) or a bug. Settle each item alone so the others go through; an item
        refused on its own is dead-lettered as it was read, acked, and never retried."""
        log.warning("settling a batch of %d failed (%s): settling one by one", len(batch), first)
        for it in batch:
            try:
                await self._settle_atomic([it])
                continue
            except rexc.ResponseError as e:
                if not scripts.is_data_error(e):
                    raise
                self.letters.poison(it, e, "settling it", tell_caller=False)
            try:
                await self._settle_atomic([it])
            except rexc.ResponseError as e:  # not even a dead letter: drop the entry
                if not scripts.is_data_error(e):
                    raise
                log.error(
                    "entry %r of %s dropped: it cannot be settled (%s)", it.entry_id, it.stream, e
                )
                await scripts.run_pipeline(
                    self.redis,
                    [("XACK", it.stream, GROUP, it.entry_id), ("XDEL", it.stream, it.entry_id)],
                )

    async def _settle(self, batch: list[Settleable]) -> None:
        if self.cluster:
            await self._settle_pipelined(batch)
        else:
            await self._settle_atomic(batch)

    def _settled(self, it: Settleable) -> None:
        env = it.env if isinstance(it, Delivery) else None
        self.hooks.after_settle(env, it.outcome or "acked", it.reason)

    def _fenced(self, it: Delivery) -> None:
        self.hooks.on_fenced(it.env)
        log.warning("late completion of %s refused: another owner took it over", it.env.msg_id)

    async def _settle_atomic(self, batch: list[Settleable]) -> None:
        """Standalone Redis: the whole batch in one settle.lua call (one round trip)."""
        keys: list[str] = []
        index: dict[str, int] = {}

        def ki(key: str) -> int:
            i = index.get(key)
            if i is None:
                keys.append(key)
                i = index[key] = len(keys)
            return i

        args: list[Any] = [TASK_TTL_MS, GROUP, len(batch)]
        for it in batch:
            d = it if isinstance(it, Delivery) else None
            reply = d.reply if d is not None else b""
            c = d.complete if d is not None else None
            if c is not None:
                args += [ki(c.key), c.fence, c.status, reply, c.mode, c.error]
            else:
                args += [0, "", "", reply, "", ""]
            args += [
                ki(d.reply_key) if d is not None and d.reply_key else 0,
                ki(it.stream),
                it.entry_id,
                len(it.ops),
            ]
            for name, key, *rest in it.ops:
                args += [name, ki(key), len(rest), *rest]
        self.hooks.on_round_trip("settle")
        res = await scripts.call(self.redis, "settle", keys, args)
        for it, code in zip(batch, res, strict=True):
            if int(code) == 0 and isinstance(it, Delivery):
                self._fenced(it)
            else:
                self._settled(it)

    async def _settle_pipelined(self, batch: list[Settleable]) -> None:
        """Cluster: fenced completes (one slot each), then replies, dead letters and acks."""
        completing = [
            (d, d.complete) for d in batch if isinstance(d, Delivery) and d.complete is not None
        ]
        ok = {id(it) for it in batch} - {id(d) for d, _ in completing}
        if completing:
            self.hooks.on_round_trip("complete")
            res = await per_key(
                self.redis,
                self.cluster,
                "complete",
                [c.key for _, c in completing],
                [TASK_TTL_MS],
                [
                    [c.fence, c.status, d.reply if c.mode == "done" else "", c.mode, c.error]
                    for d, c in completing
                ],
            )
            for (d, _), r in zip(completing, res, strict=True):
                if scripts.is_data_error(r):  # its record is of the wrong type: dead letter and ack
                    self.letters.poison(d, r, "settling it", tell_caller=False)
                    ok.add(id(d))
                elif isinstance(r, BaseException):
                    log.warning("complete failed for %s: %s", d.env.msg_id, r)
                elif int(r) == 1:
                    ok.add(id(d))
                else:
                    self._fenced(d)
        ops: list[tuple[Any, ...]] = []
        for it in batch:
            if id(it) in ok:
                if isinstance(it, Delivery) and it.reply_key:
                    ops += [
                        ("XADD", it.reply_key, "*", "r", it.reply),
                        ("PEXPIRE", it.reply_key, TASK_TTL_MS),
                    ]
                ops += it.ops
        acks: dict[str, list[Any]] = {}
        for it in batch:
            if id(it) in ok:
                acks.setdefault(it.stream, []).append(it.entry_id)
        for stream, ids in acks.items():  # acks last: after replies, dead letters, retries
            ops += [("XACK", stream, GROUP, *ids), ("XDEL", stream, *ids)]
        if ops:
            self.hooks.on_round_trip("settle")
            res = await scripts.run_pipeline(self.redis, ops)
            errs = [r for r in res if isinstance(r, Exception)]
            if errs:
                log.warning("%d settle commands failed, first: %s", len(errs), errs[0])
        for it in batch:
            if id(it) in ok:
                self._settled(it)

"""The consumer: reads the agent's inbox and hands each entry on.

Each turn it reads at most as many entries as there are free handler slots, plus the
``prefetch`` while handlers are quick (read ahead: claimed entries wait for a slot in the
handler pool's queue, so the next batch's read and claim overlap the running handlers).
After a read that drained the inbox, a blocking ``XREADGROUP`` (one round trip per message for
an idle agent); while there is a backlog, ``fetch.lua``, which reads highest priority
first and keeps a few slots for lower priorities so they do not starve. Every
``pending_scan_s`` (and after a failed Redis call) it looks for entries this agent_id
read but never settled - after a crash, say - and redoes them.

Entries are decoded here: a message goes to execution.py, an entry that is no message
is dead-lettered and acked through settlement.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from redis import exceptions as rexc

from .._blocking import HeldReads, stream_pairs
from ..connection import AnyRedis, as_text
from ..envelope import BadEnvelope, Envelope, decode_envelope, now_ms
from ..keys import GROUP
from ..outcomes import DeadReason, Settled
from ..scripts import delivery
from ..signing import worker as worker_signing
from .execution import Execution
from .items import AckOnly, Delivery
from .letters import DeadLetters
from .settlement import Settlement
from .state import Part, Shared

log = logging.getLogger("reach.runtime")

STARVE_AFTER = 8  # small-batch fetches serving higher priorities before one slot is kept
BLOCK_SLACK_S = 10.0
"""Past the blocking read's wait, a reply that never comes is a dead connection."""
READ_AHEAD_WAIT_S = 0.05
"""The longest a read-ahead entry should wait for a handler slot, by the handlers' recent
mean run time; slower handlers turn read-ahead off (their claims would wait too long)."""


async def create_groups(redis: AnyRedis, inboxes: list[str]) -> None:
    """Create the consumer group on each inbox stream (and the stream), if missing."""
    for key in inboxes:
        try:
            await redis.xgroup_create(key, GROUP, id="0", mkstream=True)
        except rexc.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise


def create_groups_sync(r: Any, inboxes: list[str]) -> None:
    """:func:`create_groups` on a synchronous client (the heartbeat thread's)."""
    for key in inboxes:
        try:
            r.xgroup_create(key, GROUP, id="0", mkstream=True)
        except rexc.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise


CLAIM_MIN_LEASE_MS = 1000
"""A claim made at send is taken as it is while this much of its lease is left by this
host's clock (the least lease a runtime's own claim gets); with less, the entry is claimed
as usual."""


def entry_claim(fields: Any) -> tuple[bytes, int] | None:
    """The claim send.lua made at send, as the entry carries it: (owner, lease_until ms),
    or None when the entry has none or it is not well formed (read as untrusted)."""
    if isinstance(fields, list):
        if len(fields) == 2:
            return None  # just 'e': what almost every entry is
        fields = dict(zip(fields[::2], fields[1::2], strict=False))
    if not isinstance(fields, dict):
        return None
    owner, until = fields.get(b"c"), fields.get(b"l")
    if not isinstance(owner, bytes) or not isinstance(until, bytes):
        return None
    if not (0 < len(until) <= 16 and until.isdigit()):
        return None
    return owner, int(until)


def entry_data(fields: Any) -> bytes | None:
    """The ``e`` field of an inbox entry as read (a dict from redis-py, a flat list from
    fetch.lua); None when there is no such field or it is not bytes."""
    if isinstance(fields, list):
        if len(fields) == 2 and fields[0] == b"e":  # what reach writes: the one field
            data = fields[1]
            return data if isinstance(data, bytes) else None
        fields = dict(zip(fields[::2], fields[1::2], strict=False))
    if not isinstance(fields, dict):
        return None
    data = fields.get(b"e") or fields.get("e")
    return data if isinstance(data, bytes) else None


def entry_fields(fields: Any) -> tuple[bytes | None, tuple[bytes, int] | None]:
    """:func:`entry_data` and :func:`entry_claim` of one entry in one look at its fields
    (the consumer's hot path: a flat list from fetch.lua is read in place, not copied
    into a dict)."""
    if isinstance(fields, list):
        n = len(fields)
        if n == 2 and fields[0] == b"e":  # what reach writes without a claim: one field
            data = fields[1]
            return (data if isinstance(data, bytes) else None), None
        if n == 6 and fields[0] == b"e" and fields[2] == b"c" and fields[4] == b"l":
            # what send.lua writes with a claim made at send
            data, owner, until = fields[1], fields[3], fields[5]
            if not isinstance(data, bytes):
                data = None
            if not isinstance(owner, bytes) or not isinstance(until, bytes):
                return data, None
            if not (0 < len(until) <= 16 and until.isdigit()):
                return data, None
            return data, (owner, int(until))
    return entry_data(fields), entry_claim(fields)


def _count(got: list[tuple[str, list[Any]]]) -> int:
    return sum(len(entries) for _, entries in got)


class Consumer(Part):
    """Reads the inbox of one agent_id (its consumer name in the group) until stopped."""

    def __init__(
        self, shared: Shared, *, execution: Execution, settlement: Settlement, letters: DeadLetters
    ) -> None:
        super().__init__(shared)
        self.name = self.agent_id
        self.inboxes = self.keys.inboxes(self.agent_id)
        self.execution = execution
        self.settlement = settlement
        self.letters = letters
        self._passed_over = {"normal": 0, "low": 0}
        # The blocking read's own connection (reach._blocking): an idle agent's message
        # is read on it without a pool round or redis-py's reply conversion.
        self._held = HeldReads(self.redis)

    async def run(self) -> None:
        """Read and dispatch until the worker is stopping. Never dies: Redis errors and
        bugs are logged, and what was left pending is picked up again."""
        try:
            await self._run()
        finally:
            await self._held.aclose()

    async def _run(self) -> None:
        o, st = self.opts, self.state
        next_scan = time.monotonic() + o.pending_scan_s
        backlog = True
        failed = False  # the last turn's Redis call failed
        while not st.stopping.is_set():
            st.consumer_tick = time.monotonic()
            ahead = self._read_ahead()
            free = o.concurrency + ahead - st.inflight
            # With every slot taken, read ahead in chunks (half the prefetch at least), not
            # an entry per finished handler.
            if free <= 0 or (st.inflight >= o.concurrency and free < max(1, ahead // 2)):
                await st.wait_slot()
                continue
            n = min(free, o.batch)
            try:
                if st.rescan or time.monotonic() >= next_scan:
                    st.rescan = False
                    next_scan = time.monotonic() + o.pending_scan_s
                    await self.resume_pending()
                # After a read that drained the inbox, go straight to the blocking read
                # (it returns at once when something came meanwhile): an idle agent pays
                # one round trip per message, not two. A full read means a backlog: then
                # the priority-ordered fetch.lua with its starvation guard.
                got = await self._fetch(n) if backlog else []
                if not got:
                    got = await self._block(n)
                self.outages.ok()
                if failed:  # Redis is back: what it refused meanwhile is written now
                    failed = False
                    self.settlement.retry_now()
                backlog = _count(got) >= n
                if got and st.stopping.is_set():
                    # Read as the stop came (the blocking read was under way): not started,
                    # so handed back as they are, pending (docs/operations.md, "Drain").
                    log.info("stopping: %d entries just read are left pending", _count(got))
                    break
                if got:
                    await self._dispatch(got, new=True)
                    if not backlog:
                        # The inbox is drained: the handlers just started run (and their
                        # settles go out) before the next blocking read is sent, which
                        # would otherwise come first (a lone request's latency).
                        await anyio.lowlevel.checkpoint()
            except (rexc.RedisError, OSError) as e:
                # Never let the consumer die: Redis away, restarted, failing over, or a
                # reply we did not expect. Log, back off, pick up what was left pending.
                self.outages.failed("inbox read", e)
                failed = True
                st.rescan = True
                await anyio.sleep(0.2)
            except Exception:  # a bug, not data (entries have their own barrier): go on
                log.exception("consumer loop error; retrying")
                st.rescan = True
                await anyio.sleep(0.2)

    def _read_ahead(self) -> int:
        """How many entries to read and claim beyond the free handler slots: the prefetch
        while handlers are quick, else none. A claimed entry waiting for a slot has its claim
        lease running; with ``prefetch`` queued behind ``concurrency`` slots it waits about
        ``ceil(prefetch / concurrency)`` handler run times, kept under READ_AHEAD_WAIT_S (a
        few percent of the shortest lease a claim gets, 1 s)."""
        o, h = self.opts, self.state.handler_s
        if not o.prefetch or h is None:
            return 0
        rounds = -(-o.prefetch // o.concurrency)
        return o.prefetch if h * rounds <= READ_AHEAD_WAIT_S else 0

    def _read_shares(self, n: int) -> tuple[int, int]:
        """Slots kept for normal and low in this fetch: the starvation guard.

        Large batches always keep a tenth for normal and a twentieth for low. Small ones
        (concurrency under 10) keep one slot for a priority once it had unread entries and
        was passed over by ``STARVE_AFTER`` fetches in a row.
        """
        if n >= 10:
            return max(1, n // 10), max(1, n // 20)
        return (
            1 if self._passed_over["normal"] >= STARVE_AFTER else 0,
            1 if self._passed_over["low"] >= STARVE_AFTER else 0,
        )

    async def _fetch(self, n: int) -> list[tuple[str, list[Any]]]:
        keep_n, keep_l = self._read_shares(n)
        call = delivery.fetch(
            self.keys, agent_id=self.name, n=n, keep_normal=keep_n, keep_low=keep_l
        )
        try:
            self.hooks.on_round_trip("fetch")
            res = await call.run(self.redis)
        except rexc.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            await create_groups(self.redis, self.inboxes)
            res = await call.run(self.redis)
        got = res.got
        served = {k.rsplit(":", 1)[1] for k, _ in got}
        for prio, was_waiting in (("normal", res.normal_waiting), ("low", res.low_waiting)):
            if prio in served:
                self._passed_over[prio] = 0
            elif was_waiting:
                self._passed_over[prio] += 1
        return got

    async def _block(self, n: int) -> list[tuple[str, list[Any]]]:
        self.hooks.on_round_trip("block")
        held = self._held
        # Several agents in this process share one wake-up read instead (runtime.py's
        # _AgentRedis): none holds a connection for its blocking reads then.
        alone = getattr(self.redis, "blocks_alone", True)
        if not alone:
            await held.aclose()
        try:
            if alone and held.usable:
                # Entries as fetch.lua gives them ([id, flat fields]): read in place.
                raw = await held.call(
                    "XREADGROUP",
                    "GROUP",
                    GROUP,
                    self.name,
                    "COUNT",
                    n,
                    "BLOCK",
                    self.opts.block_ms,
                    "STREAMS",
                    *self.inboxes,
                    *(">" for _ in self.inboxes),
                    timeout_s=self.opts.block_ms / 1000 + BLOCK_SLACK_S,
                )
                return [(as_text(k), entries) for k, entries in stream_pairs(raw)]
            res = await self.redis.xreadgroup(
                GROUP,
                self.name,
                {k: ">" for k in self.inboxes},
                count=n,
                block=self.opts.block_ms,
            )
        except rexc.ResponseError as e:
            # NOGROUP: the group is gone (a Redis that lost its data); UNBLOCKED: the stream
            # was deleted while we waited on it. Either way: recreate and read again.
            if "NOGROUP" not in str(e) and "UNBLOCKED" not in str(e):
                raise
            await create_groups(self.redis, self.inboxes)
            return []
        return [(as_text(k), entries) for k, entries in res or []]

    async def resume_pending(self) -> None:
        """Entries this agent_id read but never settled: after a restart (a crash), and
        every ``pending_scan_s`` or after a failed Redis call while it runs."""
        for key in self.inboxes:
            last = "0"
            while True:
                try:
                    res = await self.redis.xreadgroup(
                        GROUP, self.name, {key: last}, count=self.opts.batch
                    )
                except rexc.ResponseError as e:
                    if "NOGROUP" not in str(e):
                        raise
                    # Its inbox was dropped (a Redis that lost its data, or the sweeper
                    # dropping an evicted id's emptied inbox): nothing pending there.
                    await create_groups(self.redis, self.inboxes)
                    break
                entries = res[0][1] if res else []
                if not entries:
                    break
                last = entries[-1][0]
                # Entries this runtime holds right now are on their way; the others were
                # read and then lost (a crash, or a claim/settle that failed): redo them.
                lost = [e for e in entries if (key, as_text(e[0])) not in self.state.held]
                if not lost:
                    continue
                while self.state.inflight >= self.opts.concurrency:
                    if self.state.stopping.is_set():
                        return  # draining: they stay pending, for the next start
                    await self.state.wait_slot()
                log.info("resuming %d pending entries of %s", len(lost), key)
                await self._dispatch([(key, lost)])

    async def _dispatch(self, got: list[tuple[str, list[Any]]], *, new: bool = False) -> None:
        """Decode a batch: messages go to execution, entries that are none to settlement.
        ``new``: read as new entries (``>``), the only ones a claim made at send for this
        runtime may be taken from (a pending entry was read before: its claim is judged
        by claim.lua)."""
        items: list[Delivery] = []
        envs: list[Envelope] = []
        max_bytes = self.opts.max_envelope_bytes
        mine = self.execution.owner.encode()
        now = now_ms() if new else 0
        epoch = self.state.lost_registrations
        # Signatures are checked here, before anything runs: a claim made at send ('c'
        # and 'l' next to 'e') lets an entry skip claim.lua, never this check.
        signing = worker_signing(self.keys.namespace, self.agent_id)
        required = signing.keys if signing is not None and signing.required else None
        for stream, entries in got:
            for entry_id, fields in entries:
                self.state.held.add((stream, as_text(entry_id)))
                if not fields:
                    # Pending but deleted (the sweeper moved it while we held it): only the
                    # pending reference is left to clear.
                    self.settlement.queue(
                        AckOnly(stream=stream, entry_id=entry_id, outcome=Settled.GONE)
                    )
                    continue
                data, claim = entry_fields(fields)
                try:
                    if data is None:
                        raise BadEnvelope(DeadReason.MALFORMED, "entry has no 'e' field")
                    if len(data) > max_bytes:
                        raise BadEnvelope(
                            DeadReason.TOO_LARGE,
                            f"{len(data)} bytes, over this agent's limit of {max_bytes}",
                        )
                    env = decode_envelope(data)
                except BadEnvelope as e:
                    self.settlement.queue(self.letters.malformed(stream, entry_id, data or b"", e))
                    continue
                if required is not None:
                    why = required.check_envelope(env)
                    if why is not None:
                        self.settlement.queue(
                            self.letters.unauthenticated(stream, entry_id, data, env, why)
                        )
                        continue
                it = Delivery(stream=stream, entry_id=entry_id, env=env, raw=data, epoch=epoch)
                if new and claim is not None and claim[0] == mine:
                    it.claimed_at_send = claim[1] - now >= CLAIM_MIN_LEASE_MS
                items.append(it)
                envs.append(env)
        self.hooks.on_delivered_many(envs)  # the batch at once: per-series counts noted once
        if not items:
            self.settlement.kick()
            return
        await self.execution.take(items)

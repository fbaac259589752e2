"""Execution: claim each message's idempotency key, then run its handler, replay the
stored result, or let the copy wait for the worker that runs it.

``claim.lua`` answers for each key (pipelined for a batch): *run* (claimed, with a
fence token), *replay* (the key is done: its stored reply is sent again) or *busy*
(another claim holds it). A busy key's owner is looked up: if that owner is gone, the key
is claimed again with that owner as ``takeover_from`` (a compare-and-set on the owner,
in the claim itself); if it lives, or another owner claimed it meanwhile, this copy is
parked in the delayed set and asks again later. A claimed message runs in the handler pool under
its deadline, its claim renewed while it runs (``renew.lua``); outcome.py decides what its
result or exception means, settlement.py writes it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from redis import exceptions as rexc

from .. import logs, scripts
from .._emitting import KeepBounds
from ..client import Client
from ..context import Context
from ..envelope import MAX_ATTEMPTS, Envelope, decode_payload, encode, now_ms
from ..errors import Reject, Retry
from ..limits import LimitsCache, RateLimit, take_call
from ..outcomes import DeadReason, Outcome, Settled, Status
from ..registry import Registry
from ..scripts import ClaimCode, delivery
from ..scripts.delivery import (
    Claimed,
    ClaimItem,
    Completion,
    DeadLetter,
    Delayed,
    Mode,
    RenewItem,
    StartItem,
)
from ..scripts.inbox import CLAIM_AT_SEND_FENCE
from ..signing import sign_reply_for
from ..tasks import TASK_TTL_MS
from . import outcome as oc
from .authz import Gate
from .cancelling import Cancels, Deadlines, Run, cancelled_outcome
from .items import Delivery
from .letters import DeadLetters
from .preempting import preempted_times
from .settlement import Settlement
from .state import Part, Shared, owner_may_run
from .waiting import WaitingSlots
from .workqueue import WorkQueue

if TYPE_CHECKING:
    from ..agent import HandlerSpec

log = logging.getLogger("reach.runtime")

PREEMPTED = Outcome(
    Status.RETRYING, error="preempted by high-priority work", error_type="Preempted"
)
"""What the hooks see of a run cut for high-priority work (it is requeued, not retried)."""

MARK_RUNNING_AFTER_S = 0.01
"""A message claimed at send whose handler still runs this long after it started is
marked running (``start.lua``); quicker ones are not (their outcome follows at once)."""

RENEW_PARTS = 3
"""The claims of running handlers are renewed every ``claim_lease_s / RENEW_PARTS``
(:meth:`Execution.renew_claims`): a renewal late or lost still leaves a claim a third of
its lease."""

RENEW_MIN_S = 0.05
"""The shortest period between renewals (a claim lease of milliseconds must not make the
renewal a busy loop)."""


def _runtime_cancel(exc: BaseException) -> bool:
    """Whether ``exc`` is the runtime cancelling the task that runs a handler (a stop, a
    cut, a cancel scope of its own), which must propagate; a ``CancelledError`` a handler
    raised itself, with no cancellation of its task requested, is the handler's failure."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


@dataclass(frozen=True, slots=True)
class _Raised:
    """What a plain handler raised in its thread, brought back as a value."""

    exc: BaseException


def _in_thread(fn: Callable[[Any, Context], Any], payload: Any, ctx: Context) -> Any:
    """Run a plain handler (in a worker thread): its result, or what it raised as a
    :class:`_Raised`. A ``BaseException`` set on the future the event loop awaits does not
    come back as a plain raise: a ``GeneratorExit`` there closes the awaiting coroutines
    instead of reaching their ``except``; raised again on the loop's side, it does."""
    try:
        return fn(payload, ctx)
    except BaseException as e:  # noqa: BLE001 - the loop's side decides what it means
        return _Raised(e)


class Execution(Part):
    """Claims deliveries and runs them in a pool of ``concurrency`` handler tasks."""

    def __init__(
        self,
        shared: Shared,
        *,
        registry: Registry,
        client: Client,
        owner: str,
        settlement: Settlement,
        letters: DeadLetters,
        cancels: Cancels | None = None,
    ) -> None:
        super().__init__(shared)
        self.cancels = cancels if cancels is not None else Cancels(shared, client=client)
        self.deadlines = Deadlines()  # ends async handlers at their message's deadline
        self.registry = registry
        self.client = client
        self.owner = owner  # "agent_id/instance_id": who holds the claims made here
        o = shared.opts
        self.keep = KeepBounds(o.stream_keep_chunks, o.stream_keep_bytes, o.stream_keep_s)
        self.settlement = settlement
        self.letters = letters
        self._work = WorkQueue()
        self.waiting = WaitingSlots(self.state, self._work, limit=self.opts.max_waiting_handlers)
        self._confirming: set[asyncio.Task[None]] = set()
        # Batches started claimed at send, each with when it is due to be marked running
        # (in that order: the delay is the same for all), and the one timer for them.
        self._to_mark: collections.deque[tuple[float, list[Delivery]]] = collections.deque()
        self._mark_timer: asyncio.TimerHandle | None = None
        self._held: set[Delivery] = set()  # claimed, in the pool: their claims are renewed
        self.limits = LimitsCache()
        self.gate = Gate(self.agent, self.keys, self.control)  # refusals before a handler runs

    # -- claiming -----------------------------------------------------------------------
    async def take(self, items: list[Delivery]) -> None:
        """Claim a batch (one round trip) and act on each answer; an entry whose claim
        fails for a passing reason stays pending for the consumer's next scan. Entries
        claimed at send for this runtime start at once (:meth:`_start_claimed`). Messages
        of a rate-limited capability start only as the limit allows (:meth:`_within_limits`)."""
        items = await self._within_limits(items)
        if not items:
            return
        if any(it.claimed_at_send for it in items):
            # A key this runtime runs already (an entry read anew, its group recreated),
            # or a second entry of one key in this batch (entries are untrusted), goes the
            # claim path, where it waits as a duplicate does.
            # So does one this runtime may have lost its claim of (see _stale).
            running, keys = self.state.running, set()
            at_send = []
            for it in items:
                if it.claimed_at_send and self._stale(it):
                    it.claimed_at_send = False
                if it.claimed_at_send and it.key not in running and it.key not in keys:
                    keys.add(it.key)
                    at_send.append(it)
            if at_send:
                self._start_claimed(at_send)
                started = set(at_send)  # identity: deliveries compare by identity
                items = [it for it in items if it not in started]
                if not items:
                    return
        self.hooks.on_round_trip("claim")
        try:
            results = await self._claim(items)
        except BaseException:
            self.state.release(items)  # left pending: the next pending scan takes them up
            raise
        busy: list[Delivery] = []
        for it, res in zip(items, results, strict=True):
            if isinstance(res, Exception) and scripts.is_data_error(res):
                self._poison(it, res, "claiming it")
                continue
            if isinstance(res, Exception):
                log.warning("claim of %s failed (%s); it stays pending", it.env.msg_id, res)
                self.state.release([it])
                self.state.rescan = True
                continue
            try:
                if not self._on_claim(it, res):
                    busy.append(it)
            except Exception as e:  # noqa: BLE001 - one entry's failure is that entry's
                self._poison(it, e, "claiming it")
        for i, it in enumerate(busy):
            try:
                await self._busy(it)
            except Exception as e:  # the per-entry barrier
                if isinstance(e, (rexc.RedisError, OSError)) and not scripts.is_data_error(e):
                    self.state.release(busy[i:])  # Redis away or busy: pending, for the next scan
                    raise
                self._poison(it, e, "checking who holds its key")

    async def _claim(
        self, items: list[Delivery], *, takeover_from: str = ""
    ) -> list[Claimed | Exception]:
        """Run claim.lua for the items: one answer (or the error that refused it) per item.
        ``takeover_from``: the owner judged gone whose claim is ended (``''``: none)."""
        claims = []
        for it in items:
            if not it.idem:
                it.idem = self.keys.idem(it.key)
            claims.append(
                ClaimItem(it.idem, self._claim_lease_ms(it.env), it.env.msg_id, takeover_from)
            )
        return await delivery.claim(
            self.redis,
            claims,
            cluster=self.cluster,
            owner=self.owner,
            ttl_ms=TASK_TTL_MS,
            agent_id=self.agent_id,
            max_takeovers=self.opts.max_takeovers,
        )

    async def _within_limits(self, items: list[Delivery]) -> list[Delivery]:
        """The items the capabilities' rate limits let start now (``rate_limit.lua``, one
        call per limited capability of the batch, pipelined); each of the others waits in
        the delayed set until its turn, spaced one interval apart (its attempt is not
        counted; a message claimed at send is taken over from this runtime's own claim
        when it comes back). No limit: no Redis call."""
        own = self._own_limits()
        if own:  # this agent's own limits (rate= on its handlers) first, then everyone's
            agent_id = self.agent.agent_id
            items = await self._take_limits(
                items, own, lambda c: self.keys.agent_rate_state(c, agent_id)
            )
        limits = await self.limits.current(self.control, self.keys)
        if not limits or not items:
            return items
        return await self._take_limits(items, limits, self.keys.rate_state)

    def _own_limits(self) -> dict[str, RateLimit]:
        """The limits this agent's handlers declared (``rate=``), by capability."""
        return {
            cap: limit
            for cap, spec in self.agent.handlers.items()
            if (limit := getattr(spec, "limit", None)) is not None
        }

    async def _take_limits(
        self,
        items: list[Delivery],
        limits: dict[str, RateLimit],
        state: Callable[[str], str],
    ) -> list[Delivery]:
        """Take starts for ``items`` from ``limits`` (GCRA states named by ``state(cap)``);
        the ones over their limit wait in the delayed set (:meth:`_hold_for_limit`)."""
        by_cap: dict[str, list[Delivery]] = {}
        for it in items:
            if it.env.capability in limits:
                by_cap.setdefault(it.env.capability, []).append(it)
        if not by_cap:
            return items
        caps = list(by_cap)
        calls = [take_call(self.keys, c, limits[c], len(by_cap[c]), state=state(c)) for c in caps]
        over: set[Delivery] = set()  # identity: deliveries compare by identity
        answers = await scripts.run_calls(self.control, calls)
        for cap, taken in zip(caps, answers, strict=True):
            if isinstance(taken, Exception):
                if isinstance(taken, (rexc.ConnectionError, rexc.TimeoutError)):
                    raise taken  # Redis away: the consumer leaves the batch pending
                # A limit's state that is not ours to read: let them run, say so.
                log.warning("rate limit of %s not applied: %s", cap, taken)
                continue
            interval_ms = limits[cap].interval_us / 1000
            for j, it in enumerate(by_cap[cap][taken.granted :]):
                self._hold_for_limit(it, taken.wait_us / 1000 + j * interval_ms)
                over.add(it)
        return [it for it in items if it not in over]

    def _hold_for_limit(self, it: Delivery, delay_ms: float) -> None:
        """``it`` is over its capability's rate limit: it waits ``delay_ms`` in the delayed
        set (as a copy of the same attempt), then is routed again. A message claimed at
        send for this runtime gives its claim up (status ``retrying``, the key released),
        so whichever agent it comes back to claims it at once, not after the claim's
        lease."""
        if it.claimed_at_send:
            it.idem = it.idem or self.keys.idem(it.key)
            it.complete = Completion(
                it.idem, CLAIM_AT_SEND_FENCE, Status.RETRYING, Mode.RELEASE, "rate limited"
            )
        it.outcome = Settled.PARKED
        held = msgspec.structs.replace(it.env, holds=min(it.env.holds + 1, MAX_ATTEMPTS))
        due = now_ms() + max(1, round(delay_ms))
        it.follow_up = Delayed(self.keys.delayed, due, encode(held))
        self.settlement.queue(it)

    def _start_claimed(self, items: list[Delivery]) -> None:
        """Run deliveries send.lua claimed for this runtime (fence 1, lease left: the
        consumer checked) without a claim round trip. Those still running
        :data:`MARK_RUNNING_AFTER_S` later get their claims confirmed with ``start.lua``
        (status running, this runtime's lease): a quick handler is settled before that and
        costs no confirmation at all (its task goes from pending to its outcome, and its
        claim keeps the lease it got at send meanwhile)."""
        for it in items:
            it.idem = self.keys.idem(it.key)
            it.fence = CLAIM_AT_SEND_FENCE
            self.state.running.add(it.key)
            self._start(it)
        # One timer for every batch due (not one per batch: a lone request's worker would
        # wake for each, 10 ms after it, with nothing left to mark).
        loop = asyncio.get_running_loop()
        at = loop.time() + MARK_RUNNING_AFTER_S
        self._to_mark.append((at, items))
        if self._mark_timer is None:
            self._mark_timer = loop.call_at(at, self._mark_due, loop)

    def _mark_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The batches due: their items still running are marked so, in one call."""
        q = self._to_mark
        now = loop.time() + 0.001  # the loop runs a timer up to its clock's resolution early
        due: list[Delivery] = []
        while q and q[0][0] <= now:
            due += q.popleft()[1]
        self._mark_timer = loop.call_at(q[0][0], self._mark_due, loop) if q else None
        if due:
            self._mark_running(due)

    def _mark_running(self, items: list[Delivery]) -> None:
        starts = [
            StartItem(it.idem, self._claim_lease_ms(it.env), it.fence)
            for it in items
            if not it.queued  # not settled yet: still running (or waiting for a slot)
        ]
        if not starts:
            return
        task = asyncio.get_running_loop().create_task(self._confirm(starts))
        self._confirming.add(task)  # held until done (the loop keeps weak references)
        task.add_done_callback(self._confirming.discard)

    async def _confirm(self, starts: list[StartItem]) -> None:
        call = delivery.start_call(starts, owner=self.owner, ttl_ms=TASK_TTL_MS)
        try:
            await call.run(self.redis)
        except Exception as e:  # noqa: BLE001 - the handlers run; only the status lags
            log.warning(
                "marking %d message(s) claimed at send as running failed (%s); they run, "
                "and their task status shows 'pending' until they complete",
                len(starts),
                e,
            )

    async def renew_claims(self) -> None:
        """Keep the claims of the handlers this runtime runs (and of those waiting for a
        slot) from running out, however long they take: every third of ``claim_lease_s``
        each is extended to a claim lease from now (``renew.lua``, which leaves a claim
        that is no longer this runtime's as it is). Without it a handler that runs past its
        claim's lease has its message claimed and run again beside it by the next copy:
        a caller's resend, or the copy a newer process of this agent_id parked to wait for
        it (:meth:`_busy`). A renewal that fails is logged; the next one comes a period
        later, a third of the lease still left. A process that dies renews nothing: its
        claims run out as before."""
        period_s = max(RENEW_MIN_S, self.opts.claim_lease_s / RENEW_PARTS)
        while True:
            await anyio.sleep(period_s)
            renewals = [
                RenewItem(it.idem, self._claim_lease_ms(it.env), it.fence)
                for it in self._held
                if it.fence and it.idem and not it.queued
            ]
            if not renewals:
                continue
            if self.cluster:  # the records live in different slots: one key per call
                calls = [delivery.renew_call([x], owner=self.owner) for x in renewals]
            else:
                calls = [delivery.renew_call(renewals, owner=self.owner)]
            try:
                answers = await scripts.run_calls(self.redis, calls)
            except (rexc.RedisError, OSError) as e:
                self.outages.failed("claim renewal", e)
                continue
            for answer in answers:
                if isinstance(answer, Exception):
                    self.outages.failed("claim renewal", answer)
                    break

    def _claim_lease_ms(self, env: Envelope) -> int:
        lease = int(self.opts.claim_lease_s * 1000)
        if env.deadline_ms:
            lease = max(1000, min(lease, env.deadline_ms - now_ms() + 1000))
        return lease

    def _on_claim(self, it: Delivery, res: Claimed) -> bool:
        """Act on claim.lua's answer for one item: run it (RUN) or replay its key's stored
        reply (REPLAY). False when the key is BUSY: held by another claim."""
        if res.code is ClaimCode.RUN:
            it.fence = res.fence
            self.state.running.add(it.key)
            self._start(it)
        elif res.code is ClaimCode.REPLAY:
            self.hooks.on_replay(it.env)
            self._replay(it, res)
        elif res.code is ClaimCode.CANCELLED:
            self._finish(it, cancelled_outcome(it.env, running=False))
        elif res.code is ClaimCode.POISONED:
            log.error(
                "message %s (%s) dead-lettered poisoned: %d runs never finished",
                it.env.msg_id,
                it.env.capability,
                res.takeovers,
            )
            self._finish(it, oc.poisoned(res.takeovers, self.opts.max_takeovers))
        else:
            return False
        return True

    async def _busy(self, it: Delivery) -> None:
        """The key is claimed by another owner: take it over if that owner is gone,
        else let this copy wait (the live owner will answer; a later retry replays). An
        owner is gone when the registry no longer names it, except the live process this
        one replaced at its start (:class:`~reach._worker.state.Predecessor`), which is
        gone only once provably so."""
        rec = await self.redis.hget(it.idem or self.keys.idem(it.key), "owner")
        owner = rec.decode() if isinstance(rec, bytes) else (rec or "")
        reserved = False
        if owner == self.owner:
            # Claimed by this very runtime: a duplicate while its handler runs waits; but
            # if nothing here runs it (its claim or settle failed), take it up again. The
            # key is noted as running before the takeover's round trip: two copies judged
            # at once (a stopped process resumed finds its held copies stale) would both
            # take it over from this owner, the second from the first's fresh claim, and
            # run side by side (a chaos run saw it: fences 3 and 4 in one process).
            alive = it.key in self.state.running
            if not alive:
                self.state.running.add(it.key)
                reserved = True
        elif (pred := self.state.predecessor) is not None and owner == pred.owner:
            # The process this one replaced while it served (a rolling restart that
            # overlaps): the registry names this process now, but the older one drains
            # and finishes what it runs. Its claims stand until it is provably gone (a
            # crash restart on this host) or their lease runs out.
            alive = not pred.provably_gone()
        else:
            # Agent ids may hold '/', instance ids (hex) never: split at the last one.
            agent_id, _, instance = owner.rpartition("/")
            info = await self.registry.get(agent_id) if agent_id else None
            alive = info is not None and owner_may_run(info, instance, now_ms())
        if alive:
            self._park(it)
            return
        # Take it over, in the claim itself, only from the owner judged gone: another
        # runtime may have taken the key over since it was read, and its fresh claim
        # stands (BUSY, and this copy waits).
        try:
            res = (await self._claim([it], takeover_from=owner))[0]
            if isinstance(res, Exception):
                raise res
            ran = self._on_claim(it, res)
        except BaseException:
            if reserved:
                self.state.running.discard(it.key)
            raise
        if reserved and res.code is not ClaimCode.RUN:  # replayed, cancelled, busy: not run
            self.state.running.discard(it.key)
        if not ran:
            self._park(it)

    def _park(self, it: Delivery) -> None:
        """A live owner runs this key: this copy waits as a delayed retry, which later
        replays the stored result (or runs, if that owner failed). It polls with a growing
        backoff, not once per claim lease, which would often outlast the caller's deadline."""
        waits = min(it.env.busy_waits, 64)
        delay_s = min(self.opts.retry_max_s, self.opts.retry_base_s * 2**waits)
        delay_ms = min(self._claim_lease_ms(it.env), int(delay_s * 1000))
        # Counted on past the backoff's cap: each parked copy's bytes must differ from the
        # last one's (see Envelope.holds).
        parked = msgspec.structs.replace(
            it.env, busy_waits=min(it.env.busy_waits + 1, MAX_ATTEMPTS)
        )
        it.outcome = Settled.PARKED
        it.follow_up = Delayed(self.keys.delayed, now_ms() + delay_ms, encode(parked))
        self.settlement.queue(it)

    def _replay(self, it: Delivery, res: Claimed) -> None:
        # The stored reply, rebuilt from the record (its short form) or as stored (a record
        # of protocol version 1): the same reply, signature included, as first published.
        reply = res.stored(it.key)
        if reply.msg_id != it.env.msg_id:
            # Same idempotency key, another message: its caller waits for its own msg_id
            # (signed again when this agent signs: the msg_id is signed).
            renamed = msgspec.structs.replace(reply, msg_id=it.env.msg_id, kid="", sig=b"")
            data = sign_reply_for(self.keys.namespace, self.agent_id, renamed)
        else:
            data = encode(reply)
        it.answer(self.keys, data, publish=True)
        it.outcome = Settled.REPLAYED
        self.settlement.queue(it)

    def _poison(self, it: Delivery, exc: BaseException, doing: str) -> None:
        """The per-entry barrier: an entry whose handling raised (data no check foresaw)
        is dead-lettered as ``unprocessable`` with its bytes, its caller is told, and the
        worker goes on. Never run again: a poison entry must not loop."""
        if it.queued:  # its outcome is already on its way to Redis
            log.exception("message %s: %s failed after it was settled", it.env.msg_id, doing)
            return
        self.letters.poison(it, exc, doing, tell_caller=True)
        self.settlement.queue(it)

    # -- handling -----------------------------------------------------------------------
    def _start(self, it: Delivery) -> None:
        """Hand a claimed item to the handler pool (long-lived tasks: no spawn per message)."""
        self.state.inflight += 1
        slots = self.state.self_slots
        if slots is not None and slots.pending:  # a call of one of its own handlers
            slots.pending.discard(it.env.msg_id)
        self._held.add(it)
        self._work.put(it)

    def hand_back(self) -> int:
        """At the start of a drain: take the claimed entries no handler has started (read
        ahead, waiting for a slot) out of the pool's queue, unsettled. Their entries stay
        pending with this agent_id and their claims name this runtime: this agent_id's
        next start takes them up, or, once this runtime has deregistered, any agent the
        sweeper moves them to takes the claim over. Returns how many."""
        items = self._work.take_all()
        self._held.difference_update(items)
        if items:
            self.state.inflight -= len(items)
            self.state.release(items)
            self.state.slot_freed()
        return len(items)

    async def pool_member(self) -> None:
        """One task of the handler pool."""
        me = asyncio.current_task()  # looked up once: the task that runs every handler here
        work = self._work
        while True:
            it = work.take()  # the rest of a batch: no coroutine, no wait
            if it is None:
                it = await work.get()
                if it is None:  # a handler that waited for input took this task's slot
                    return
            if self._stale(it):
                await self._judge_again(it)
                continue
            # Handled here rather than in a coroutine of its own: one coroutine less per
            # message on the hot path.
            try:
                scope = logs.enter_message(it.env, self.agent_id)  # log ids, OTel span
                it.started_ms = now_ms()
                try:
                    await self._run(it, traced=isinstance(scope, tuple), task=me)
                finally:
                    self._held.discard(it)  # its outcome is queued (or it was cut)
                    logs.exit_message(scope)
                    self.state.inflight -= 1
                    self.state.slot_freed()
                if not work.waiting and self.settlement.alone:  # else with its batch
                    await self.settlement.flush()
            except Exception as e:
                if not it.queued:
                    self._poison(it, e, "running it")
                else:  # its outcome is on its way: only the report of it failed
                    log.exception("after message %s was handled", it.env.msg_id)

    def _stale(self, it: Delivery) -> bool:
        """Whether this runtime may have lost ``it``'s claim since it read it: its
        registration was found lost since (evicted: its inbox moved, a peer may have taken
        the key over), or no heartbeat has been answered for as long as eviction takes
        (this process stopped or starved: it may be evicted now without knowing it)."""
        st = self.state
        return not it.judged_again and (
            it.epoch != st.lost_registrations
            or time.monotonic() - st.beat_ok_at > self.opts.evict_after_s
        )

    async def _judge_again(self, it: Delivery) -> None:
        """A message this runtime may have lost its claim of (:meth:`_stale`) goes the
        claim path again before it runs: its own claim still there is taken up again with a
        new fence; a live peer's stands, and this copy waits."""
        it.judged_again = True
        self._held.discard(it)
        self.state.running.discard(it.key)
        self.state.inflight -= 1
        self.state.slot_freed()
        it.claimed_at_send = False
        try:
            await self.take([it])
        except Exception as e:  # noqa: BLE001 - left pending: the next scan takes it up
            log.warning("message %s: claiming it again failed (%s)", it.env.msg_id, e)
            self.state.release([it])
            self.state.rescan = True

    async def _run(
        self, it: Delivery, *, traced: bool = False, task: asyncio.Task[Any] | None = None
    ) -> None:
        """Handle ``it`` and queue its settling; ``traced``: it has an OpenTelemetry span
        (logs.enter_message opened one), which gets the outcome. ``task``: the task this
        runs in, if known (else looked up when needed)."""
        env = it.env
        ctx = Context(
            env,
            it.fence,
            agent_id=self.agent_id,
            redis=self.redis,
            keys=self.keys,
            client=self.client,
        )
        ctx._slots, ctx._sessions = self.state.self_slots, self.state.sessions
        ctx._record, ctx._owner = it.idem, self.owner  # for ctx.step's journal and ctx.ask
        ctx._keep = self.keep  # a streaming handler's chunks kept to resume (keep_chunks.lua)
        ctx._waiting, ctx._agent = self.waiting, self.agent
        start_ms = it.started_ms or now_ms()  # one clock read for the checks below
        self.hooks.before_handle(ctx, start_ms)
        outcome = oc.expired_before_start(env, start_ms) if env.deadline_ms else None
        duration_s: float | None = None
        if outcome is None:
            spec = self.agent.handlers.get(env.capability)
            if spec is not None and not spec.is_async:
                spec = self.state.plain.tracked(spec)  # a drain waits for its thread
            if spec is None:
                outcome = oc.no_handler(env, self.agent_id)
            elif not self.gate.passes(env) and (refused := await self.gate.refuse(env, ctx, spec)):
                # who may call it, how deep the call is (authz)
                outcome = refused
            elif it.idem in self.cancels.heard and await self.cancels.confirmed(it.idem):
                outcome = cancelled_outcome(env, running=False)  # cancelled before it started
            else:
                try:
                    payload = decode_payload(env.payload, spec.payload_type)
                except (msgspec.ValidationError, msgspec.DecodeError) as e:
                    outcome = oc.invalid_payload(e, spec.payload_type)
                else:
                    run = ctx._cancel = self.cancels.begin(it.idem, env.msg_id)
                    if env.priority == "low" and self.opts.preempt_after_s is not None:
                        run.preemptible = (
                            spec.preemptible and preempted_times(env) < self.opts.max_preempts
                        )
                    try:
                        outcome, duration_s = await self._call(spec, payload, ctx, run, task)
                    finally:
                        self.cancels.end(run)
                    if run.preempted:  # cut for high-priority work: it goes back, as it was
                        self.hooks.after_handle(ctx, PREEMPTED, duration_s)
                        self._requeue_preempted(it)
                        return
                    if run.requested:  # cancelled while it ran: so it ends, whatever it did
                        outcome = cancelled_outcome(env, running=True)
                    self.state.handler_ran(duration_s, env.capability, env.cost)
        self.hooks.after_handle(ctx, outcome, duration_s)
        self._finish(it, outcome, traced=traced)

    async def _call(
        self,
        spec: HandlerSpec,
        payload: Any,
        ctx: Context,
        run: Run,
        task: asyncio.Task[Any] | None = None,
    ) -> tuple[Outcome, float]:
        """Run the handler under the message's deadline, in a cancel scope ``run`` can
        cancel (reach._worker.cancelling): its outcome, and how long it ran."""
        env = ctx.envelope
        # The clock now, not at the message's start: a cancel notice's check (a Redis read)
        # may have come between, and the handler gets what is left of the budget, no more.
        timeout = (env.deadline_ms - now_ms()) / 1000 if env.deadline_ms else None
        err: BaseException | None = None
        result: Any = None
        timed_out = False
        t0 = time.perf_counter()
        try:
            if spec.is_async:
                # No cancel scope to pay for (an anyio scope per message cost more than the
                # handler of a quick message): at the deadline the worker's one timer
                # (Deadlines) cancels this task (Run.expire), as a cut (Run.cut_now, after
                # a cancel's grace) does; either cancel is taken back here, and the message
                # ends timed out or cancelled (_run says so).
                task = run.task = task or asyncio.current_task()
                if timeout is not None:
                    self.deadlines.add(run, timeout)
                try:
                    result = await spec.fn(payload, ctx)
                except asyncio.CancelledError:
                    if run.cut:
                        pass  # cancelled: _run ends the message so
                    elif run.expired:
                        raise TimeoutError(f"deadline of {env.capability!r} passed") from None
                    else:
                        raise  # not ours: the worker is stopping
                finally:
                    if timeout is not None:
                        self.deadlines.discard(run)
                    run.task = None
                    if (run.cut or run.expired) and task is not None and task.cancelling():
                        task.uncancel()  # ours only: the worker's own cancel stays pending
            else:
                with anyio.fail_after(timeout) as run.scope:  # a cut cancels the scope
                    result = await anyio.to_thread.run_sync(
                        _in_thread, spec.fn, payload, ctx, abandon_on_cancel=True
                    )
                    if isinstance(result, _Raised):
                        raise result.exc
        except TimeoutError as e:
            timed_out = True
            err = e
        except BaseException as e:  # a handler's error becomes the caller's RemoteError
            if _runtime_cancel(e):
                raise
            # SystemExit, KeyboardInterrupt, GeneratorExit, a CancelledError of the
            # handler's own, a bare BaseException: one message's failure, retried and then
            # dead-lettered like any other. Let through, one such message would stop this
            # worker, its inbox would move to the next worker, which would stop in turn.
            err = e
        if ctx.chunks is not None or ctx._session is not None:
            # Its chunks and held session writes, then its outcome (a run with neither,
            # the usual one, skips the coroutine).
            err = await ctx._finish_run(err)
        duration_s = time.perf_counter() - t0
        if err is None:
            return oc.returned(result), duration_s
        if isinstance(err, Retry):
            log.info(
                "handler %s asked for a retry on attempt %d/%d: %s",
                env.capability,
                env.attempt,
                env.max_attempts,
                err,
            )
        elif not timed_out and not isinstance(err, Reject):
            log.info(
                "handler %s failed on attempt %d/%d: %s: %s",
                env.capability,
                env.attempt,
                env.max_attempts,
                type(err).__name__,
                err,
            )
        backoff = oc.backoff_ms(
            env.attempt,
            base_s=self.opts.retry_base_s,
            max_s=self.opts.retry_max_s,
            jitter=random.uniform(0.5, 1.5),
        )
        outcome = oc.raised(env, err, timed_out=timed_out, now_ms=now_ms(), backoff_ms=backoff)
        return outcome, duration_s

    def _requeue_preempted(self, it: Delivery) -> None:
        """A run cut for high-priority work (reach._worker.preempting): its claim is
        released (status ``retrying``) and the message goes back through the delayed set,
        due now, with the same attempt and one more preemption counted (``preempts``: a
        field outside the signature, so a signed message still verifies)."""
        env = it.env
        again = msgspec.structs.replace(env, preempts=min(preempted_times(env) + 1, MAX_ATTEMPTS))
        it.complete = Completion(
            it.idem, it.fence, Status.RETRYING, Mode.RELEASE, "preempted by high-priority work"
        )
        it.outcome = Settled.PARKED
        it.follow_up = Delayed(self.keys.delayed, now_ms(), encode(again))
        self.settlement.queue(it)

    def _finish(self, it: Delivery, outcome: Outcome, *, traced: bool = False) -> None:
        """Queue the fenced completion and what follows it (reply, dead letter, retry, ack)."""
        env = it.env
        oc.apply(
            it,
            outcome,
            keys=self.keys,
            agent_id=self.agent_id,
            dlq_maxlen=self.opts.dlq_maxlen,
            # the clock is read only for what a retry's due time needs
            now_ms=now_ms() if outcome.status == Status.RETRYING else 0,
            traceback_max_bytes=self.opts.traceback_max_bytes,
            redact_traceback=self.opts.redact_traceback,
        )
        if outcome.reason in (DeadReason.CANCELLED, DeadReason.POISONED):
            # The record says so already (cancel.lua, claim.lua), and raised its fence: no
            # completion, only the reply, the dead letter and the ack.
            it.complete = None
        if isinstance(it.follow_up, DeadLetter):  # oc.apply files one for a dead letter
            self.hooks.on_dead_letter(env, outcome.reason, outcome.error)
            self.letters.report(it, outcome)
        elif outcome.status == Status.RETRYING:
            self.hooks.on_retry(env, outcome.retry_delay_ms / 1000, outcome.error)
        if traced:
            logs.note_outcome(outcome.status, outcome.error_type)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s attempt %d: %s%s",
                env.capability,
                env.attempt,
                outcome.status,
                f" ({outcome.reason})" if outcome.reason else "",
            )
        self.settlement.queue(it)

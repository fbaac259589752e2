"""The agent side: register, stay alive on a lease, consume the inbox, run handlers.

``reach.Agent`` is what an agent author writes against::

    app = reach.Agent("summarizer-1", capabilities=["text.summarize"])

    @app.handler("text.summarize")
    async def summarize(payload: dict, ctx: reach.Context) -> dict: ...

``await app.run(redis_url=...)`` (or ``reach worker module:app``) then registers (not
ready), creates the inbox consumer group, resumes its own pending entries, marks itself
ready, and serves until SIGTERM/SIGINT, when it drains and deregisters.

Delivery of one message (see docs/architecture.md):

1. ``fetch.lua`` reads a batch, highest priority first (blocking XREADGROUP when idle);
2. ``claim.lua`` takes each idempotency key (pipelined for the batch): a key already done
   replays the stored reply instead of running;
3. the handler runs under the message's deadline (an anyio cancel scope);
4. ``complete.lua`` stores the outcome if this worker still holds the claim (fence), then
   the reply is published and the entry acked and deleted (one pipeline for the batch).

A crash between any two steps leaves the entry pending; its redelivery finds the key
claimed by a dead owner (taken over), or done (replayed, not run again).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import random
import signal
import threading
import time
import typing
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from redis import exceptions as rexc

from . import logs, metrics, scripts
from .client import Client
from .connection import AnyRedis, as_text, connect, connect_sync, is_cluster
from .context import Context
from .envelope import (
    BadEnvelope,
    Envelope,
    Reply,
    decode_envelope,
    decode_payload,
    decode_reply,
    encode,
    encode_payload,
    new_id,
    now_ms,
)
from .errors import ConfigError, Reject, StaleRegistration
from .keys import GROUP, PRIORITIES, Keys
from .registry import MAX_LOCK_MS, Registry
from .sweeper import sweep_chores
from .tasks import MALFORMED_CAP, TASK_TTL_MS, dead_letter_op, raw_dead_letter_op
from .untrusted import safe_int

if typing.TYPE_CHECKING:
    from .agent import Agent, RuntimeOptions

log = logging.getLogger("reach.runtime")

STARVE_AFTER = 8  # small-batch fetches serving higher priorities before one slot is kept


@dataclass
class _Item:
    """One delivered inbox entry on its way through claim → handle → settle."""

    stream: str
    entry_id: Any
    env: Envelope | None
    fence: int = 0
    ops: list[tuple[Any, ...]] = field(default_factory=list)  # after a successful complete
    ack: bool = True  # XACK + XDEL the entry once settled
    # complete.lua's key and [fence, status, mode, error], if the key is to be settled
    complete: tuple[str, list[Any]] | None = None
    queued: bool = False  # handed to the settler
    raw: bytes = b""  # the entry's bytes as read (dead-lettered as they are if unprocessable)
    reply: bytes = b""  # the outcome: stored when complete's mode is 'done', and published
    reply_key: str = ""  # ... to this reply stream ('' = nobody waits for it)
    outcome: str = ""  # for metrics: succeeded, dead, expired, retrying, replayed, parked...
    reason: str = ""  # dead-letter reason, if any


def _entry_data(fields: Any) -> bytes | None:
    """The ``e`` field of an inbox entry as read (a dict from redis-py, a flat list from
    fetch.lua); None when there is no such field or it is not bytes."""
    if isinstance(fields, list):
        fields = dict(zip(fields[::2], fields[1::2], strict=False))
    if not isinstance(fields, dict):
        return None
    data = fields.get(b"e") or fields.get("e")
    return data if isinstance(data, bytes) else None


class _Runtime:
    def __init__(self, agent: Agent, opts: RuntimeOptions) -> None:
        self.agent = agent
        self.opts = opts
        self.keys = Keys(opts.namespace)
        self.instance_id = new_id()
        self.version = time.time_ns() // 1000
        self.owner = f"{agent.agent_id}/{self.instance_id}"
        self._redis: AnyRedis | None = None
        self._client: Client | None = None
        self.registry: Registry | None = None
        self.inflight = 0
        self.ready = False
        self.draining = False
        self.stopping = anyio.Event()
        self._stop_requested = threading.Event()
        self._slot_free = anyio.Event()
        self._settle_q: list[_Item] = []
        self._settling = 0  # flushes under way
        self._work_send, self._work_recv = anyio.create_memory_object_stream[_Item](math.inf)
        self._settle_ev = anyio.Event()
        self._last_tick = time.monotonic()
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        self._stale = False
        self._passed_over = {"normal": 0, "low": 0}
        self._held: set[tuple[str, str]] = set()  # (stream, entry id) dispatched, not settled
        self._rescan = False
        self._running: set[str] = set()  # idempotency keys claimed here and not yet settled
        self._consumer_tick = time.monotonic()
        self.stats: dict[str, int] = {
            "handled": 0,
            "replayed": 0,
            "fenced": 0,
            "dead": 0,
            "retried": 0,
            "expired": 0,
            "round_trips": 0,
        }
        self._loop_token: Any = None
        # Redis away: one line when it goes, a reminder every 30 s, one when it is back,
        # for all the loops of this runtime together (not a warning per retry per loop).
        self._redis_down = logs.OutageLog(log, f"agent {agent.agent_id}: Redis")
        self._refusals: dict[str, logs.OutageLog] = {}

    @property
    def redis(self) -> AnyRedis:
        assert self._redis is not None
        return self._redis

    @property
    def client(self) -> Client:
        assert self._client is not None
        return self._client

    # -- lifecycle --------------------------------------------------------------------
    async def run(self) -> None:
        o = self.opts
        url = o.redis_url or os.environ.get("REACH_REDIS_URL")
        if not url:
            raise ConfigError("No Redis: pass redis_url=... or set REACH_REDIS_URL.")
        self._url = url
        self._redis = await connect(url)
        self._cluster = is_cluster(self._redis)
        self.registry = Registry(self._redis, o.namespace)
        self._client = Client(
            redis=self._redis, namespace=o.namespace, client_id=f"a-{self.agent.agent_id}"
        )
        self._loop_token = anyio.lowlevel.current_token()
        metrics.track_inflight(self.agent.agent_id, lambda: self.inflight)
        try:
            await self._register()
            await self._ensure_groups()
            async with self._client, anyio.create_task_group() as tg:
                self._tg = tg
                self._start_heartbeat()
                tg.start_soon(self._ticker)
                tg.start_soon(self._watchdog)
                tg.start_soon(self._settler)
                for _ in range(o.concurrency):
                    tg.start_soon(self._handler_pool_member)
                if o.sweeper:
                    tg.start_soon(self._sweeper)
                if o.handle_signals and threading.current_thread() is threading.main_thread():
                    tg.start_soon(self._signals)
                tg.start_soon(self._watch_stop)
                await self._resume_pending(tg)
                await self._set_ready(True)
                if o.ready_event is not None:
                    o.ready_event.set()
                log.info(
                    "agent %s ready (%s)", self.agent.agent_id, ", ".join(self.agent.capabilities)
                )
                await self._consume(tg)
                await self._drain()
                tg.cancel_scope.cancel()
        finally:
            log.info("stats: %s", json.dumps(self.stats))
            metrics.forget_agent(self.agent.agent_id)
            self._hb_stop.set()
            if self._hb_thread is not None:
                self._hb_thread.join(timeout=5)
            if not self._stale:
                with anyio.CancelScope(shield=True):
                    try:
                        if (
                            await self.registry.deregister(
                                self.agent.agent_id, instance_id=self.instance_id
                            )
                            == 1
                        ):
                            await self._leave_inbox()
                    except (rexc.RedisError, OSError) as e:
                        log.warning("deregister failed: %s", e)
            with anyio.CancelScope(shield=True):
                await self._redis.aclose()

    async def _leave_inbox(self) -> None:
        """After a clean deregistration: drop the emptied inbox (an agent id that is not
        coming back must not leave streams forever), or, if messages came in after the
        drain, hand them to the sweeper, which moves them to live agents."""
        inboxes = self.keys.inboxes(self.agent.agent_id)
        if not int(await scripts.call(self.redis, "drop_inbox", inboxes, [])):
            log.info("messages arrived during shutdown: the sweeper moves them on")
            await self.redis.sadd(self.keys.reroute, self.agent.agent_id)

    def _redis_failed(self, what: str, e: BaseException) -> None:
        """A Redis call of one of the runtime's loops failed (the loop retries)."""
        if isinstance(e, (rexc.ConnectionError, rexc.TimeoutError, OSError)):
            self._redis_down.failed(f"{what}: {type(e).__name__}: {e}")
        else:  # a refusal, not an outage: say which call, at most once per 30 s per kind
            self._refusals.setdefault(
                what.split(" ")[0],
                logs.OutageLog(log, f"agent {self.agent.agent_id}: {what.split(' ')[0]}"),
            ).failed(f"{type(e).__name__}: {e}")

    def request_stop(self) -> None:
        self._stop_requested.set()

    async def _watch_stop(self) -> None:
        while not self._stop_requested.is_set():
            await anyio.sleep(0.05)
        self.stopping.set()

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            n = 0
            async for sig in sigs:
                n += 1
                if n == 1:
                    log.info("signal %s: draining (again to stop at once)", sig)
                    self.request_stop()
                else:
                    log.warning("second signal: stopping without draining")
                    self._tg.cancel_scope.cancel()
                    return

    def _register_kw(self) -> dict[str, Any]:
        a, o = self.agent, self.opts
        return {
            "instance_id": self.instance_id,
            "version": self.version,
            "capabilities": a.capabilities,
            "weight": a.weight,
            "metadata": a.metadata,
            "lease_ms": int(o.lease_s * 1000),
            "evict_after_ms": int(o.evict_after_s * 1000),
            "card": a.card,
            "ready": self.ready,
            "max_queue": a.max_queue,
        }

    async def _register(self) -> None:
        assert self.registry is not None
        await self.registry.register(self.agent.agent_id, **self._register_kw())

    async def _set_ready(self, ready: bool) -> None:
        assert self.registry is not None
        self.ready = ready
        await self.registry.mark_ready(
            self.agent.agent_id, instance_id=self.instance_id, ready=ready
        )

    async def _ensure_groups(self) -> None:
        for key in self.keys.inboxes(self.agent.agent_id):
            try:
                await self.redis.xgroup_create(key, GROUP, id="0", mkstream=True)
            except rexc.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    # -- liveness ---------------------------------------------------------------------
    async def _watchdog(self) -> None:
        """Readiness follows the consumer: a consumer that is alive but has not come round
        its loop for ``consumer_stall_s`` (a read that hangs) is marked not ready, so
        routing avoids it, and ready again once it moves."""
        unready_by_us = False
        while True:
            await anyio.sleep(self.opts.heartbeat_s)
            stuck_s = time.monotonic() - self._consumer_tick
            try:
                if stuck_s > self.opts.consumer_stall_s and self.ready and not self.draining:
                    log.error("consumer made no progress for %.1fs: marked not ready", stuck_s)
                    await self._set_ready(False)
                    unready_by_us = True
                elif stuck_s <= self.opts.consumer_stall_s and unready_by_us:
                    log.warning("consumer moves again: ready")
                    await self._set_ready(True)
                    unready_by_us = False
            except (rexc.RedisError, OSError) as e:
                self._redis_failed("readiness update", e)

    async def _ticker(self) -> None:
        """Proof of event-loop progress, read by the heartbeat thread."""
        period = min(self.opts.heartbeat_s, self.opts.stall_s / 4)
        while True:
            self._last_tick = time.monotonic()
            await anyio.sleep(period)

    def _start_heartbeat(self) -> None:
        self._hb_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"reach-heartbeat-{self.agent.agent_id}", daemon=True
        )
        self._hb_thread.start()

    def _heartbeat_loop(self) -> None:
        """Heartbeats from a thread: a handler that blocks the loop for a while does not
        cost the lease, but a loop without progress for ``stall_s`` stops them."""
        assert self.registry is not None
        r = None
        reg = self.registry
        while not self._hb_stop.wait(self.opts.heartbeat_s):
            stalled = time.monotonic() - self._last_tick
            if stalled > self.opts.stall_s:
                log.error("event loop made no progress for %.1fs: heartbeats withheld", stalled)
                continue
            try:
                if r is None:
                    r = connect_sync(self._url)
                depths = [int(r.xlen(k)) for k in self.keys.inboxes(self.agent.agent_id)]
                depth = sum(depths)
                metrics.inbox_depth(self.agent.agent_id, zip(PRIORITIES, depths, strict=True))
                keys, args = reg.heartbeat_args(
                    self.agent.agent_id,
                    instance_id=self.instance_id,
                    version=self.version,
                    queue_depth=depth,
                    inflight=self.inflight,
                )
                code, draining = scripts.call_sync(r, "heartbeat", keys, args)
                code = int(code)
                if code == 0:
                    log.warning("registration lost (evicted or flushed): registering again")
                    rkeys, rargs = reg.register_args(self.agent.agent_id, **self._register_kw())
                    reply = scripts.call_sync(r, "register", rkeys, rargs)
                    reg.check_register_reply(self.agent.agent_id, self.version, reply)
                    self._recreate_groups_sync(r)
                elif code < 0:
                    raise StaleRegistration("a newer registration of this agent_id exists")
                elif int(draining) and not self._stop_requested.is_set():
                    log.info("drain requested by an operator")
                    self.request_stop()
                self._redis_down.ok()
            except StaleRegistration as e:
                log.error("stopping: %s", e)
                self._stale = True
                self.request_stop()
                return
            except (rexc.RedisError, OSError) as e:
                self._redis_failed("heartbeat", e)
                if r is not None:
                    try:
                        r.close()
                    except Exception:  # noqa: BLE001, S110 - closing a broken connection
                        pass
                r = None
        if r is not None:
            r.close()

    def _recreate_groups_sync(self, r: Any) -> None:
        for key in self.keys.inboxes(self.agent.agent_id):
            try:
                r.xgroup_create(key, GROUP, id="0", mkstream=True)
            except rexc.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    # -- sweeper ----------------------------------------------------------------------
    async def _sweeper(self) -> None:
        """Cluster-wide chores, done by whichever runtime holds the sweeper lock."""
        assert self.registry is not None
        o = self.opts
        lock_ms = min(int(max(o.sweep_interval_s * 3, 1.0) * 1000), MAX_LOCK_MS)
        counted = 0.0
        while True:
            await anyio.sleep(o.sweep_interval_s * (0.8 + 0.4 * random.random()))
            try:
                res = await self.registry.sweep(
                    owner=self.instance_id,
                    lock_ms=lock_ms,
                    shadow_ttl_ms=int(o.shadow_ttl_s * 1000),
                )
                if not res.locked:
                    if res.evicted:
                        log.warning("evicted: %s", ", ".join(res.evicted))
                    await sweep_chores(
                        self.redis, self.keys, self.client, self.registry, dlq_maxlen=o.dlq_maxlen
                    )
                if time.monotonic() - counted >= max(5.0, o.sweep_interval_s):
                    counted = time.monotonic()  # registry gauges: only the lock holder's
                    if res.locked:
                        metrics.registry_counts(None)
                    else:
                        metrics.registry_counts(*await metrics.count_agents(self.redis, self.keys))
            except (rexc.RedisError, OSError) as e:
                self._redis_failed("sweep", e)
            except Exception:  # entries have their own barrier: this is a bug, not data
                log.exception("sweep failed; the next one tries again")

    # -- consuming --------------------------------------------------------------------
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
        keys = self.keys.inboxes(self.agent.agent_id)
        keep_n, keep_l = self._read_shares(n)
        args = [GROUP, self.agent.agent_id, n, keep_n, keep_l]
        try:
            self.stats["round_trips"] += 1
            res = await scripts.call(self.redis, "fetch", keys, args)
        except rexc.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            await self._ensure_groups()
            res = await scripts.call(self.redis, "fetch", keys, args)
        got = [(k, entries) for k, entries in zip(keys, res[:3], strict=True) if entries]
        served = {k.rsplit(":", 1)[1] for k, _ in got}
        for prio, was_waiting in (("normal", res[3]), ("low", res[4])):
            if prio in served:
                self._passed_over[prio] = 0
            elif int(was_waiting):
                self._passed_over[prio] += 1
        return got

    async def _block(self, n: int) -> list[tuple[str, list[Any]]]:
        keys = self.keys.inboxes(self.agent.agent_id)
        self.stats["round_trips"] += 1
        try:
            res = await self.redis.xreadgroup(
                GROUP,
                self.agent.agent_id,
                {k: ">" for k in keys},
                count=n,
                block=self.opts.block_ms,
            )
        except rexc.ResponseError as e:
            # NOGROUP: the group is gone (a Redis that lost its data); UNBLOCKED: the stream
            # was deleted while we waited on it. Either way: recreate and read again.
            if "NOGROUP" not in str(e) and "UNBLOCKED" not in str(e):
                raise
            await self._ensure_groups()
            return []
        return [(as_text(k), entries) for k, entries in res or []]

    async def _resume_pending(self, tg: anyio.abc.TaskGroup) -> None:
        """Entries this agent_id read but never settled: after a restart (a crash), and
        every ``pending_scan_s`` or after a failed Redis call while it runs."""
        keys = self.keys.inboxes(self.agent.agent_id)
        for key in keys:
            last = "0"
            while True:
                try:
                    res = await self.redis.xreadgroup(
                        GROUP, self.agent.agent_id, {key: last}, count=self.opts.batch
                    )
                except rexc.ResponseError as e:
                    if "NOGROUP" not in str(e):
                        raise
                    # Its inbox was dropped (a Redis that lost its data, or the sweeper
                    # dropping an evicted id's emptied inbox): nothing pending there.
                    await self._ensure_groups()
                    break
                entries = res[0][1] if res else []
                if not entries:
                    break
                last = entries[-1][0]
                # Entries this runtime holds right now are on their way; the others were
                # read and then lost (a crash, or a claim/settle that failed): redo them.
                lost = [e for e in entries if (key, as_text(e[0])) not in self._held]
                if not lost:
                    continue
                while self.inflight >= self.opts.concurrency:
                    await self._wait_slot()
                log.info("resuming %d pending entries of %s", len(lost), key)
                await self._dispatch(tg, [(key, lost)])

    async def _wait_slot(self) -> None:
        self._slot_free = anyio.Event()
        with anyio.move_on_after(1.0):
            await self._slot_free.wait()

    async def _consume(self, tg: anyio.abc.TaskGroup) -> None:
        o = self.opts
        next_scan = time.monotonic() + o.pending_scan_s
        backlog = True
        while not self.stopping.is_set():
            self._consumer_tick = time.monotonic()
            free = o.concurrency - self.inflight
            if free <= 0:
                await self._wait_slot()
                continue
            n = min(free, o.batch)
            try:
                if self._rescan or time.monotonic() >= next_scan:
                    self._rescan = False
                    next_scan = time.monotonic() + o.pending_scan_s
                    await self._resume_pending(tg)
                # After a read that drained the inbox, go straight to the blocking read
                # (it returns at once when something came meanwhile): an idle agent pays
                # one round trip per message, not two. A full read means a backlog: then
                # the priority-ordered fetch.lua with its starvation guard.
                got = await self._fetch(n) if backlog else []
                if not got:
                    got = await self._block(n)
                self._redis_down.ok()
                backlog = sum(len(e) for _, e in got) >= n
                if got:
                    await self._dispatch(tg, got)
            except (rexc.RedisError, OSError) as e:
                # Never let the consumer die: Redis away, restarted, failing over, or a
                # reply we did not expect. Log, back off, pick up what was left pending.
                self._redis_failed("inbox read", e)
                self._rescan = True
                await anyio.sleep(0.2)
            except Exception:  # a bug, not data (entries have their own barrier): go on
                log.exception("consumer loop error; retrying")
                self._rescan = True
                await anyio.sleep(0.2)

    async def _dispatch(self, tg: anyio.abc.TaskGroup, got: list[tuple[str, list[Any]]]) -> None:
        """Decode and claim a batch, then start a handler task per claimed entry."""
        items: list[_Item] = []
        for stream, entries in got:
            for entry_id, fields in entries:
                self._held.add((stream, as_text(entry_id)))
                if not fields:
                    # Pending but deleted (the sweeper moved it while we held it): only the
                    # pending reference is left to clear.
                    it = _Item(stream, entry_id, None, outcome="gone")
                    self._queue_settle(it)
                    continue
                data = _entry_data(fields)
                try:
                    if data is None:
                        raise BadEnvelope("malformed", "entry has no 'e' field")
                    if len(data) > self.opts.max_envelope_bytes:
                        raise BadEnvelope(
                            "too_large",
                            f"{len(data)} bytes, over this agent's "
                            f"limit of {self.opts.max_envelope_bytes}",
                        )
                    env = decode_envelope(data)
                except BadEnvelope as e:
                    self._bad_entry(stream, entry_id, data or b"", e)
                    continue
                items.append(_Item(stream, entry_id, env, raw=data))
                metrics.delivered(env.capability, env.priority)
        if not items:
            self._kick_settler()
            return
        self.stats["round_trips"] += 1
        try:
            results = await self._claim(items)
        except BaseException:
            self._release(items)  # left pending: the next pending scan takes them up
            raise
        busy: list[_Item] = []
        for it, res in zip(items, results, strict=True):
            assert it.env is not None
            if scripts.is_data_error(res):
                self._poison(it, res, "claiming it")
                continue
            if isinstance(res, BaseException):
                log.warning("claim of %s failed (%s); it stays pending", it.env.msg_id, res)
                self._release([it])
                self._rescan = True
                continue
            try:
                self._claimed(it, res, busy)
            except Exception as e:  # noqa: BLE001 - one entry's failure is that entry's
                self._poison(it, e, "claiming it")
        for i, it in enumerate(busy):
            try:
                await self._busy(tg, it)
            except Exception as e:  # the per-entry barrier
                if isinstance(e, (rexc.RedisError, OSError)) and not scripts.is_data_error(e):
                    self._release(busy[i:])  # Redis away or busy: pending, for the next scan
                    raise
                self._poison(it, e, "checking who holds its key")

    def _claimed(self, it: _Item, res: Any, busy: list[_Item]) -> None:
        """Act on claim.lua's answer for one item: run it, replay it, or see who holds it."""
        assert it.env is not None
        code = int(res[0])
        if code == 1:
            it.fence = int(res[1])
            self._running.add(it.env.key)
            self._start(it)
        elif code == 2:
            self.stats["replayed"] += 1
            metrics.replayed(it.env.capability)
            self._replay(it, res[1])
        else:
            busy.append(it)

    def _poison(self, it: _Item, exc: BaseException, doing: str) -> None:
        """The per-entry barrier: an entry whose handling raised (data no check foresaw)
        is dead-lettered as ``unprocessable`` with its bytes, its caller is told, and the
        worker goes on. Never run again: a poison entry must not loop."""
        if it.queued:  # its outcome is already on its way to Redis
            log.exception(
                "message %s: %s failed after it was settled", it.env and it.env.msg_id, doing
            )
            return
        self._make_poison(it, exc, doing, tell_caller=True)
        self._queue_settle(it)

    def _make_poison(self, it: _Item, exc: BaseException, doing: str, *, tell_caller: bool) -> None:
        """Turn ``it`` into a dead letter of its raw bytes (+ ack), with the caller's reply
        and the release of its claim when ``tell_caller``; else only the letter and the ack
        (for an entry whose reply or completion itself cannot be written)."""
        what = it.env.msg_id if it.env else repr(it.entry_id)
        log.error(
            "message %s dead-lettered: %s failed with %s: %s",
            what,
            doing,
            type(exc).__name__,
            exc,
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
        self.stats["dead"] += 1
        error = f"{doing} failed: {type(exc).__name__}: {exc}"[:2000]
        it.complete, it.reply_key, it.reply = None, "", b""
        if it.env is not None and tell_caller:
            env = it.env
            if it.fence:
                it.complete = (self.keys.idem(env.key), [it.fence, "dead", "release", error])
            reply = Reply(
                msg_id=env.msg_id,
                status="dead",
                reason="unprocessable",
                error=error,
                error_type=type(exc).__name__,
                agent_id=self.agent.agent_id,
                attempt=env.attempt,
            )
            self._set_reply(it, env, encode(reply), publish=True)
        it.ops = [
            raw_dead_letter_op(
                self.keys,
                reason="unprocessable",
                data=it.raw,
                error=error,
                agent_id=self.agent.agent_id,
                maxlen=self.opts.dlq_maxlen,
            )
        ]
        it.outcome, it.reason = "dead", "unprocessable"

    async def _claim(self, items: list[_Item]) -> list[Any]:
        """Run claim.lua for the items: one call on standalone Redis, one per key
        (pipelined) on a Cluster. Returns one reply (or exception) per item."""
        head = [self.owner, TASK_TTL_MS, self.agent.agent_id]

        def tail(it: _Item) -> list[Any]:
            assert it.env is not None
            return [self._claim_lease_ms(it.env), it.env.msg_id]

        keys = [self.keys.idem(it.env.key) for it in items if it.env]
        res = await self._batched("claim", keys, head, [tail(it) for it in items])
        if len(items) > 1 and any(scripts.is_data_error(r) for r in res):
            # One key of the wrong type refuses the whole batch: claim each alone, so only
            # that entry fails (and is dead-lettered), not its neighbours on every scan.
            res = [
                (await self._batched("claim", [k], head, [tail(it)]))[0]
                for k, it in zip(keys, items, strict=True)
            ]
        return res

    async def _batched(
        self, script: str, keys: list[str], head: list[Any], tails: list[list[Any]]
    ) -> list[Any]:
        if not self._cluster:
            args = head + [a for t in tails for a in t]
            try:
                return list(await scripts.call(self.redis, script, keys, args))
            except rexc.ResponseError as e:
                return [e] * len(keys)
        ops = [scripts.op(script, [k], head + t) for k, t in zip(keys, tails, strict=True)]
        res = await scripts.run_pipeline(self.redis, ops)
        return [r if isinstance(r, BaseException) else r[0] for r in res]

    def _claim_lease_ms(self, env: Envelope) -> int:
        lease = int(self.opts.claim_lease_s * 1000)
        if env.deadline_ms:
            lease = max(1000, min(lease, env.deadline_ms - now_ms() + 1000))
        return lease

    async def _busy(self, tg: anyio.abc.TaskGroup, it: _Item) -> None:
        """The key is claimed by another owner: take it over if that owner is gone,
        else let this copy wait (the live owner will answer; a later retry replays)."""
        assert it.env is not None and self.registry is not None
        rec = await self.redis.hget(self.keys.idem(it.env.key), "owner")
        owner = rec.decode() if isinstance(rec, bytes) else (rec or "")
        if owner == self.owner:
            # Claimed by this very runtime: a duplicate while its handler runs waits; but
            # if nothing here runs it (its claim or settle failed), take it up again.
            alive = it.env.key in self._running
        else:
            agent_id, _, instance = owner.partition("/")
            info = await self.registry.get(agent_id) if agent_id else None
            alive = info is not None and info.instance_id == instance and info.state != "evicted"
        # Take over only from the owner judged gone (compare-and-set): another runtime may
        # have taken the key over since it was read, and its fresh claim must stand.
        if not alive and int(
            await scripts.call(self.redis, "takeover", [self.keys.idem(it.env.key)], [owner])
        ):
            await self._dispatch_again(tg, it)
            return
        self._park(it)

    def _park(self, it: _Item) -> None:
        """A live owner runs this key: this copy waits as a delayed retry, which later
        replays the stored result (or runs, if that owner failed). It polls with a growing
        backoff, not once per claim lease, which would often outlast the caller's deadline."""
        assert it.env is not None
        waits = safe_int(it.env.headers.get("busy_waits"), lo=0, hi=64)
        delay_s = min(self.opts.retry_max_s, self.opts.retry_base_s * 2**waits)
        delay_ms = min(self._claim_lease_ms(it.env), int(delay_s * 1000))
        parked = msgspec.structs.replace(
            it.env, headers={**it.env.headers, "busy_waits": str(waits + 1)}
        )
        it.outcome = "parked"
        it.ops = [("ZADD", self.keys.delayed, now_ms() + delay_ms, encode(parked))]
        self._queue_settle(it)

    async def _dispatch_again(self, tg: anyio.abc.TaskGroup, it: _Item) -> None:
        assert it.env is not None
        res = (await self._claim([it]))[0]
        if isinstance(res, BaseException):
            raise res
        code = int(res[0])
        if code == 1:
            it.fence = int(res[1])
            self._running.add(it.env.key)
            self._start(it)
        elif code == 2:
            self._replay(it, res[1])
        else:
            self._park(it)

    def _set_reply(self, it: _Item, env: Envelope, reply_bytes: bytes, *, publish: bool) -> None:
        it.reply = reply_bytes
        it.reply_key = self.keys.replies(env.reply_to) if (publish and env.reply_to) else ""

    def _replay(self, it: _Item, stored: bytes) -> None:
        assert it.env is not None
        reply = decode_reply(stored)
        if reply.msg_id != it.env.msg_id:
            # Same idempotency key, another message: its caller waits for its own msg_id.
            stored = encode(msgspec.structs.replace(reply, msg_id=it.env.msg_id))
        self._set_reply(it, it.env, stored, publish=True)
        it.outcome = "replayed"
        self._queue_settle(it)

    def _bad_entry(self, stream: str, entry_id: Any, data: bytes, e: BadEnvelope) -> None:
        log.warning("dead-lettering entry %r of %s: %s", entry_id, stream, e)
        self.stats["dead"] += 1
        it = _Item(stream, entry_id, None, outcome="malformed", reason=e.reason)
        it.ops = [
            raw_dead_letter_op(
                self.keys,
                reason=e.reason,
                data=data,
                error=e.detail,
                agent_id=self.agent.agent_id,
                maxlen=self.opts.dlq_maxlen,
            )
        ]
        self._queue_settle(it)

    # -- handling ---------------------------------------------------------------------
    def _start(self, it: _Item) -> None:
        """Hand a claimed item to the handler pool (long-lived tasks: no spawn per message)."""
        self.inflight += 1
        self._work_send.send_nowait(it)

    async def _handler_pool_member(self) -> None:
        async for it in self._work_recv:
            try:
                await self._handle(it)
            except Exception as e:
                if not it.queued:
                    self._poison(it, e, "running it")
                else:  # its outcome is on its way: only the report of it failed
                    log.exception("after message %s was handled", it.env and it.env.msg_id)

    async def _handle(self, it: _Item) -> None:
        env = it.env
        assert env is not None
        scope = logs.enter_message(env, self.agent.agent_id)  # ids on log records, OTel span
        try:
            await self._run_one(it, env)
        finally:
            logs.exit_message(scope)
            self.inflight -= 1
            self._slot_free.set()
        if not self._settling and len(self._settle_q) == 1:
            # Nothing else to batch with and no flush under way: settle from here, one
            # event-loop turn sooner than handing it to the settler (a lone request's latency).
            await self._flush()

    async def _run_one(self, it: _Item, env: Envelope) -> None:
        start_ms = now_ms()
        if env.sent_ms:
            metrics.queue_wait(env.priority, (start_ms - env.sent_ms) / 1000)
        if env.deadline_ms and env.deadline_ms <= start_ms:
            self.stats["expired"] += 1
            self._finish(
                it,
                "expired",
                reason="expired",
                error="deadline passed before start",
                error_type="DeadlineExceeded",
                dead=True,
            )
            return
        spec = self.agent.handlers.get(env.capability)
        if spec is None:
            self._finish(
                it,
                "dead",
                reason="no_handler",
                error_type="Reject",
                dead=True,
                error=f"agent {self.agent.agent_id} has no handler for {env.capability}",
            )
            return
        try:
            payload = decode_payload(env.payload, spec.payload_type)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            self._finish(
                it,
                "dead",
                reason="invalid_payload",
                error=str(e),
                error_type="ValidationError",
                dead=True,
            )
            return
        ctx = Context(
            env,
            it.fence,
            agent_id=self.agent.agent_id,
            redis=self.redis,
            keys=self.keys,
            client=self.client,
        )
        timeout = (env.deadline_ms - now_ms()) / 1000 if env.deadline_ms else None
        err: BaseException | None = None
        result: Any = None
        timed_out = False
        t0 = time.perf_counter()
        try:
            for hook in self.agent.before_handler:
                r = hook(ctx)
                if inspect.isawaitable(r):
                    await r
            if timeout is None and spec.is_async:
                result = await spec.fn(payload, ctx)  # no deadline: no cancel scope to pay for
            else:
                with anyio.fail_after(timeout):
                    if spec.is_async:
                        result = await spec.fn(payload, ctx)
                    else:
                        result = await anyio.to_thread.run_sync(
                            spec.fn, payload, ctx, abandon_on_cancel=True
                        )
        except TimeoutError as e:
            timed_out = True
            err = e
        except Exception as e:  # noqa: BLE001 - a handler's error becomes the caller's RemoteError
            err = e
        finally:
            for ahook in self.agent.after_handler:
                try:
                    r = ahook(ctx, err)
                    if inspect.isawaitable(r):
                        await r
                except Exception:
                    log.exception("after_handler hook failed")
        metrics.handler_done(
            env.capability,
            "succeeded"
            if err is None
            else "timeout"
            if timed_out
            else "rejected"
            if isinstance(err, Reject)
            else "error",
            time.perf_counter() - t0,
        )
        if err is None:
            try:
                raw = encode_payload(result)
            except ConfigError as e:
                self._finish(
                    it,
                    "dead",
                    reason="bad_result",
                    error=str(e),
                    error_type="EncodeError",
                    dead=True,
                )
                return
            self.stats["handled"] += 1
            self._finish(it, "succeeded", result=raw)
            return
        etype = type(err).__name__
        if timed_out:
            self.stats["expired"] += 1
            self._finish(
                it,
                "expired",
                reason="timeout",
                error_type="DeadlineExceeded",
                error="handler ran past the deadline",
                dead=True,
            )
            return
        if isinstance(err, Reject):
            self._finish(
                it,
                "dead",
                reason="rejected",
                error=str(err) or "rejected",
                error_type=etype,
                dead=True,
            )
            return
        log.info(
            "handler %s failed on attempt %d/%d: %s: %s",
            env.capability,
            env.attempt,
            env.max_attempts,
            etype,
            err,
        )
        if env.attempt >= env.max_attempts:
            self._finish(
                it, "dead", reason="max_attempts", error=str(err), error_type=etype, dead=True
            )
            return
        delay_ms = self._backoff_ms(env.attempt)
        if env.deadline_ms and now_ms() + delay_ms >= env.deadline_ms:
            self._finish(
                it,
                "expired",
                reason="expired",
                error_type=etype,
                dead=True,
                error=f"no time left for a retry after: {err}",
            )
            return
        self.stats["retried"] += 1
        retry = msgspec.structs.replace(
            env, attempt=env.attempt + 1, headers={**env.headers, "avoid": self.agent.agent_id}
        )
        self._finish(
            it,
            "retrying",
            error=str(err),
            error_type=etype,
            retry=(now_ms() + delay_ms, encode(retry)),
        )

    def _backoff_ms(self, attempt: int) -> int:
        # The exponent is capped: 2**1000 overflows a float, and max_attempts may be large.
        base = self.opts.retry_base_s * (2 ** min(max(attempt - 1, 0), 60))
        return int(min(self.opts.retry_max_s, base) * random.uniform(0.5, 1.5) * 1000)

    def _finish(
        self,
        it: _Item,
        status: str,
        *,
        result: msgspec.Raw | None = None,
        reason: str = "",
        error: str = "",
        error_type: str = "",
        dead: bool = False,
        retry: tuple[int, bytes] | None = None,
    ) -> None:
        """Queue the fenced completion and what follows it (reply, dead letter, retry, ack)."""
        env = it.env
        assert env is not None
        final = retry is None
        reply = Reply(
            msg_id=env.msg_id,
            status="dead" if (dead and status == "dead") else status,
            result=result if result is not None else msgspec.Raw(b"\xc0"),
            error=error,
            error_type=error_type,
            reason=reason,
            agent_id=self.agent.agent_id,
            attempt=env.attempt,
        )
        data = encode(reply)
        mode = "done" if status == "succeeded" else "release"
        status_ = "dead" if (dead and status == "dead") else status
        it.complete = (self.keys.idem(env.key), [it.fence, status_, mode, error[:2000]])
        self._set_reply(it, env, data, publish=final)
        ops: list[tuple[Any, ...]] = []
        if dead:
            self.stats["dead"] += 1
            ops.append(
                dead_letter_op(
                    self.keys,
                    capability=env.capability,
                    reason=reason,
                    data=encode(env),
                    error=error,
                    error_type=error_type,
                    attempts=env.attempt,
                    agent_id=self.agent.agent_id,
                    msg_id=env.msg_id,
                    maxlen=self.opts.dlq_maxlen,
                )
            )
        if retry is not None:
            ops.append(("ZADD", self.keys.delayed, retry[0], retry[1]))
        it.ops = ops
        it.outcome = "retrying" if retry is not None else status_
        it.reason = reason
        logs.note_outcome(it.outcome, error_type)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s attempt %d: %s%s",
                env.capability,
                env.attempt,
                it.outcome,
                f" ({reason})" if reason else "",
            )
        self._queue_settle(it)

    # -- settling (batched) ------------------------------------------------------------
    def _queue_settle(self, it: _Item) -> None:
        it.queued = True
        self._settle_q.append(it)
        self._settle_ev.set()

    def _kick_settler(self) -> None:
        if self._settle_q:
            self._settle_ev.set()

    async def _settler(self) -> None:
        """Flush completions in batches: fenced completes first, then replies and acks."""
        while True:
            await self._settle_ev.wait()
            self._settle_ev = anyio.Event()
            await self._flush()

    async def _flush(self) -> None:
        batch, self._settle_q = self._settle_q, []
        if not batch:
            return
        self._settling += 1
        try:
            try:
                await self._settle(batch)
            except rexc.ResponseError as e:
                if self._cluster or not scripts.is_data_error(e):
                    raise
                await self._settle_one_by_one(batch, e)
        except (rexc.RedisError, OSError) as e:
            # Entries stay pending: the next pending scan redoes them, and claim finds
            # the ones whose completion was stored (replay, not run again).
            self._redis_failed(f"settling {len(batch)} entries", e)
            self._rescan = True
        finally:
            self._settling -= 1
            self._release(batch)

    async def _settle_one_by_one(self, batch: list[_Item], first: Exception) -> None:
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
                self._make_poison(it, e, "settling it", tell_caller=False)
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

    def _release(self, items: list[_Item]) -> None:
        for it in items:
            self._held.discard((it.stream, as_text(it.entry_id)))
            if it.fence and it.env is not None:
                self._running.discard(it.env.key)

    async def _settle(self, batch: list[_Item]) -> None:
        if self._cluster:
            await self._settle_pipelined(batch)
        else:
            await self._settle_atomic(batch)

    @staticmethod
    def _settled(it: _Item) -> None:
        metrics.settled(
            it.env.capability if it.env else MALFORMED_CAP, it.outcome or "acked", it.reason
        )

    def _fenced(self, it: _Item) -> None:
        self.stats["fenced"] += 1
        metrics.fenced(it.env.capability if it.env else MALFORMED_CAP)
        log.warning(
            "late completion of %s refused: another owner took it over", it.env and it.env.msg_id
        )

    async def _settle_atomic(self, batch: list[_Item]) -> None:
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
            if it.complete is not None:
                fence, status, mode, error = it.complete[1]
                args += [ki(it.complete[0]), fence, status, it.reply, mode, error]
            else:
                args += [0, "", "", it.reply, "", ""]
            args += [
                ki(it.reply_key) if it.reply_key else 0,
                ki(it.stream) if it.ack else 0,
                it.entry_id,
                len(it.ops),
            ]
            for name, key, *rest in it.ops:
                args += [name, ki(key), len(rest), *rest]
        self.stats["round_trips"] += 1
        res = await scripts.call(self.redis, "settle", keys, args)
        for it, code in zip(batch, res, strict=True):
            if int(code) == 0:
                self._fenced(it)
            else:
                self._settled(it)

    async def _settle_pipelined(self, batch: list[_Item]) -> None:
        """Cluster: fenced completes (one slot each), then replies, dead letters and acks."""
        with_complete = [it for it in batch if it.complete is not None]
        ok = {id(it) for it in batch if it.complete is None}
        if with_complete:
            self.stats["round_trips"] += 1
            res = await self._batched(
                "complete",
                [it.complete[0] for it in with_complete if it.complete],
                [TASK_TTL_MS],
                [
                    [f, st, it.reply if mode == "done" else "", mode, err]
                    for it in with_complete
                    if it.complete
                    for f, st, mode, err in [it.complete[1]]
                ],
            )
            for it, r in zip(with_complete, res, strict=True):
                if scripts.is_data_error(r):  # its record is of the wrong type: dead letter and ack
                    self._make_poison(it, r, "settling it", tell_caller=False)
                    ok.add(id(it))
                elif isinstance(r, BaseException):
                    log.warning("complete failed for %s: %s", it.env and it.env.msg_id, r)
                elif int(r) == 1:
                    ok.add(id(it))
                else:
                    self._fenced(it)
        ops: list[tuple[Any, ...]] = []
        for it in batch:
            if id(it) in ok:
                if it.reply_key:
                    ops += [
                        ("XADD", it.reply_key, "*", "r", it.reply),
                        ("PEXPIRE", it.reply_key, TASK_TTL_MS),
                    ]
                ops += it.ops
        acks: dict[str, list[Any]] = {}
        for it in batch:
            if id(it) in ok and it.ack:
                acks.setdefault(it.stream, []).append(it.entry_id)
        for stream, ids in acks.items():  # acks last: after replies, dead letters, retries
            ops += [("XACK", stream, GROUP, *ids), ("XDEL", stream, *ids)]
        if ops:
            self.stats["round_trips"] += 1
            res = await scripts.run_pipeline(self.redis, ops)
            errs = [r for r in res if isinstance(r, Exception)]
            if errs:
                log.warning("%d settle commands failed, first: %s", len(errs), errs[0])
        for it in batch:
            if id(it) in ok:
                self._settled(it)

    async def _drain(self) -> None:
        """Stop taking work, let in-flight handlers finish (bounded), flush settles."""
        assert self.registry is not None
        self.draining = True
        try:
            await self.registry.drain(self.agent.agent_id, instance_id=self.instance_id)
        except Exception as e:  # noqa: BLE001 - best effort: the drain goes on without it
            log.info("drain flag not set: %s", e)
        with anyio.move_on_after(self.opts.drain_timeout_s):
            while self.inflight > 0:
                await self._wait_slot()
        if self.inflight:
            log.warning("drain timeout: %d handlers still running are abandoned", self.inflight)
        while self._settle_q:
            batch, self._settle_q = self._settle_q, []
            await self._settle(batch)

"""Liveness: the agent's registration and everything that keeps it true.

* registration (not ready at first), readiness, the drain flag, and on a clean stop
  deregistration and leaving the inbox;
* heartbeats timed by a thread, so a handler that blocks the event loop for a while does
  not cost the lease; a loop without progress for ``stall_s`` (the ticker proves progress)
  withholds them. A heartbeat that finds the registration gone registers again; one that
  finds a newer registration stops this agent. One thread per process and Redis
  (:class:`Heartbeats`) renews every agent the process runs: the inbox lengths of all in
  one pipeline (with a ``TIME``, on a Cluster ``server_time.lua`` keyed to the registry's
  node: the clock offset deadlines are judged with, :mod:`reach.clock`), then one
  ``heartbeat_many.lua`` call per registry shard (per 100 agents), each agent answered as
  by ``heartbeat.lua``. The round is sent by the agents' event
  loop on its multiplexed connection (no connection of its own); only when that is not
  answered within :data:`LOOP_PICKUP_S` (a handler blocking the loop) does the thread
  send it on a connection of its own, kept while the loop stays blocked;
* signals: the first SIGTERM/SIGINT drains, a second one stops at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio
from redis import exceptions as rexc

from ..clock import CLOCK
from ..connection import connect_sync
from ..errors import StaleRegistration
from ..keys import PRIORITIES
from ..registry import Registry
from ..scripts import Call, inbox, run_pipeline, script
from ..scripts._loader import is_noscript
from ..scripts.agents import Beat, Heartbeat
from ..scripts.codes import DeregisterCode, DropInboxCode, HeartbeatCode
from .consumer import create_groups_sync
from .state import Part, Predecessor, Shared

log = logging.getLogger("reach.runtime")


class Liveness(Part):
    """Registration, heartbeats, readiness and stopping, for one running agent."""

    def __init__(
        self,
        shared: Shared,
        *,
        url: str,
        registry: Registry,
        version: int,
        registry_url: str | None = None,
    ) -> None:
        super().__init__(shared)
        self.url = url  # the heartbeat thread's own connection, when the loop is blocked
        # The control plane's own Redis (the registry's), when apart from ``url``'s.
        self.registry_url = registry_url if registry_url and registry_url != url else None
        self.registry = registry
        self.version = version  # the process start stamp: a newer registration wins
        self._hb: Heartbeats | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop sending its rounds
        # Held while the heartbeat thread acts on an answer (registering again, say), and
        # by stop_heartbeat to mark the agent as left: an answer acted on ends before the
        # clean stop deregisters, and none is acted on after (see answered).
        self._answering = threading.Lock()
        self._left = False

    # -- registration -------------------------------------------------------------------
    def _register_kw(self) -> dict[str, Any]:
        a, o = self.agent, self.opts
        return {
            "instance_id": self.state.instance_id,
            "version": self.version,
            "capabilities": a.capabilities,
            "weight": a.weight,
            "metadata": a.metadata,
            "lease_ms": int(o.lease_s * 1000),
            "evict_after_ms": int(o.evict_after_s * 1000),
            "card": a.card,
            "ready": self.state.ready,
            "max_queue": a.max_queue,
            "slots": o.concurrency,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "app_version": a.version,
        }

    async def register(self) -> None:
        # Deadlines are judged on Redis's clock: know this host's offset before any runs.
        await self.registry.measure_clock()
        got = await self.registry.register_detail(self.agent_id, **self._register_kw())
        self.state.beat_ok_at = time.monotonic()
        if not got.replaced_instance:
            return
        who = (
            f"instance {got.replaced_instance} on host {got.replaced_host or '?'} "
            f"(pid {got.replaced_pid or '?'})"
        )
        if got.replaced_live:
            # Two processes with one agent_id: the older drains (exit 0) from its next
            # heartbeat on. Said here, since the older one may log to another place. Its
            # claims stand meanwhile (Execution._busy): what it runs is not run here too.
            pid = got.replaced_pid
            self.state.predecessor = Predecessor(
                owner=f"{self.agent_id}/{got.replaced_instance}",
                host=got.replaced_host,
                pid=int(pid) if pid.isascii() and pid.isdigit() else 0,
            )
            log.warning(
                "agent %s: replaced %s, which was still serving: it drains from its next "
                "heartbeat on, and the messages it runs are left to it. To run several "
                "copies of one agent, give each its own agent_id (reach worker --agent-id "
                "ID, or --instances N)",
                self.agent_id,
                who,
            )
        else:
            log.info("agent %s: took over the registration of %s (gone)", self.agent_id, who)

    async def set_ready(self, ready: bool) -> None:
        self.state.ready = ready
        await self.registry.mark_ready(
            self.agent_id, instance_id=self.state.instance_id, ready=ready
        )

    async def announce_drain(self) -> None:
        """Set the drain flag (routing stops sending here); best effort."""
        try:
            await self.registry.drain(self.agent_id, instance_id=self.state.instance_id)
        except Exception as e:  # noqa: BLE001 - best effort: the drain goes on without it
            log.info("drain flag not set: %s", e)

    async def leave(self) -> None:
        """On a clean stop: deregister (unless a newer registration replaced this one)
        and leave the inbox. Shielded from cancellation; failures are logged."""
        if self.state.stale:
            return
        with anyio.CancelScope(shield=True):
            try:
                deregistered = await self.registry.deregister(
                    self.agent_id, instance_id=self.state.instance_id
                )
                if deregistered is DeregisterCode.REMOVED:
                    await self._leave_inbox()
            except (rexc.RedisError, OSError) as e:
                log.warning("deregister failed: %s", e)

    async def _leave_inbox(self) -> None:
        """After a clean deregistration: drop the emptied inbox (an agent id that is not
        coming back must not leave streams forever). Messages that came in during the
        drain, and those callers whose registry view is behind still send here after it,
        are the sweeper's: deregister.lua listed this agent in its shard's reroute set, in
        the same step, and for ``REROUTE_GRACE_MS`` the sweeper moves whatever lands in
        this inbox to live agents of the capability (or parks it)."""
        dropped = await inbox.drop_inbox(self.keys, agent_id=self.agent_id).run(self.redis)
        if dropped is DropInboxCode.KEPT:
            log.info("messages arrived during shutdown: the sweeper moves them on")

    # -- progress -----------------------------------------------------------------------
    async def ticker(self) -> None:
        """Proof of event-loop progress, read by the heartbeat thread."""
        period = min(self.opts.heartbeat_s, self.opts.stall_s / 4)
        while True:
            self.state.loop_tick = time.monotonic()
            await anyio.sleep(period)

    # -- heartbeats ---------------------------------------------------------------------
    def start_heartbeat(self) -> None:
        """Join this process's heartbeat thread for this Redis (started by the first
        agent, stopped when the last one leaves); its rounds go out on this event loop."""
        self.loop = asyncio.get_running_loop()
        self._hb = Heartbeats.join(self.url, self, registry_url=self.registry_url)

    @property
    def heartbeats(self) -> Heartbeats | None:
        """The heartbeat thread renewing this agent (None before it joins, after it leaves)."""
        return self._hb

    def stop_heartbeat(self) -> None:
        hb, self._hb = self._hb, None
        with self._answering:  # an answer the thread acts on now ends first
            self._left = True
        if hb is not None:
            hb.leave(self)

    def stalled_s(self) -> float:
        """How long this agent's event loop has made no progress, when over ``stall_s``
        (its heartbeats are withheld), else 0."""
        stalled = time.monotonic() - self.state.loop_tick
        return stalled if stalled > self.opts.stall_s else 0.0

    def answered(
        self, conn: Callable[[], Any], hb: Heartbeat, control: Callable[[], Any] | None = None
    ) -> bool:
        """Act on this agent's heartbeat answer (in the heartbeat thread; ``conn()`` gives
        its own connection, opened when first needed; ``control()`` the registry's, when
        the control plane is apart); False once the agent must stop beating (a newer
        registration exists, or it left: :meth:`stop_heartbeat`).

        An answer that comes after the agent left is not acted on: a round sent before its
        clean stop can come back NOT_REGISTERED once ``leave`` has deregistered it, and
        registering again then would leave a stopped agent in the registry (a test saw
        one of five hosted agents still registered after they all stopped)."""
        with self._answering:
            if self._left:
                return False
            return self._answered(conn, hb, control)

    def _answered(
        self, conn: Callable[[], Any], hb: Heartbeat, control: Callable[[], Any] | None
    ) -> bool:
        control = control or conn
        st, reg = self.state, self.registry
        try:
            if hb.code is HeartbeatCode.NOT_REGISTERED:
                st.lost_registrations += 1  # what it read before is judged again (execution)
                log.warning(
                    "agent %s: registration lost (evicted or flushed): registering again",
                    self.agent_id,
                )
                call = reg.register_call(self.agent_id, **self._register_kw())
                reg.check_registration(self.agent_id, self.version, call.run_sync(control()))
                create_groups_sync(conn(), self.keys.inboxes(self.agent_id))
            elif hb.code is HeartbeatCode.STALE:
                raise StaleRegistration(
                    f"a newer registration of this agent_id exists ({self._newer(control)}); "
                    "this process exits with code 0. To run several copies of one agent, "
                    "give each its own agent_id (reach worker --agent-id ID, or --instances N)"
                )
            elif hb.draining and not st.stop_requested.is_set():
                log.info("agent %s: drain requested by an operator", self.agent_id)
                st.request_stop()
        except StaleRegistration as e:
            log.error("agent %s: stopping: %s", self.agent_id, e)
            st.stale = True
            st.request_stop()
            return False
        st.beat_ok_at = time.monotonic()
        self.outages.ok()
        return True

    def _newer(self, conn: Callable[[], Any]) -> str:
        """Who holds this agent_id now, as its registration says (best effort)."""
        try:
            inst, host, pid = (
                v.decode(errors="replace") if isinstance(v, bytes) else (v or "?")
                for v in conn().hmget(self.keys.agent(self.agent_id), "instance_id", "host", "pid")
            )
        except (rexc.RedisError, OSError, ValueError):
            return "its holder unknown"
        return f"instance {inst} on host {host} (pid {pid})"

    # -- stopping -----------------------------------------------------------------------
    async def watch_stop(self) -> None:
        """Turn a stop request (from any thread) into the consumer's stop."""
        while not self.state.stop_requested.is_set():
            await anyio.sleep(0.05)
        self.state.stopping.set()

    async def signals(self, scope: anyio.CancelScope) -> None:
        """First SIGTERM/SIGINT: drain. Second: cancel ``scope`` (stop at once)."""
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            n = 0
            async for sig in sigs:
                n += 1
                if n == 1:
                    log.info("signal %s: draining (again to stop at once)", sig)
                    self.state.request_stop()
                else:
                    log.warning("second signal: stopping without draining")
                    scope.cancel()
                    return


HEARTBEAT_BATCH = 100
"""Agents renewed by one ``heartbeat_many.lua`` call (the calls of a round go in one
pipeline): a few hundred microseconds of Redis time per call, so no call holds the
server long."""


LOOP_PICKUP_S = 1.0
"""How long the heartbeat thread waits for the round an agent's event loop sends before
sending it itself, on a connection of its own (a handler blocks the loop, or the loop is
too busy to get to it); half the lease's slack (``lease_s - heartbeat_s``) when that is
shorter, so the lease is still renewed in time. Both may reach Redis: a second renewal
does no harm."""

LOOP_PICKUP_MIN_S = 0.2
"""Leases whose slack leaves less than this to wait for the loop (sub-second test leases:
0.3 s with a 0.1 s heartbeat) are renewed by the thread itself, on its own connection, as
soon as due: a busy loop must not cost such a lease."""


@dataclass(eq=False, slots=True)
class _Member:
    liveness: Liveness
    due: float  # monotonic time of its next heartbeat

    @property
    def period(self) -> float:
        return self.liveness.opts.heartbeat_s

    @property
    def slack_s(self) -> float:
        """How late a renewal may be and still find the lease running."""
        o = self.liveness.opts
        return o.lease_s - o.heartbeat_s


_Batch = list[tuple[_Member, Beat]]


class Heartbeats:
    """The heartbeat thread of one process and one Redis URL, shared by every agent the
    process runs there (``Agent.run()`` calls in one event loop or in several).

    Each agent is due every ``heartbeat_s`` of its own; a round renews every agent due now
    and those due within half their period (so agents started at different times fall
    into step and are renewed together): one pipeline of the ``XLEN``s of their inboxes,
    then one ``heartbeat_many.lua`` call per registry shard and :data:`HEARTBEAT_BATCH`
    agents, all in one pipeline (on a Cluster, per node, sent together). The thread keeps
    the time; the round of the agents of one event loop is sent by that loop, on the
    process's auto-pipelined client (no connection of its own: a worker process holds 3
    connections on standalone Redis, 2 per master on a Cluster). A round the loop has not
    got answered within :data:`LOOP_PICKUP_S` (a handler blocking it) is sent by the
    thread on a connection of its own (:func:`run_sync`), closed once every loop answers
    again. An agent whose event loop has made no progress for ``stall_s`` is left out of
    the round (and so evicted in time); every answer is handled per agent
    (:meth:`Liveness.answered`). A failed round is logged by every agent in it and retried
    at the next due time.
    """

    _hubs: ClassVar[dict[str, Heartbeats]] = {}
    _hubs_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str, registry_url: str | None = None) -> None:
        self.url = url
        self.registry_url = registry_url  # the control plane's Redis, when apart
        self._hub_key = url if registry_url is None else f"{url} {registry_url}"
        self._rc: Any = None  # the thread's own connection to registry_url
        self._members: list[_Member] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="reach-heartbeat", daemon=True)
        self._r: Any = None  # the thread's own connection, while a loop is blocked
        self.turned_at = time.monotonic()  # the thread last came round its loop
        self.rounds = 0  # rounds sent (for tests and benchmarks)
        self.fallbacks = 0  # rounds the thread sent itself (a blocked loop)

    @classmethod
    def join(cls, url: str, liveness: Liveness, *, registry_url: str | None = None) -> Heartbeats:
        """Add ``liveness``'s agent to the process's heartbeat thread for ``url`` (and
        ``registry_url``: the control plane apart) (started here for the first one); its
        first heartbeat is due after ``heartbeat_s``."""
        key = url if registry_url is None else f"{url} {registry_url}"
        with cls._hubs_lock:
            hub = cls._hubs.get(key)
            if hub is None:
                hub = cls._hubs[key] = Heartbeats(url, registry_url)
                hub._thread.start()
            with hub._lock:
                hub._members.append(_Member(liveness, time.monotonic() + liveness.opts.heartbeat_s))
            hub._wake.set()
            return hub

    def leave(self, liveness: Liveness) -> None:
        """Stop renewing ``liveness``'s agent; the last one to leave stops the thread."""
        with Heartbeats._hubs_lock:
            with self._lock:
                self._members = [m for m in self._members if m.liveness is not liveness]
                last = not self._members
            if last:
                self._stopped = True
                if Heartbeats._hubs.get(self._hub_key) is self:
                    del Heartbeats._hubs[self._hub_key]
        self._wake.set()
        if last and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    @classmethod
    def running(cls) -> int:
        """Heartbeat threads running in this process (one per Redis URL in use)."""
        with cls._hubs_lock:
            return len(cls._hubs)

    def quiet_s(self) -> float | None:
        """How long since the thread last came round its loop (None: it has ended)."""
        if not self._thread.is_alive():
            return None
        return time.monotonic() - self.turned_at

    def _next_wait(self) -> float:
        with self._lock:
            if not self._members:
                return 1.0
            return max(0.0, min(m.due for m in self._members) - time.monotonic())

    def _due(self) -> list[_Member]:
        now = time.monotonic()
        with self._lock:
            if not any(m.due <= now for m in self._members):
                return []
            due = [m for m in self._members if m.due <= now + m.period / 2]
            for m in due:
                m.due = now + m.period
            return due

    def _run(self) -> None:
        while not self._stopped:
            self.turned_at = time.monotonic()
            self._wake.wait(self._next_wait())
            self._wake.clear()
            if self._stopped:
                break
            due = [m for m in self._due() if not self._withheld(m)]
            if not due:
                continue
            by_loop: dict[asyncio.AbstractEventLoop | None, list[_Member]] = {}
            for m in due:
                by_loop.setdefault(m.liveness.loop, []).append(m)
            sent = [(members, self._send(loop, members)) for loop, members in by_loop.items()]
            fell_back = False
            for members, fut in sent:
                fell_back |= self._finish(members, fut)
            if not fell_back:
                self._close()  # every loop answers again: no connection of its own
        self._close()

    def _send(
        self, loop: asyncio.AbstractEventLoop | None, due: list[_Member]
    ) -> concurrent.futures.Future[Any] | None:
        """Hand the round of ``due`` to their event loop (None: the thread sends it, the
        loop is gone or the leases too short to wait for it)."""
        if loop is None or loop.is_closed() or self._pickup_s(due) < LOOP_PICKUP_MIN_S:
            return None
        try:
            return asyncio.run_coroutine_threadsafe(self._round_async(due), loop)
        except RuntimeError:  # the loop closed meanwhile
            return None

    def _finish(self, due: list[_Member], fut: concurrent.futures.Future[Any] | None) -> bool:
        """Wait for the round sent by the loop, or, when it is not answered within
        :data:`LOOP_PICKUP_S` (the loop is blocked, or too busy to get to it), send it from
        here; True when it was sent here."""
        here = False
        try:
            try:
                if fut is None:
                    raise TimeoutError
                batches, answers = fut.result(timeout=self._pickup_s(due))
            except TimeoutError:
                if fut is not None:
                    fut.cancel()  # if it went out anyway, a second renewal does no harm
                if self._stopped:  # the last agent left (its loop may be the one waiting)
                    return False
                here = True
                self.fallbacks += 1
                batches, answers = self._round_sync(due)
            self._answer(batches, answers)
            for m in due:
                m.liveness.outages.ok()
        except (rexc.RedisError, OSError, concurrent.futures.CancelledError) as e:
            for m in due:
                m.liveness.outages.failed("heartbeat", e)
            if here:
                self._close()
        except Exception:  # a bug, not Redis: the thread must go on renewing leases
            log.exception("heartbeat round failed; the next one tries again")
        return here

    @staticmethod
    def _pickup_s(due: list[_Member]) -> float:
        return min(LOOP_PICKUP_S, *(m.slack_s / 2 for m in due))

    def _conn(self) -> Any:
        """The thread's own connection (opened when first needed)."""
        if self._r is None:
            self._r = connect_sync(self.url)
        return self._r

    def _control(self) -> Any:
        """The thread's own connection to the registry's Redis (the data one's unless the
        control plane is apart)."""
        if self.registry_url is None:
            return self._conn()
        if self._rc is None:
            self._rc = connect_sync(self.registry_url)
        return self._rc

    def _close(self) -> None:
        r, self._r = self._r, None
        rc, self._rc = self._rc, None
        for c in (r, rc):
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001, S110 - closing a broken connection
                    pass

    @staticmethod
    def _withheld(m: _Member) -> bool:
        stalled = m.liveness.stalled_s()
        if stalled:
            log.error(
                "agent %s: event loop made no progress for %.1fs: heartbeats withheld",
                m.liveness.agent_id,
                stalled,
            )
        return bool(stalled)

    @staticmethod
    def _inboxes(due: list[_Member]) -> list[str]:
        return [k for m in due for k in m.liveness.keys.inboxes(m.liveness.agent_id)]

    def _plan(self, due: list[_Member], lengths: list[int]) -> tuple[list[_Batch], list[Call[Any]]]:
        """The heartbeat calls of ``due`` given their inbox lengths: one
        ``heartbeat_many.lua`` call per registry shard (one slot) and HEARTBEAT_BATCH agents."""
        self.rounds += 1
        by_shard: dict[tuple[str, int], list[tuple[_Member, Beat]]] = {}
        for i, m in enumerate(due):
            lv, st = m.liveness, m.liveness.state
            depths = lengths[3 * i : 3 * i + 3]
            lv.hooks.on_heartbeat(st, dict(zip(PRIORITIES, depths, strict=True)))
            # What a Client needs to route by free capacity: slots, what fills them, and how
            # long a slot stays taken (docs/routing.md, "Free capacity").
            handler_us = round(st.handler_s * 1e6) if st.handler_s is not None else 0
            beat = Beat(
                lv.agent_id,
                st.instance_id,
                lv.version,
                sum(depths),
                st.inflight,
                lv.opts.concurrency,
                handler_us,
                st.cap_us(),
            )
            where = (lv.registry.namespace, lv.registry.shard_of(lv.agent_id))
            by_shard.setdefault(where, []).append((m, beat))
        batches = [
            group[at : at + HEARTBEAT_BATCH]
            for group in by_shard.values()
            for at in range(0, len(group), HEARTBEAT_BATCH)
        ]
        calls = [
            batch[0][0].liveness.registry.heartbeat_many_call([b for _, b in batch])
            for batch in batches
        ]
        return batches, calls

    async def _round_async(self, due: list[_Member]) -> tuple[list[_Batch], list[Any]]:
        """One round on the agents' event loop, on its auto-pipelined client (the
        process's multiplexed connection, one per master on a Cluster)."""
        r = due[0].liveness.redis
        pipe = r.pipeline(transaction=False)
        inboxes = self._inboxes(due)
        for k in inboxes:
            pipe.xlen(k)
        # The clock offset, measured again in the same round trip: a plain TIME on one
        # server; on a Cluster server_time.lua, keyed to the registry's node (a keyless
        # TIME would take a connection of its own to some master).
        lv = due[0].liveness
        timer = lv.registry.scripts.server_time().op() if lv.cluster else ("TIME",)
        pipe.execute_command(*timer)
        t0 = CLOCK.local_s()
        replies = await pipe.execute(raise_on_error=False)
        t1 = CLOCK.local_s()
        for x in replies[: len(inboxes)]:
            if isinstance(x, Exception):
                raise x
        clock = replies[len(inboxes)]
        if isinstance(clock, Exception):  # the offset is kept: the leases matter more
            log.debug("could not read Redis's clock: %s", clock)
        else:
            CLOCK.observe(clock, t0, t1)
        lengths = [int(x) for x in replies[: len(inboxes)]]
        batches, calls = self._plan(due, lengths)
        # The registry's connection (the control plane may be on a Redis of its own).
        replies = await run_pipeline(lv.registry.redis, [c.op() for c in calls])
        answers = []
        for c, x in zip(calls, replies, strict=True):
            if isinstance(x, Exception):
                raise x
            answers.append(c.decode(x))
        return batches, answers

    def _round_sync(self, due: list[_Member]) -> tuple[list[_Batch], list[Any]]:
        """One round from this thread, on its own connection (the loop is blocked)."""
        r = self._conn()
        pipe = r.pipeline(transaction=False)
        for k in self._inboxes(due):
            pipe.xlen(k)
        lengths = [int(x) for x in pipe.execute()]
        batches, calls = self._plan(due, lengths)
        return batches, run_sync(self._control(), calls)

    def _answer(self, batches: list[_Batch], answers: list[Any]) -> None:
        for batch, hbs in zip(batches, answers, strict=True):
            for (m, _), hb in zip(batch, hbs, strict=True):
                if not m.liveness.answered(self._conn, hb, self._control):
                    self.leave(m.liveness)


def run_sync(r: Any, calls: Sequence[Call[Any]]) -> list[Any]:
    """Run ``calls`` on a synchronous client and return their decoded replies: in one
    pipeline (on a Cluster, one per node, sent together: ``EVALSHA`` through
    ``execute_command``, which redis-py's cluster pipeline routes by the call's first key;
    a registry of several shards has one call per shard in a round). NOSCRIPT (a restarted
    or failed-over server) loads the scripts refused (every primary) and sends just those
    again; any other error reply is raised."""
    if not calls:
        return []
    if len(calls) == 1:
        return [calls[0].run_sync(r)]
    pipe = r.pipeline(transaction=False)
    for c in calls:
        pipe.execute_command(*c.op())
    replies: list[Any] = pipe.execute(raise_on_error=False)
    again = [i for i, x in enumerate(replies) if isinstance(x, Exception) and is_noscript(x)]
    if again:
        for name in {calls[i].script for i in again}:
            r.script_load(script(name).source)
        pipe = r.pipeline(transaction=False)
        for i in again:
            pipe.execute_command(*calls[i].op())
        for i, x in zip(again, pipe.execute(raise_on_error=False), strict=True):
            replies[i] = x
    out = []
    for c, x in zip(calls, replies, strict=True):
        if isinstance(x, Exception):
            raise x
        out.append(c.decode(x))
    return out

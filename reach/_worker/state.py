"""What the worker's parts share: the parts' common wiring (:class:`Shared`, :class:`Part`),
counters, flags and the outage log. Bookkeeping only."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from redis import exceptions as rexc

from .. import logs
from ..callpath import SelfSlots
from ..connection import AnyRedis, as_text
from ..keys import Keys
from ..registry import AgentInfo
from .hookchain import HookChain
from .items import Delivery, Settleable

if TYPE_CHECKING:
    from .._sessions.store import SessionStore
    from ..agent import Agent, HandlerSpec, RuntimeOptions

log = logging.getLogger("reach.runtime")

CAP_US_MAX_BYTES = 65536
"""The most a heartbeat reports of per-capability run times (heartbeat.lua's bound)."""


class WorkerState:
    """The running worker's shared state (also what hooks see as ``WorkerInfo``)."""

    def __init__(self, agent_id: str, instance_id: str, namespace: str) -> None:
        self.agent_id = agent_id
        self.instance_id = instance_id
        self.namespace = namespace
        self.inflight = 0  # handed to the handler pool: running, or queued for a slot
        self.handler_s: float | None = None  # recent handlers' mean run time (EWMA)
        # per capability: the mean run time of a message of cost 1 (EWMA), what callers
        # route by (docs/routing.md, "Cost-aware routing")
        self.cap_s: dict[str, float] = {}
        self.ready = False  # as last set in the registry
        self.draining = False
        self.stale = False  # a newer registration of this agent_id exists: do not deregister
        self.stopping = anyio.Event()  # the consumer stops reading
        self.stop_requested = threading.Event()  # from any thread: stop() or a signal
        self.held: set[tuple[str, str]] = set()  # (stream, entry id) dispatched, not settled
        self.running: set[str] = set()  # idempotency keys claimed here and not yet settled
        self.rescan = False  # look for this agent's pending entries at the next turn
        self.consumer_tick = time.monotonic()  # the consumer came round its loop
        self.loop_tick = time.monotonic()  # the event loop made progress
        self.beat_ok_at = time.monotonic()  # registered, or a heartbeat answered (its lease runs)
        # Times its registration was found lost (evicted: its claims may have been taken over)
        self.lost_registrations = 0
        self._slot_free = anyio.Event()
        self._slot_wanted = False  # someone waits in wait_slot: a freed slot is news
        self.plain = PlainRuns()
        self.predecessor: Predecessor | None = None  # the live process replaced at start
        self.self_slots: SelfSlots | None = None  # handlers' calls to this agent (callpath)
        self.sessions: SessionStore | None = None  # what ctx.session is (reach._sessions)

    def handler_ran(self, duration_s: float, capability: str = "", cost: float = 1.0) -> None:
        """Note one handler's run time in :attr:`handler_s` and, divided by the message's
        ``cost``, in its ``capability``'s :attr:`cap_s` (weight 1/16 each)."""
        h = self.handler_s
        self.handler_s = duration_s if h is None else h + (duration_s - h) * 0.0625
        if capability:
            unit = duration_s / cost
            c = self.cap_s.get(capability)
            self.cap_s[capability] = unit if c is None else c + (unit - c) * 0.0625

    def cap_us(self) -> str:
        """:attr:`cap_s` as a heartbeat reports it: ``"<capability>=<µs> ..."``, sorted,
        at most :data:`CAP_US_MAX_BYTES` of it (``""``: nothing measured yet)."""
        out, size = [], 0
        for cap in sorted(self.cap_s):
            item = f"{cap}={round(self.cap_s[cap] * 1e6)}"
            size += len(item) + 1
            if size > CAP_US_MAX_BYTES:
                break
            out.append(item)
        return " ".join(out)

    def request_stop(self) -> None:
        self.stop_requested.set()

    def slot_freed(self) -> None:
        """A handler finished: wake whoever waits for a free slot (every handler calls
        this: a flag read, where setting the event again is two calls)."""
        if self._slot_wanted:
            self._slot_wanted = False
            self._slot_free.set()

    async def wait_slot(self) -> None:
        """Wait (at most a second) for a handler to finish."""
        self._slot_free = anyio.Event()
        self._slot_wanted = True
        with anyio.move_on_after(1.0):
            await self._slot_free.wait()

    def release(self, items: Iterable[Settleable]) -> None:
        """The items are settled (or left pending for the next scan): no longer held."""
        for it in items:
            self.held.discard((it.stream, as_text(it.entry_id)))
            if isinstance(it, Delivery) and it.fence:
                self.running.discard(it.key)


EVICTED_GRACE_MIN_MS = 1_000
"""The least time an evicted owner's claims still stand after its eviction (see
:func:`owner_may_run`)."""


def owner_may_run(info: AgentInfo, instance_id: str, now_ms: int) -> bool:
    """Whether the runtime ``instance_id`` of the registration ``info`` may still be running
    a message it claimed. Registered as that instance and not evicted: yes. Evicted: for
    one lease (at least :data:`EVICTED_GRACE_MIN_MS`) after its eviction, still yes. An
    agent is evicted when its heartbeats stop reaching Redis, which a Redis outage longer
    than its lease does to a live process as well as a crash does to a dead one; the live
    one registers again at its next heartbeat once Redis is back, and until then a peer
    taking its claims over would run its messages a second time beside it."""
    if info.instance_id != instance_id:
        return False
    if info.state != "evicted":
        return True
    return now_ms - info.state_ms < max(info.lease_ms, EVICTED_GRACE_MIN_MS)


@dataclass(frozen=True, slots=True)
class Predecessor:
    """The process this one replaced at its registration (same agent_id) while that one's
    lease still ran: a rolling restart that started this process before the older one had
    finished. Its claims are taken for a live runtime's (its running handlers finish and
    settle) unless it is provably gone (:meth:`provably_gone`)."""

    owner: str  # "agent_id/instance_id", as its claims name it
    host: str  # '' when its registration stored none
    pid: int  # 0 when its registration stored none

    def provably_gone(self) -> bool:
        """Whether this host can tell the predecessor's process has ended: it ran here
        (same host name) and its pid runs nothing but a zombie, or its pid is this
        process's own (a container restarted with the same host name reuses its pid). A
        predecessor on another host, or one that stored no pid, is never provably gone."""
        if not self.pid or not self.host or self.host != socket.gethostname():
            return False
        if self.pid == os.getpid():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # PermissionError: a process of another user runs there
            return False
        return _zombie(self.pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits for its parent to reap it (Linux /proc; False
    where it cannot be read): a killed child of a supervisor that has not waited for it yet
    still answers ``kill(pid, 0)``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ')'
    fields = stat[stat.rfind(b")") + 1 :].split()
    return bool(fields) and fields[0] == b"Z"


class PlainRuns:
    """Plain (non-async) handlers running in worker threads. A thread cannot be cancelled:
    cancelling its handler only stops waiting for it, and it runs on, so a worker that
    left now would let its message run elsewhere meanwhile. The drain waits for these."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0

    def tracked(self, spec: HandlerSpec) -> HandlerSpec:
        """``spec`` with its function counted in :attr:`running` while it runs."""
        fn = spec.fn

        def counted(payload: Any, ctx: Any) -> Any:
            with self._lock:
                self.running += 1
            try:
                return fn(payload, ctx)
            finally:
                with self._lock:
                    self.running -= 1

        return dataclasses.replace(spec, fn=counted)


class Outages:
    """How the worker's loops log Redis failures: an outage (Redis away) is one line when
    it starts, a reminder every 30 s and one line when it ends, for all loops together;
    a refusal is one line per kind of call at most every 30 s."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self._redis_down = logs.OutageLog(log, f"agent {agent_id}: Redis")
        self._refusals: dict[str, logs.OutageLog] = {}

    def failed(self, what: str, e: BaseException) -> None:
        """A Redis call of one of the loops failed (the loop retries)."""
        if isinstance(e, (rexc.ConnectionError, rexc.TimeoutError, OSError)):
            self._redis_down.failed(f"{what}: {type(e).__name__}: {e}")
        else:  # a refusal, not an outage: say which call, at most once per 30 s per kind
            kind = what.split(" ")[0]
            self._refusals.setdefault(
                kind, logs.OutageLog(log, f"agent {self.agent_id}: {kind}")
            ).failed(f"{type(e).__name__}: {e}")

    def ok(self) -> None:
        """A Redis call succeeded (ends an outage, if there was one)."""
        self._redis_down.ok()


@dataclass(frozen=True, slots=True)
class Shared:
    """What every part of one running worker works with: the agent and its options, the
    shared state, its keys, the Redis client (``cluster``: a Redis Cluster), the hook chain
    and the outage log. The runtime makes one and hands it to each part."""

    agent: Agent
    opts: RuntimeOptions
    state: WorkerState
    keys: Keys
    redis: AnyRedis
    cluster: bool
    hooks: HookChain
    outages: Outages
    # The control plane's client (registry, limits, audit, access rules): ``redis`` unless
    # the namespace keeps it on a Redis of its own (``registry_url``).
    control: AnyRedis | None = None


class Part:
    """A part of the running worker (consumer, execution, settlement): :class:`Shared`'s
    fields as its attributes, and ``agent_id``."""

    def __init__(self, shared: Shared) -> None:
        self.agent = shared.agent
        self.agent_id = shared.agent.agent_id
        self.opts = shared.opts
        self.state = shared.state
        self.keys = shared.keys
        self.redis = shared.redis
        self.control = shared.redis if shared.control is None else shared.control
        self.cluster = shared.cluster
        self.hooks = shared.hooks
        self.outages = shared.outages

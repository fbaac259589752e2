"""Prometheus metrics of the fabric (``reach_`` prefix), for agents and clients alike.

Everything is registered in prometheus-client's default registry, so one ``/metrics``
endpoint per process shows reach's series next to the process's own. Serve it with
``reach worker --metrics-port P`` or, in any process, :func:`serve`::

    import reach.metrics
    reach.metrics.serve(9464)

(``reach worker`` serves the probes ``/healthz`` and ``/readyz`` on the same port:
:mod:`reach.health`.)

Series (labels in braces; every label has a small, bounded set of values: never a msg_id,
session or trace id, and capability names beyond :data:`MAX_CAPABILITIES` are folded
into ``_other``):

=========================================  ===========================================
``reach_messages_sent_total``              {capability, priority} added to an inbox
``reach_messages_delivered_total``         {capability, priority} read by an agent
``reach_messages_acked_total``             {capability, outcome} settled and acked
``reach_messages_retried_total``           {capability} scheduled for another attempt
``reach_messages_dead_lettered_total``     {capability, reason}
``reach_messages_expired_total``           {capability, reason} deadline passed
``reach_messages_fenced_total``            {capability} late completion refused
``reach_outcomes_dropped_total``           {capability} outcome let go unwritten
``reach_idempotent_replays_total``         {capability} stored result replayed
``reach_handler_duration_seconds``         histogram {capability, outcome, version}
``reach_queue_wait_seconds``               histogram {priority}: handler start - sent_ms
``reach_inflight_messages``                gauge {agent_id}: handlers running
``reach_inbox_depth``                      gauge {agent_id, priority}: XLEN at heartbeat
``reach_registry_agents``                  gauge {state}: exported by the sweeper lock holder
``reach_registry_agents_routable``         gauge: active, ready, not draining (the same)
``reach_breaker_transitions_total``        {from_state, to_state}
``reach_breakers_open``                    gauge: breakers open in this process
``reach_client_requests_total``            {capability, outcome} request() outcomes
``reach_client_request_duration_seconds``  histogram {capability, outcome}
``reach_client_buffered_total``            {capability} held locally: Redis unreachable
``reach_client_buffer_dropped_total``      {capability, reason} held, never sent
``reach_client_buffer_messages``           gauge: messages held locally now
``reach_session_degraded_total``           {capability, op} best-effort session ops failed
``reach_session_cache_total``              {result} cached-tier reads: hit, miss
=========================================  ===========================================

``outcome`` of acked messages: succeeded, dead, expired, retrying, replayed, parked,
malformed. ``outcome`` of handlers: succeeded, error, timeout, rejected. ``outcome`` of
client requests: succeeded, remote_error, rejected, deadline, no_agent, error.
``version`` of handlers: the application version the agent runs (``Agent(version=)``,
``""`` when none; one per process), so a canary's errors and latency compare with the
stable version's (``sum by (version) (rate(reach_handler_duration_seconds_count[5m]))``
counts the messages each version handled).

Counters and histograms are noted as they happen and added to their series when the
registry is read (a scrape): a message costs an append per series, not prometheus-client's
locked increments (a ``/metrics`` reader sees everything counted until its read). A read
of a restricted registry (``name[]`` in the scrape's URL) does not fold them: scrape all.

An agent reports through :class:`MetricsHooks`, one of its built-in hooks (reach.hooks);
the client calls :func:`message_sent`, :func:`client_reply` and :func:`breaker_transition`
(see ``reach/client.py``).
The ``reach_inflight_messages`` and ``reach_inbox_depth`` series of an agent are removed
when it stops (:func:`forget_agent`). The two registry gauges count the whole namespace;
only the process whose runtime holds the sweeper lock exports samples of them (every other
process declares them with none, never a 0): across a fleet, read them with ``max()``.
"""

from __future__ import annotations

import bisect
import collections
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from . import errors
from .envelope import Envelope, now_ms
from .hooks import Hooks, Outcome, WorkerInfo
from .keys import PRIORITIES
from .outcomes import DEAD_LETTERED, DeadReason, HandlerResult, RequestOutcome, Settled, Status
from .registry import Registry
from .tasks import MALFORMED_CAP

if TYPE_CHECKING:
    from .context import Context

__all__ = [
    "COUNT_SAMPLE",
    "MAX_CAPABILITIES",
    "MetricsHooks",
    "breaker_transition",
    "client_outcome",
    "client_reply",
    "count_agents",
    "dead_lettered",
    "delivered",
    "expired",
    "fenced",
    "forget_agent",
    "handler_done",
    "handler_outcome",
    "inbox_depth",
    "message_sent",
    "on_breaker_change",
    "outcome_dropped",
    "queue_wait",
    "registry_counts",
    "registry_counts_wanted",
    "replayed",
    "serve",
    "settled",
    "track_inflight",
]

MAX_CAPABILITIES = 500
"""Distinct capability label values kept per process; more are counted as ``_other``."""

# Agents' handlers range from microseconds (tools) to minutes (LLM calls).
DURATION_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


class _Tally:
    """The counters and histograms of the message path, noted as they happen and added to
    their prometheus series when the registry is read (a scrape, ``get_sample_value``).

    A message's counts cost an append each (a deque: appends and pops are thread-safe
    without a lock) instead of a prometheus child's locked increments per series and a
    Python loop over the buckets per histogram observation. A read folds what was noted:
    summed per series, then one increment per series and bucket. Unread, the notes are
    folded every :data:`FOLD_AT` by whoever notes one (memory stays bounded; a fold costs
    a dict update per note). It is registered in the default registry before the series,
    so a read folds it first.

    Histograms are folded into prometheus-client's own bucket values (its ``_buckets``
    and ``_sum``, checked once at import: :data:`_FOLD_HISTOGRAMS`); without them,
    observations go to ``observe()`` as they come.
    """

    FOLD_AT = 16_384

    def __init__(self) -> None:
        # (metric, labels, None) for a count, (metric, labels, value) for an observation,
        # (metric, labels, [value, ...]) for observations a worker gathered over a batch
        self._notes: collections.deque[tuple[Any, tuple[str, ...], float | list[float] | None]] = (
            collections.deque()
        )
        # (metric, labels, n): counts a worker added up over a batch
        self._many: collections.deque[tuple[Any, tuple[str, ...], int]] = collections.deque()
        self._folding = threading.Lock()  # one fold at a time

    def count(self, metric: Any, labels: tuple[str, ...]) -> None:
        notes = self._notes
        notes.append((metric, labels, None))
        if len(notes) >= self.FOLD_AT:
            self.fold(wait=False)

    def count_many(self, metric: Any, labels: tuple[str, ...], n: int) -> None:
        many = self._many
        many.append((metric, labels, n))
        if len(many) >= self.FOLD_AT:
            self.fold(wait=False)

    def observe(self, metric: Any, labels: tuple[str, ...], value: float) -> None:
        if not _FOLD_HISTOGRAMS:
            _child(metric, *labels).observe(value)
            return
        notes = self._notes
        notes.append((metric, labels, value))
        if len(notes) >= self.FOLD_AT:
            self.fold(wait=False)

    def observe_many(self, metric: Any, labels: tuple[str, ...], values: list[float]) -> None:
        """:meth:`observe` of each of ``values`` (kept, not copied: the caller lets go)."""
        if not _FOLD_HISTOGRAMS:
            child = _child(metric, *labels)
            for v in values:
                child.observe(v)
            return
        notes = self._notes
        notes.append((metric, labels, values))
        if len(notes) >= self.FOLD_AT:
            self.fold(wait=False)

    def fold(self, *, wait: bool = True) -> None:
        """Add what was noted since the last fold to the prometheus series (``wait``:
        False skips it when another thread is folding)."""
        if not self._folding.acquire(blocking=wait):
            return
        try:
            counts: dict[tuple[Any, tuple[str, ...]], int] = {}
            # Per histogram child: one count per bucket (the last is +Inf), then the sum.
            hists: dict[tuple[Any, tuple[str, ...]], list[float]] = {}
            pop, first_at_least = self._notes.popleft, bisect.bisect_left
            # What was noted when the fold began (notes added meanwhile wait for the next):
            # counted up front, no IndexError per fold to catch.
            for _ in range(len(self._notes)):
                metric, labels, value = pop()
                key = (metric, labels)
                if value is None:
                    counts[key] = counts.get(key, 0) + 1
                    continue
                h = hists.get(key)
                if h is None:
                    h = hists[key] = [0.0] * (len(_BOUNDS) + 1)
                for v in value if isinstance(value, list) else (value,):  # observe_many's
                    h[first_at_least(_BOUNDS, v)] += 1  # the first bound >= v
                    h[-1] += v
            take = self._many.popleft
            for _ in range(len(self._many)):
                metric, labels, n = take()
                key = (metric, labels)
                counts[key] = counts.get(key, 0) + n
            for (metric, labels), n in counts.items():
                _child(metric, *labels).inc(n)
            for (metric, labels), h in hists.items():
                child = _child(metric, *labels)
                for i, k in enumerate(h[:-1]):
                    if k:
                        child._buckets[i].inc(k)
                child._sum.inc(h[-1])
        finally:
            self._folding.release()

    def collect(self) -> Iterable[Any]:
        self.fold()
        return ()

    def describe(self) -> Iterable[Any]:
        return ()


def _folds_histograms() -> bool:
    """Whether prometheus-client's histograms keep their buckets as this module expects."""
    probe = Histogram("reach_probe", "probe", buckets=DURATION_BUCKETS, registry=None)
    buckets, total = getattr(probe, "_buckets", None), getattr(probe, "_sum", None)
    return (
        isinstance(buckets, list)
        and len(buckets) == len(_BOUNDS)
        and all(hasattr(b, "inc") for b in buckets)
        and hasattr(total, "inc")
        and list(getattr(probe, "_upper_bounds", ())) == list(_BOUNDS)
    )


_BOUNDS = (*DURATION_BUCKETS, float("inf"))
_FOLD_HISTOGRAMS = _folds_histograms()
_TALLY = _Tally()
REGISTRY.register(_TALLY)  # before the series: a read of the registry folds it first

SENT = Counter(
    "reach_messages_sent", "Messages added to an agent's inbox.", ["capability", "priority"]
)
DELIVERED = Counter(
    "reach_messages_delivered", "Inbox entries read by an agent.", ["capability", "priority"]
)
ACKED = Counter(
    "reach_messages_acked",
    "Inbox entries settled and acked, by outcome.",
    ["capability", "outcome"],
)
RETRIED = Counter(
    "reach_messages_retried", "Messages scheduled for another attempt.", ["capability"]
)
DEAD = Counter(
    "reach_messages_dead_lettered",
    "Messages moved to a dead-letter stream.",
    ["capability", "reason"],
)
EXPIRED = Counter(
    "reach_messages_expired", "Messages whose deadline passed.", ["capability", "reason"]
)
FENCED = Counter(
    "reach_messages_fenced",
    "Late completions refused because another owner took the message over.",
    ["capability"],
)
DROPPED = Counter(
    "reach_outcomes_dropped",
    "Outcomes a worker let go unwritten: Redis refused them past the most it holds.",
    ["capability"],
)
REPLAYS = Counter(
    "reach_idempotent_replays",
    "Deliveries answered with the stored result of their idempotency key.",
    ["capability"],
)
HANDLER = Histogram(
    "reach_handler_duration_seconds",
    "Time a handler ran.",
    ["capability", "outcome", "version"],
    buckets=DURATION_BUCKETS,
)
QUEUE_WAIT = Histogram(
    "reach_queue_wait_seconds",
    "From the envelope's sent_ms to its handler's start.",
    ["priority"],
    buckets=DURATION_BUCKETS,
)
INFLIGHT = Gauge("reach_inflight_messages", "Handlers running now.", ["agent_id"])
INBOX = Gauge(
    "reach_inbox_depth",
    "Entries in an agent's inbox stream (at its heartbeat).",
    ["agent_id", "priority"],
)


class _RegistryGauges:
    """``reach_registry_agents{state}`` and ``reach_registry_agents_routable``: the counts
    of the namespace's registry, as the runtime of this process that holds the sweeper
    lock last counted them (every few seconds, :func:`count_agents`).

    One runtime of the fleet counts the registry: the sweeper lock holder, with one
    ``count_agents.lua`` call per count (at most :data:`COUNT_SAMPLE` records read: exact
    up to that many agents, a scaled uniform sample above). Every other process exports the two series without samples
    (absent, never a 0 that reads as "nothing routable"): across a fleet, query
    ``max(reach_registry_agents_routable)``. Runtimes of one process keep their counts
    apart (``source``), so a runtime that does not hold the lock no longer wipes the
    counts of one that does; a runtime's counts go when it stops or loses the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_source: dict[object, tuple[dict[str, int], int]] = {}
        self.read_at = -math.inf  # time.monotonic() of the last collect (a scrape)

    def set(self, source: object, counts: Mapping[str, int] | None, routable: int) -> None:
        with self._lock:
            self._by_source.pop(source, None)
            if counts is not None:  # the latest counts are last: the ones exported
                self._by_source[source] = (
                    {s: int(counts.get(s, 0)) for s in REGISTRY_STATES},
                    int(routable),
                )

    def current(self) -> tuple[dict[str, int], int] | None:
        with self._lock:
            return next(reversed(self._by_source.values()), None)

    def collect(self) -> Iterable[Any]:
        self.read_at = time.monotonic()
        return self._families()

    def _families(self) -> list[Any]:
        agents = GaugeMetricFamily(
            "reach_registry_agents",
            "Registered agents by state (exported by the sweeper lock holder).",
            labels=["state"],
        )
        routable = GaugeMetricFamily(
            "reach_registry_agents_routable",
            "Agents active, ready and not draining (exported by the sweeper lock holder).",
        )
        now = self.current()
        if now is not None:
            counts, n = now
            for s in REGISTRY_STATES:
                agents.add_metric([s], counts[s])
            routable.add_metric([], n)
        return [agents, routable]

    def describe(self) -> Iterable[Any]:
        return self._families()  # not a read: registering the collector calls it


REGISTRY_STATES = ("active", "probation", "evicted")
_REGISTRY_GAUGES = _RegistryGauges()
REGISTRY.register(_REGISTRY_GAUGES)

BREAKER = Counter(
    "reach_breaker_transitions", "Circuit breaker state changes.", ["from_state", "to_state"]
)
BREAKERS_OPEN = Gauge("reach_breakers_open", "Circuit breakers open in this process.")
CLIENT = Counter(
    "reach_client_requests", "Request outcomes seen by callers.", ["capability", "outcome"]
)
REPLIES_DROPPED = Counter(
    "reach_client_replies_dropped",
    "Replies a client dropped unread by any call: reason unauthenticated (unsigned or "
    "forged, with a secret) or not_sent (to a message this client did not send).",
    ["reason"],
)
CLIENT_S = Histogram(
    "reach_client_request_duration_seconds",
    "From request() to its outcome, as the caller saw it.",
    ["capability", "outcome"],
    buckets=DURATION_BUCKETS,
)

BUFFERED = Counter(
    "reach_client_buffered",
    "Messages a client held locally because Redis was unreachable (sent when it is back).",
    ["capability"],
)
BUFFER_DROPPED = Counter(
    "reach_client_buffer_dropped",
    "Messages held locally and never sent (reason: deadline, age, error, cancelled, closed).",
    ["capability", "reason"],
)
BUFFER_HELD = Gauge(
    "reach_client_buffer_messages", "Messages the clients of this process hold locally now."
)

SESSION_DEGRADED = Counter(
    "reach_session_degraded",
    "Best-effort session operations that met a Redis error (op: read, a run's first read "
    "that failed, its context then empty; write, a run's writes let go).",
    ["capability", "op"],
)
SESSION_CACHE = Counter(
    "reach_session_cache",
    "Reads of cached-tier sessions: hit (served from the process's copy) or miss (read "
    "from Redis).",
    ["result"],
)

_lock = threading.Lock()
_caps: set[str] = set()
_children: dict[tuple[Any, ...], Any] = {}


def _cap(capability: str) -> str:
    if capability in _caps:
        return capability
    with _lock:
        if len(_caps) < MAX_CAPABILITIES:
            _caps.add(capability)
            return capability
    return "_other"


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, cached: the hot path pays one dict lookup."""
    key = (id(metric), *labels)
    c = _children.get(key)
    if c is None:
        c = _children[key] = metric.labels(*labels)
    return c


# -- client side ----------------------------------------------------------------------
def message_sent(capability: str, priority: str) -> None:
    """A message (or a retry) was added to an agent's inbox."""
    _TALLY.count(SENT, (_cap(capability), priority))


def messages_sent(capability: str, priority: str, n: int) -> None:
    """``n`` messages were added to inboxes (a batch: one note for all)."""
    _child(SENT, _cap(capability), priority).inc(n)


def client_reply_dropped(reason: str) -> None:
    """A client dropped a reply: ``unauthenticated`` or ``not_sent``."""
    _TALLY.count(REPLIES_DROPPED, (reason,))


def client_reply(capability: str, outcome: str, seconds: float) -> None:
    """A request() ended with ``outcome``, a :class:`reach.outcomes.RequestOutcome`
    (:func:`client_outcome` names the outcome of an exception)."""
    cap = _cap(capability)
    _TALLY.count(CLIENT, (cap, outcome))
    _TALLY.observe(CLIENT_S, (cap, outcome), max(0.0, seconds))


def buffer_held(capability: str) -> None:
    """A client held a message locally (Redis unreachable)."""
    _child(BUFFERED, _cap(capability)).inc()
    BUFFER_HELD.inc()


def buffer_released() -> None:
    """A message held locally left the buffer (sent, dropped or given up)."""
    BUFFER_HELD.dec()


def buffer_dropped(capability: str, reason: str) -> None:
    """A message held locally will never be sent: ``reason`` is deadline, age, error or
    closed."""
    _child(BUFFER_DROPPED, _cap(capability), reason).inc()


def session_degraded(capability: str, op: str) -> None:
    """A best-effort session met a Redis error: ``op`` is read (its run goes on with an
    empty context) or write (its run's writes were let go)."""
    _child(SESSION_DEGRADED, _cap(capability), op).inc()


def session_cache(result: str) -> None:
    """A cached-tier session read: ``hit`` or ``miss``."""
    _TALLY.count(SESSION_CACHE, (result,))


def client_outcome(exc: BaseException | None) -> RequestOutcome:
    """The ``outcome`` label of a request that ended with ``exc`` (None: succeeded)."""
    if exc is None:
        return RequestOutcome.SUCCEEDED
    for types, outcome in _OUTCOMES:
        if isinstance(exc, types):
            return outcome
    if type(exc).__name__ in ("CancelledError", "Cancelled"):
        return RequestOutcome.CANCELLED
    return RequestOutcome.ERROR


_OUTCOMES: tuple[tuple[Any, RequestOutcome], ...] = (
    (errors.RemoteError, RequestOutcome.REMOTE_ERROR),
    (errors.Rejected, RequestOutcome.REJECTED),
    (errors.NoAgentAvailable, RequestOutcome.NO_AGENT),  # Overloaded too
    ((errors.DeadlineExceeded, TimeoutError), RequestOutcome.DEADLINE),
)


def breaker_transition(agent_id: str, old: str, new: str) -> None:
    """A circuit breaker changed state. ``agent_id`` is not a label (agents come and go
    without bound); it is accepted so callers can pass a ``BreakerChange`` through
    :func:`on_breaker_change`."""
    _child(BREAKER, old, new).inc()
    if new == "open" and old != "open":
        BREAKERS_OPEN.inc()
    elif old == "open" and new != "open":
        BREAKERS_OPEN.dec()


def on_breaker_change(change: Any) -> None:
    """A ``reach.breaker.Breakers`` listener: ``breakers.listeners.append(on_breaker_change)``."""
    breaker_transition(change.agent_id, change.old, change.new)


# -- agent side -----------------------------------------------------------------------
def delivered(capability: str, priority: str) -> None:
    _TALLY.count(DELIVERED, (_cap(capability), priority))


def replayed(capability: str) -> None:
    _TALLY.count(REPLAYS, (_cap(capability),))


def queue_wait(priority: str, seconds: float) -> None:
    _TALLY.observe(QUEUE_WAIT, (priority,), max(0.0, seconds))


def handler_done(capability: str, outcome: str, seconds: float, version: str = "") -> None:
    """A handler returned or raised: ``outcome`` is a :class:`reach.outcomes.HandlerResult`;
    ``version`` the application version of the agent that ran it."""
    _TALLY.observe(HANDLER, (_cap(capability), outcome, version), max(0.0, seconds))


def dead_lettered(capability: str, reason: str) -> None:
    _TALLY.count(DEAD, (_cap(capability), reason))


def expired(capability: str, reason: str = DeadReason.EXPIRED) -> None:
    """A message's deadline passed outside any handler (e.g. while waiting for a retry in
    the delayed set) and it was dead-lettered: counts the expiry and the dead letter."""
    cap = _cap(capability)
    _TALLY.count(EXPIRED, (cap, reason))
    _TALLY.count(DEAD, (cap, reason))


def fenced(capability: str) -> None:
    _TALLY.count(FENCED, (_cap(capability),))


def outcome_dropped(capability: str) -> None:
    _TALLY.count(DROPPED, (_cap(capability),))


def settled(capability: str, outcome: str, reason: str = "", n: int = 1) -> None:
    """An inbox entry (``n`` alike) was settled (its completion accepted) and acked.

    ``outcome`` (a :class:`reach.outcomes.Settled`) dead, expired and malformed also count
    a dead letter (and expired an expiry), retrying counts a retry.
    """
    cap = _cap(capability)
    count = _TALLY.count if n == 1 else lambda m, labels: _TALLY.count_many(m, labels, n)
    count(ACKED, (cap, outcome))
    if outcome in DEAD_LETTERED:
        count(DEAD, (cap, reason or outcome))
    if outcome == Settled.EXPIRED:
        count(EXPIRED, (cap, reason or DeadReason.EXPIRED))
    elif outcome == Settled.RETRYING:
        count(RETRIED, (cap,))


def track_inflight(agent_id: str, fn: Callable[[], float]) -> None:
    """Export ``fn()`` (read at scrape time) as the agent's in-flight gauge."""
    INFLIGHT.labels(agent_id).set_function(fn)


def inbox_depth(agent_id: str, depths: Mapping[str, int] | Iterable[tuple[str, int]]) -> None:
    """Set the inbox depth per priority (called by the heartbeat with each XLEN)."""
    items = depths.items() if isinstance(depths, Mapping) else depths
    for prio, n in items:
        INBOX.labels(agent_id, prio).set(n)


def forget_agent(agent_id: str, priorities: Sequence[str] = PRIORITIES) -> None:
    """Drop an agent's gauges (it stopped); its counters stay, as counters should."""
    for metric, labels in [(INFLIGHT, (agent_id,))] + [(INBOX, (agent_id, p)) for p in priorities]:
        try:
            metric.remove(*labels)
        except KeyError:
            pass


def registry_counts(
    counts: Mapping[str, int] | None, routable: int = 0, *, source: object = None
) -> None:
    """Set the registry gauges from the counts of the runtime ``source`` (the one holding
    the sweeper lock); ``None`` withdraws that runtime's counts (it does not hold the
    lock, or stopped): with no counts left, this process exports none."""
    _REGISTRY_GAUGES.set(source, counts, routable)


COUNTS_WANTED_S = 600.0
"""The sweeper lock holder counts the registry for these gauges only while they are read:
for this long after the last read of the process's metrics (a scrape). A worker nobody
scrapes sends no count at all (an idle worker's Redis commands stay the same at any fleet
size); the first scrape after a quiet spell finds the two series absent, and the next
count, within about 5 s, fills them."""


def registry_counts_wanted() -> bool:
    """True when the registry gauges of this process were read (scraped) in the last
    :data:`COUNTS_WANTED_S` seconds: counting them is worth a script call."""
    return time.monotonic() - _REGISTRY_GAUGES.read_at < COUNTS_WANTED_S


COUNT_SAMPLE = 1000
"""Most agent records one count of the registry gauges reads (:func:`count_agents`): a
namespace of up to this many agents is counted exactly; a bigger one from a uniform random
sample of this many, scaled (see :func:`count_agents` for the error)."""


async def count_agents(
    redis: Any, keys: Any, *, sample: int = COUNT_SAMPLE
) -> tuple[dict[str, int], int]:
    """Count the namespace's agents by state, and the routable ones: one
    ``count_agents.lua`` call, reading at most ``sample`` records whatever the fleet size.

    Up to ``sample`` registered agents the counts are exact. Above, they are estimated from
    a uniform random sample of ``sample`` distinct agents, scaled by ``total / sample``:
    a state held by a share ``p`` of ``N`` agents is off by
    ``N * sqrt(p * (1 - p) / sample * (N - sample) / (N - 1))`` agents (one standard
    deviation; at most 1.6 % of N with the default 1,000, e.g. ±30 routable agents of
    10,000 when all but 1 % are routable, ±313 of 100,000). The sum of the states is the
    agents zset's size up to rounding (and ids without a record, which are not counted).

    ``keys`` names the registry's shards (``keys.shards``: one on a standalone Redis); each
    shard is counted (``sample`` spread over them) and scaled by its own ratio
    (:meth:`reach.registry.Registry.count_states`).
    """
    registry = Registry(redis, keys.namespace, shards=keys.shards)
    return await registry.count_states(sample=sample)


# -- the agent's hook -----------------------------------------------------------------
def handler_outcome(outcome: Outcome) -> HandlerResult:
    """The ``outcome`` label of a handler run that ended in ``outcome``."""
    if outcome.status == Status.SUCCEEDED or outcome.reason == DeadReason.BAD_RESULT:
        # it returned (a result that cannot be encoded is not the handler's error)
        return HandlerResult.SUCCEEDED
    if outcome.reason == DeadReason.TIMEOUT:
        return HandlerResult.TIMEOUT
    if outcome.reason in (DeadReason.REJECTED, DeadReason.REFUSED_BY_GUARD):
        return HandlerResult.REJECTED  # refused for what it is: not the handler's error
    if outcome.reason == DeadReason.CANCELLED:
        return HandlerResult.CANCELLED
    return HandlerResult.ERROR


class MetricsHooks(Hooks):
    """The agent side of the series above, fed by the worker's hook calls; ``version``:
    the agent's application version (the ``version`` label of its handlers' series)."""

    def __init__(self, version: str = "") -> None:
        self.version = version

    def on_start(self, worker: WorkerInfo) -> None:
        track_inflight(worker.agent_id, lambda: worker.inflight)

    def on_stop(self, worker: WorkerInfo) -> None:
        forget_agent(worker.agent_id)
        registry_counts(None, source=self)

    def on_heartbeat(self, worker: WorkerInfo, depths: Mapping[str, int]) -> None:
        inbox_depth(worker.agent_id, depths)

    def on_registry_counts(self, counts: Mapping[str, int] | None, routable: int) -> None:
        registry_counts(counts, routable, source=self)  # one MetricsHooks per runtime

    def wants_registry_counts(self) -> bool:
        """Whether a count is worth making for these gauges (they were scraped lately)."""
        return registry_counts_wanted()

    def on_delivered(self, env: Envelope) -> None:
        delivered(env.capability, env.priority)

    def on_delivered_many(self, envs: Sequence[Envelope]) -> None:
        """:meth:`on_delivered` of a batch read at once: one note per series."""
        by: dict[tuple[str, str], int] = {}
        for env in envs:
            key = (env.capability, env.priority)
            by[key] = by.get(key, 0) + 1
        for (cap, prio), n in by.items():
            _TALLY.count_many(DELIVERED, (_cap(cap), prio), n)

    def on_replay(self, env: Envelope) -> None:
        replayed(env.capability)

    def before_handle(self, ctx: Context) -> None:
        env = ctx.envelope
        if env.sent_ms:  # queue_wait(), inlined: once per message
            _TALLY.observe(QUEUE_WAIT, (env.priority,), max(0.0, (now_ms() - env.sent_ms) / 1000))

    def after_handle(self, ctx: Context, outcome: Outcome, duration_s: float | None) -> None:
        if duration_s is not None:
            handler_done(
                ctx.envelope.capability, handler_outcome(outcome), duration_s, self.version
            )

    def before_handle_many(self, rows: Sequence[tuple[Context, int]]) -> None:
        """:meth:`before_handle` of a batch (a context, the ms its handling began, each)."""
        by: dict[str, list[float]] = {}
        for ctx, at_ms in rows:
            env = ctx.envelope
            if env.sent_ms:
                by.setdefault(env.priority, []).append(max(0.0, (at_ms - env.sent_ms) / 1000))
        for priority, waits in by.items():
            _TALLY.observe_many(QUEUE_WAIT, (priority,), waits)

    def after_handle_many(self, rows: Sequence[tuple[Context, Outcome, float | None]]) -> None:
        """:meth:`after_handle` of a batch: one note per series."""
        by: dict[tuple[str, str], list[float]] = {}
        for ctx, outcome, duration_s in rows:
            if duration_s is not None:
                key = (ctx.envelope.capability, handler_outcome(outcome))
                by.setdefault(key, []).append(max(0.0, duration_s))
        for (cap, label), took in by.items():
            _TALLY.observe_many(HANDLER, (_cap(cap), label, self.version), took)

    def on_fenced(self, env: Envelope) -> None:
        fenced(env.capability)

    def on_outcome_dropped(self, env: Envelope) -> None:
        outcome_dropped(env.capability)

    def after_settle(self, env: Envelope | None, outcome: str, reason: str) -> None:
        settled(env.capability if env is not None else MALFORMED_CAP, outcome, reason)

    def after_settle_many(self, rows: Sequence[tuple[Envelope | None, str, str]]) -> None:
        """:meth:`after_settle` of a batch settled at once: one note per series."""
        by: dict[tuple[str, str, str], int] = {}
        for env, outcome, reason in rows:
            key = (env.capability if env is not None else MALFORMED_CAP, outcome, reason)
            by[key] = by.get(key, 0) + 1
        for (cap, outcome, reason), n in by.items():
            settled(cap, outcome, reason, n)


# -- serving --------------------------------------------------------------------------
def serve(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> Any:
    """Serve ``/metrics`` over HTTP on ``addr:port`` from a daemon thread.

    Returns the HTTP server (``server.server_port`` is the port, useful with ``port=0``;
    ``server.shutdown()`` stops it).
    """
    from prometheus_client import start_http_server

    res = start_http_server(port, addr=addr, registry=registry)
    return res[0] if isinstance(res, tuple) else res

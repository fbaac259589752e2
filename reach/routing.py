"""Routing: pick which live agent gets a message. Pure Python; a pick touches no Redis.

Two steps per pick, **eligibility then policy**.

Eligibility
    An agent is eligible for a capability when it declares the capability, is ``active``,
    matches the ``where`` metadata filter, is not draining, is ready, its breaker on this client
    is not open, and it is under its queue bound (``max_queue > 0`` and
    ``queue_depth + this client's in-flight to it >= max_queue`` means full). :func:`eligible`
    applies these checks in that order and, when nothing is left, raises
    :class:`~reach.errors.NoAgentAvailable` whose ``reason`` names the stage that removed the
    last candidates: ``no_agent``, ``filter``, ``draining``, ``not_ready``, ``breaker_open``, or
    :class:`~reach.errors.Overloaded` (``overloaded``). Draining is checked before readiness so
    that a mix of draining and starting agents reports ``not_ready`` ("retry soon") rather than
    ``draining``. The message counts every cause.

    The :class:`Router` splits the checks in two. The *static* ones (capability, state, filter,
    draining, ready) depend only on the registry snapshot and are cached per
    ``(capability, where)``; the *dynamic* ones (breaker, queue bound, ``avoid``) change with
    every call and are applied lazily to the agent a policy proposes: when it fails, the policy
    proposes the next one (a skipped agent counts as served, so it gets no burst of catch-up
    traffic when it recovers). After ``MAX_SKIPS`` refusals the router filters the whole set
    once (O(N)); when nothing is left, :func:`eligible` names the reason, else ``least_conn``
    and ``consistent_hash`` go on among the usable agents and ``weighted_rr`` makes a
    weight-proportional random choice among them (a degraded mode, not the hot path).

Cache validity
    Pass ``version=`` (the registry view's change counter) to make the fast path O(1): the same
    version promises the same agents in the same order with the same *static* fields (state,
    ready, draining, weight, ready_ms, capabilities, metadata). The load fields
    (``queue_depth``, ``inflight``, ``max_queue``) may change freely under one version: they are
    read from the objects passed in each call (a changed list under an unchanged version is
    caught by an agent-id check and rebuilt). Without ``version`` the static filter runs on
    every pick (O(N), ~200 µs at 1,000 agents) and the policy structures are still reused
    when the filtered ids and weights are unchanged.

    Measured (``python bench/pick_bench.py``, 2-core VM, Python 3.11), µs per pick with
    version at 10 / 100 / 1,000 agents: weighted_rr ~2 / 2 / 2, consistent_hash ~2.4 / 2.5 /
    2.5, direct ~1, least_conn ~3 / 14 / 105.

Policies
    ``weighted_rr`` (default)
        Smooth weighted round-robin with the properties of nginx's algorithm (proportional,
        interleaved) in **O(log N) per pick** instead of nginx's O(N) scan. nginx picks the
        agent with the largest lag ``w_i·T/W − k_i`` (picks owed); keeping that order in a heap
        is not possible because every key moves at its own rate. We use instead the EEVDF rule
        (Stoica & Abdel-Wahab's *Earliest Eligible Virtual Deadline First*): with virtual time
        ``V = T/W``, agent *i* with ``k_i`` picks has virtual start ``S_i = k_i/w_i`` and
        deadline ``F_i = (k_i+1)/w_i``; among agents with ``S_i <= V`` (not ahead of their
        share) pick the earliest deadline. Two heaps (waiting by ``S``, eligible by ``F``)
        make each pick ~4 heap operations. Like nginx it keeps every agent's count within a
        pick or two of its exact share at every moment (property-tested: < 2), so 4:1 gives
        8,000/2,000 of 10,000 and the sequence
        interleaves (A B A A A ...; a weight-10 agent among ten weight-1 agents alternates with
        them instead of taking ten picks in a row, which plain stride/deadline scheduling
        would do). The scheduler is cached per ``(capability, where)`` and rebuilt only when
        the eligible ids or effective weights change; on rebuild each surviving agent keeps
        its lag (clamped to ±1 pick), so a membership change or a slow-start step does not
        restart the sequence. New agents start with a random lag in ``[0, 1)`` from the
        router's ``rng``, so independent clients do not all begin with the same agent; lags
        are then shifted by their mean to sum to zero.
    ``least_conn``
        Picks the minimum of ``(outstanding + 1) / effective_weight`` where outstanding is this
        client's in-flight count to the agent plus the queue depth it last reported; ties are
        broken with ``rng``. The ``+ 1`` (the request being placed) makes weights matter at
        zero load and makes slow start effective: a fresh agent with 10 % weight is only chosen
        once the others hold ~9 outstanding each. It is an exact O(N) scan done with C-level
        ``map``/``min``; the queue-depth part of the scores is cached until a depth changes,
        and this client's in-flight counts are added only for the agents that have some.
    ``consistent_hash``
        A ketama continuum over ``session_id``: ``vnodes`` virtual nodes per unit of weight
        (default 40, as uhashring; each virtual node gives 4 points), points and key hashes
        computed exactly as :mod:`uhashring`'s ketama ring does (tests check the mapping is
        identical to ``uhashring.HashRing(hash_fn="ketama")``), and a lookup is uhashring's
        own ketama hash plus a bisect (O(log P)). The continuum is built here rather than
        with ``HashRing`` because uhashring rebuilds its whole ring with one ``insort`` per
        point on every add/remove (1.6 s for 1,000 agents, 160,000 points). Here the ring is
        one sorted list of ``point << 32 | tag`` ints, each agent's codes are cached, a join
        appends and re-sorts (a linear timsort merge) and a leave filters: at 1,000 agents
        the first build takes ~0.1 s (md5), a join ~6 ms, a leave ~16 ms. The number of
        virtual nodes depends only on the agent's own weight, so a join or leave moves only
        the sessions of that agent (≈ 1/N). Equal points of two agents are ordered by a hash
        of the agent id, so every client builds the same ring whatever its candidate order.
        With ``hash_load_factor=c`` (bounded loads, Mirrokni et al.), an agent is skipped
        while its outstanding load is at its cap ``ceil(c · (L + 1) · w_i / W)`` (L = total
        outstanding of the eligible agents; equal weights give ``c ×`` the average) and the
        walk continues clockwise to the next distinct agent. An idle agent is always under its
        cap, so L (O(N)) is only computed when the proposed agent already has load.
        Slow start does not apply (it would move sessions).
    ``direct``
        The named ``target``; when it is not eligible, ``NoAgentAvailable`` with reason
        ``target_unavailable`` and the cause in the message (``Overloaded`` when the target is
        only over its queue bound).
    broadcast
        :meth:`Router.pick_many` returns every eligible agent.

Slow start
    An agent whose ``ready_ms`` is less than ``slow_start_s`` ago has its weight multiplied by
    a factor rising linearly from ``slow_start_floor`` (10 %) to 1, in ``SLOW_START_STEPS``
    steps so that cached structures change at most that many times per ramp. Used by
    ``weighted_rr`` and ``least_conn``. ``ready_ms == 0`` means "unknown": full weight.

Weights
    Weights below ``MIN_WEIGHT`` are raised to it, so weight 0 means "practically never, unless
    nothing else is usable".

Breakers
    The router calls ``breakers.is_open`` (no side effect) to filter, and ``breakers.allow``
    only on the agent it returns: when that agent is half-open, this pick *is* the probe, and
    the caller must ``record`` its outcome.

Not thread-safe: one :class:`Router` per client, used from one event loop.
"""

from __future__ import annotations

import difflib
import math
import random
import struct
import time
from bisect import bisect_right
from collections.abc import Callable, Collection, Mapping, Sequence
from hashlib import md5
from heapq import heapify, heappop, heappush
from itertools import compress, islice, repeat
from operator import add, attrgetter, itemgetter, mul
from typing import Any, Final, Literal

from uhashring.ring_ketama import KetamaRing

from .breaker import Breakers
from .errors import ConfigError, NoAgentAvailable, Overloaded
from .registry import AgentInfo

__all__ = [
    "DEFAULT_POLICY",
    "MAX_SKIPS",
    "MIN_WEIGHT",
    "POLICIES",
    "SLOW_START_STEPS",
    "Inflight",
    "Policy",
    "Router",
    "eligible",
    "ketama_points",
    "over_bound",
    "slow_start_factor",
]

Policy = Literal["weighted_rr", "least_conn", "consistent_hash", "direct"]
POLICIES: Final[tuple[str, ...]] = ("weighted_rr", "least_conn", "consistent_hash", "direct")
DEFAULT_POLICY: Final = "weighted_rr"
MIN_WEIGHT: Final = 1e-6
MAX_SKIPS: Final = 8
SLOW_START_STEPS: Final = 20
_STATE_CACHE: Final = 256  # (capability, where) entries kept per router
_EMPTY: Mapping[str, int] = {}

_key_hash: Callable[[str], int] = KetamaRing().hashi  # uhashring's ketama hash of a key
_qd = attrgetter("queue_depth")
_id = attrgetter("agent_id")
_weight = attrgetter("weight")
_ready_ms = attrgetter("ready_ms")


class Inflight(dict[str, int]):
    """This client's in-flight count per agent id (a plain dict with add/done helpers)."""

    def add(self, agent_id: str, n: int = 1) -> None:
        self[agent_id] = self.get(agent_id, 0) + n

    def done(self, agent_id: str, n: int = 1) -> None:
        left = self.get(agent_id, 0) - n
        if left > 0:
            self[agent_id] = left
        else:
            self.pop(agent_id, None)


# -- eligibility ----------------------------------------------------------------------------
def over_bound(agent: AgentInfo, local_inflight: Mapping[str, int] = _EMPTY) -> bool:
    """True when ``agent`` is at or over its queue bound (never when ``max_queue`` is 0)."""
    mq = agent.max_queue
    return mq > 0 and agent.queue_depth + local_inflight.get(agent.agent_id, 0) >= mq


def eligible(
    agents: Sequence[AgentInfo],
    *,
    capability: str,
    where: Mapping[str, Any] | None = None,
    is_open: Callable[[str], bool] | None = None,
    local_inflight: Mapping[str, int] | None = None,
) -> list[AgentInfo]:
    """The agents that may take a message for ``capability`` now, in input order.

    Raises :class:`NoAgentAvailable` (or :class:`Overloaded`) with the reason when none is
    left; see the module docstring for the order of the checks.
    """
    inflight = _EMPTY if local_inflight is None else local_inflight
    have = [a for a in agents if capability in a.capabilities]
    if not have:
        raise _no_agent(agents, capability)
    live = [a for a in have if a.state == "active"]
    if not live:
        states = _count(a.state for a in have)
        raise NoAgentAvailable(
            f"No live agent has capability {capability!r}: {len(have)} declare it but "
            f"{_fmt_counts(states)} (lease missed). Start an agent or wait for it to "
            "heartbeat again.",
            capability=capability,
            reason="no_agent",
        )
    matched = [a for a in live if a.matches(where)] if where else live
    if not matched:
        raise NoAgentAvailable(
            f"No agent of {capability!r} matches where={dict(where or {})!r}: "
            f"{len(live)} live agent(s) have {_seen_values(live, where or {})}.",
            capability=capability,
            reason="filter",
        )
    scope = f"of {capability!r}" + (f" matching where={dict(where or {})!r}" if where else "")
    serving = [a for a in matched if not a.draining]
    if not serving:
        raise NoAgentAvailable(
            f"All {len(matched)} agent(s) {scope} are draining (shutting down): "
            f"{_ids(matched)}. Start another agent.",
            capability=capability,
            reason="draining",
        )
    ready = [a for a in serving if a.ready]
    if not ready:
        draining = len(matched) - len(serving)
        extra = f" ({draining} other(s) draining)" if draining else ""
        raise NoAgentAvailable(
            f"No agent {scope} is ready yet: {len(serving)} registered but not ready "
            f"{_ids(serving)}{extra}. Retry shortly (agents call mark_ready() after startup).",
            capability=capability,
            reason="not_ready",
        )
    closed = ready if is_open is None else [a for a in ready if not is_open(a.agent_id)]
    if not closed:
        raise NoAgentAvailable(
            f"The circuit breaker of this client is open for all {len(ready)} ready agent(s) "
            f"{scope}: {_ids(ready)}; they failed too often recently. A probe is let through "
            "after the cool-down.",
            capability=capability,
            reason="breaker_open",
        )
    room = [a for a in closed if not over_bound(a, inflight)]
    if not room:
        detail = ", ".join(
            f"{a.agent_id} {a.queue_depth}+{inflight.get(a.agent_id, 0)}/{a.max_queue}"
            for a in closed[:5]
        )
        more = f" and {len(closed) - 5} more" if len(closed) > 5 else ""
        raise Overloaded(
            f"All {len(closed)} usable agent(s) {scope} are at their queue bound "
            f"(queued+in-flight/max: {detail}{more}). Back off and retry later.",
            capability=capability,
            reason="overloaded",
        )
    return room


def _no_agent(agents: Sequence[AgentInfo], capability: str) -> NoAgentAvailable:
    known = sorted({c for a in agents for c in a.capabilities})
    close = difflib.get_close_matches(capability, known, n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    return NoAgentAvailable(
        f"No agent has capability {capability!r} ({len(agents)} agent(s) known, "
        f"{len(known)} capabilities).{hint} See `reach caps`.",
        capability=capability,
        reason="no_agent",
    )


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _fmt_counts(c: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(c.items()))


def _ids(agents: Sequence[AgentInfo], limit: int = 5) -> str:
    s = ", ".join(a.agent_id for a in agents[:limit])
    return s + (f" and {len(agents) - limit} more" if len(agents) > limit else "")


def _seen_values(agents: Sequence[AgentInfo], where: Mapping[str, Any]) -> str:
    parts = []
    for k in where:
        vals = sorted({str(a.metadata.get(k)) for a in agents})
        shown = ", ".join(vals[:5]) + (", ..." if len(vals) > 5 else "")
        parts.append(f"{k} in {{{shown}}}")
    return "; ".join(parts)


# -- slow start -------------------------------------------------------------------------------
def slow_start_factor(
    ready_ms: int,
    now_ms: float,
    slow_start_ms: float,
    *,
    floor: float = 0.1,
    steps: int = SLOW_START_STEPS,
) -> tuple[float, float]:
    """``(factor, valid_until_ms)``: weight multiplier of an agent ready since ``ready_ms``.

    Linear from ``floor`` to 1 over ``slow_start_ms``, quantised in ``steps``; the factor holds
    until ``valid_until_ms`` (``inf`` once fully ramped).
    """
    if slow_start_ms <= 0 or ready_ms <= 0:
        return 1.0, math.inf
    age = max(0.0, now_ms - ready_ms)
    if age >= slow_start_ms:
        return 1.0, math.inf
    step = int(age * steps // slow_start_ms)
    return floor + (1.0 - floor) * step / steps, ready_ms + (step + 1) * slow_start_ms / steps


# -- smooth weighted round-robin (EEVDF) ----------------------------------------------------
class _Wrr:
    """Earliest eligible virtual deadline first over fixed weights; see the module docstring."""

    __slots__ = ("ids", "k", "ready", "t", "total", "w", "waiting")

    def __init__(self, ids: list[str], weights: list[float], k0: list[float]) -> None:
        self.ids = ids
        self.w = weights
        self.k = k0  # picks so far (fractional: minus the carried lag)
        self.t = 0.0  # picks since this scheduler was built
        self.total = sum(weights)
        self.ready: list[tuple[float, int]] = []  # (deadline, i), start <= V
        self.waiting: list[tuple[float, int]] = []  # (start, i), start > V
        for i, (w, k) in enumerate(zip(weights, k0, strict=True)):
            if k <= 0.0:
                self.ready.append(((k + 1.0) / w, i))
            else:
                self.waiting.append((k / w, i))
        heapify(self.ready)
        heapify(self.waiting)

    def next(self) -> int:
        v = self.t / self.total
        lim = v + 1e-9 * (1.0 + v)
        waiting, ready, w, k = self.waiting, self.ready, self.w, self.k
        while waiting and waiting[0][0] <= lim:
            i = heappop(waiting)[1]
            heappush(ready, ((k[i] + 1.0) / w[i], i))
        if not ready:  # everyone is ahead of virtual time (after a rebuild): jump forward
            s, i = heappop(waiting)
            self.t = s * self.total
            heappush(ready, ((k[i] + 1.0) / w[i], i))
        f, i = heappop(ready)
        k[i] += 1.0
        heappush(waiting, (f, i))  # the new start is the old deadline
        self.t += 1.0
        return i

    def lags(self) -> list[float]:
        """Picks owed to each agent (positive: behind its share)."""
        v = self.t / self.total
        return [w * v - k for w, k in zip(self.w, self.k, strict=True)]


# -- ketama continuum ---------------------------------------------------------------------------
def ketama_points(agent_id: str, vnodes: int) -> list[int]:
    """The ketama points of one node, as uhashring computes them (4 per virtual node)."""
    out: list[int] = []
    unpack = struct.Struct("<4I").unpack
    for v in range(vnodes):
        out.extend(unpack(md5(f"{agent_id}-{v}".encode()).digest()))
    return out


_TAG_MASK: Final = (1 << 32) - 1


def _tag(agent_id: str) -> int:
    """A 32-bit tag derived from the id only, so every client orders equal points alike."""
    return int.from_bytes(md5(agent_id.encode()).digest()[:4], "little")


class _Ring:
    """The continuum as one sorted list of ``point << 32 | tag`` ints.

    ``bisect`` on it finds the first point after a key's hash; the low 32 bits name the agent.
    A join appends the agent's (cached) codes and re-sorts (timsort merges the two sorted runs
    in linear time); a leave filters its codes out. Equal points of two agents are ordered by
    tag, a hash of the agent id, so the ring does not depend on the candidate order.
    """

    __slots__ = ("codes", "hashed", "members", "owner", "tags")
    codes: list[int]

    def __init__(
        self,
        members: dict[str, int],
        cache: dict[tuple[str, int, int], list[int]],
        old: _Ring | None = None,
    ) -> None:
        self.members = members  # agent id -> virtual nodes
        tags = {a: _tag(a) for a in members}
        owner = {t: a for a, t in tags.items()}
        self.hashed = len(owner) == len(tags)
        if not self.hashed:  # two ids share a tag (~1e-4 at 1,000 agents): rank them instead
            tags = {a: r for r, a in enumerate(sorted(members))}
            owner = {r: a for a, r in tags.items()}
        self.tags, self.owner = tags, owner

        def codes_of(a: str) -> list[int]:
            key = (a, members[a], tags[a])
            got = cache.get(key)
            if got is None:
                t = tags[a]
                got = cache[key] = [(p << 32) | t for p in ketama_points(a, members[a])]
            return got

        if old is not None and old.hashed and self.hashed:
            gone = {old.tags[a] for a, v in old.members.items() if members.get(a) != v}
            new = [a for a, v in members.items() if old.members.get(a) != v]
            if (len(gone) + len(new)) * 4 <= len(members):
                if len(gone) == 1:
                    (g,) = gone
                    codes = [c for c in old.codes if c & _TAG_MASK != g]
                elif gone:
                    codes = [c for c in old.codes if c & _TAG_MASK not in gone]
                else:
                    codes = old.codes.copy()
                for a in new:
                    codes.extend(codes_of(a))
                codes.sort()
                self.codes = codes
                return
        everything: list[int] = []
        for a in members:
            everything.extend(codes_of(a))
        everything.sort()
        self.codes = everything

    def position(self, key: str) -> int:
        """Index of the first point clockwise from ``key``'s ketama hash."""
        p = bisect_right(self.codes, (_key_hash(key) << 32) | _TAG_MASK)
        return 0 if p == len(self.codes) else p


# -- the router -------------------------------------------------------------------------------
class _State:
    """Cached eligibility and policy state of one (capability, where) on one router."""

    __slots__ = (
        "eff",
        "getter",
        "ids",
        "idx",
        "inv_eff",
        "lc_base",
        "lc_qd",
        "n",
        "pos",
        "ready_ms",
        "ring",
        "ring_ok",
        "ring_w",
        "valid_until",
        "version",
        "weights",
        "wrr",
        "wrr_ok",
    )

    def __init__(self) -> None:
        self.version: object = None
        self.n = -1
        self.valid_until = -math.inf
        self.idx: list[int] = []
        self.ids: list[str] = []
        self.pos: dict[str, int] = {}
        self.weights: list[float] = []
        self.ready_ms: list[int] = []
        self.eff: list[float] = []
        self.inv_eff: list[float] = []
        self.getter: Callable[[Sequence[AgentInfo]], tuple[AgentInfo, ...]] = _tuple0
        self.wrr: _Wrr | None = None
        self.wrr_ok = False
        self.ring: _Ring | None = None
        self.ring_ok = False
        self.ring_w = 0.0
        self.lc_qd: list[int] | None = None
        self.lc_base: list[float] = []


def _tuple0(_: Sequence[AgentInfo]) -> tuple[AgentInfo, ...]:
    return ()


class _Stale(Exception):
    """The candidate list changed under an unchanged version: rebuild and retry."""


class Router:
    """Per-client routing state: pick an agent for a capability under a policy.

    :param slow_start_s: ramp time of a freshly ready agent's weight (0 disables).
    :param slow_start_floor: the weight factor at the start of the ramp.
    :param vnodes: consistent-hash virtual nodes per unit of weight (4 points each).
    :param hash_load_factor: ``c`` of bounded-load consistent hashing (``None`` = off; > 1).
    :param breakers: this client's :class:`~reach.breaker.Breakers` (``None``: none open).
    :param inflight: this client's in-flight count per agent, shared with the caller, who
        calls ``router.inflight.add(agent_id)`` when a message is sent and ``.done(agent_id)``
        when its reply (or failure) arrives; by default a new :class:`Inflight`.
    :param rng: randomness for least_conn ties and initial round-robin offsets.
    :param clock: epoch seconds (compared with ``AgentInfo.ready_ms`` for slow start).
    """

    def __init__(
        self,
        *,
        slow_start_s: float = 10.0,
        slow_start_floor: float = 0.1,
        vnodes: int = 40,
        hash_load_factor: float | None = None,
        breakers: Breakers | None = None,
        inflight: Inflight | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if slow_start_s < 0:
            raise ConfigError("slow_start_s must be >= 0.")
        if not 0.0 < slow_start_floor <= 1.0:
            raise ConfigError("slow_start_floor must be in (0, 1].")
        if vnodes < 1:
            raise ConfigError("vnodes must be >= 1.")
        if hash_load_factor is not None and hash_load_factor <= 1.0:
            raise ConfigError(
                f"hash_load_factor must be > 1 (e.g. 1.25), got {hash_load_factor!r}."
            )
        self.slow_start_ms = slow_start_s * 1000.0
        self.slow_start_floor = slow_start_floor
        self.vnodes = vnodes
        self.hash_load_factor = hash_load_factor
        self.breakers = breakers
        self.inflight = Inflight() if inflight is None else inflight
        self.rng = rng if rng is not None else random.Random()
        self.clock = clock
        self._states: dict[tuple[str, tuple[tuple[str, str], ...]], _State] = {}
        self._points: dict[tuple[str, int, int], list[int]] = {}

    # -- public -------------------------------------------------------------------------
    def pick(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        *,
        policy: str | None = DEFAULT_POLICY,
        session_id: str | None = None,
        target: str | None = None,
        where: Mapping[str, Any] | None = None,
        version: object = None,
        avoid: str | Collection[str] = (),
    ) -> AgentInfo:
        """The agent that gets the next message for ``capability``.

        ``candidates`` may hold agents of any capability and state (e.g. the whole registry
        snapshot, or the capability's list); see the module docstring for ``version``.
        ``avoid`` names agents (one id or a collection) to pass over when another one is usable
        (a retry preferring another agent); they are still used when nothing else is.
        Raises :class:`NoAgentAvailable` / :class:`Overloaded` with a reason, and
        :class:`~reach.errors.ConfigError` for a bad policy or a missing session_id/target.
        """
        if isinstance(avoid, str):  # one agent id, not a collection of characters
            avoid = (avoid,) if avoid else ()
        for _ in range(3):
            try:
                return self._pick(
                    capability, candidates, policy, session_id, target, where, version, avoid
                )
            except _Stale:
                version = None  # the caller's version lied: fall back to a full rebuild
        raise AssertionError("unreachable: a rebuild without version cannot be stale")

    def pick_many(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        *,
        where: Mapping[str, Any] | None = None,
        version: object = None,
    ) -> list[AgentInfo]:
        """Every eligible agent (broadcast), in candidate order.

        Takes no half-open probe slot: each copy is then sent with ``target=`` and its own
        pick takes the slot, once (taking it here too left that copy nowhere to go).
        """
        now = self.clock() * 1000.0
        st = self._state(capability, candidates, where, version, now)
        sub = st.getter(candidates)
        if list(map(_id, sub)) != st.ids:  # the list changed under an unchanged version
            st = self._state(capability, candidates, where, None, now)
            sub = st.getter(candidates)
        inflight = self.inflight
        out: list[AgentInfo] = []
        is_open = self.breakers.is_open if self.breakers is not None else None
        for a in sub:
            if over_bound(a, inflight) or (is_open is not None and is_open(a.agent_id)):
                continue
            out.append(a)
        if not out:
            self._diagnose(capability, candidates, where)
        return out

    def forget(self, capability: str | None = None) -> None:
        """Drop cached state (of one capability, or all)."""
        if capability is None:
            self._states.clear()
            self._points.clear()
        else:
            for key in [k for k in self._states if k[0] == capability]:
                del self._states[key]

    # -- dispatch -------------------------------------------------------------------------
    def _pick(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        policy: str | None,
        session_id: str | None,
        target: str | None,
        where: Mapping[str, Any] | None,
        version: object,
        avoid: Collection[str],
    ) -> AgentInfo:
        now = self.clock() * 1000.0
        if policy == "weighted_rr" or policy is None:
            st = self._state(capability, candidates, where, version, now)
            return self._pick_wrr(st, capability, candidates, where, avoid)
        if policy == "consistent_hash":
            if session_id is None:
                raise ConfigError("Policy 'consistent_hash' needs a session_id to hash.")
            st = self._state(capability, candidates, where, version, now)
            return self._pick_hash(st, capability, candidates, where, str(session_id), avoid)
        if policy == "least_conn":
            st = self._state(capability, candidates, where, version, now)
            return self._pick_least(st, capability, candidates, where, avoid)
        if policy == "direct":
            if not target:
                raise ConfigError("Policy 'direct' needs target=<agent_id>.")
            return self._pick_direct(capability, candidates, where, version, now, target)
        if policy == "broadcast":
            raise ConfigError("Broadcast returns many agents: use Router.pick_many().")
        raise ConfigError(f"Unknown routing policy {policy!r}: use one of {', '.join(POLICIES)}.")

    # -- cached static eligibility ------------------------------------------------------------
    def _state(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Mapping[str, Any] | None,
        version: object,
        now: float,
    ) -> _State:
        wkey = tuple(sorted((str(k), str(v)) for k, v in where.items())) if where else ()
        key = (capability, wkey)
        st = self._states.get(key)
        if (
            st is not None
            and version is not None
            and st.version == version
            and st.n == len(candidates)
            and now < st.valid_until
        ):
            return st
        if st is None:
            st = _State()
            if len(self._states) >= _STATE_CACHE:
                del self._states[next(iter(self._states))]
            self._states[key] = st
        self._rebuild(st, capability, candidates, where, now)
        st.version = version
        return st

    def _rebuild(
        self,
        st: _State,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Mapping[str, Any] | None,
        now: float,
    ) -> None:
        st.version = None
        idx = [
            i
            for i, a in enumerate(candidates)
            if a.ready
            and not a.draining
            and a.state == "active"
            and capability in a.capabilities
            and (not where or a.matches(where))
        ]
        if not idx:
            st.n = -1
            self._diagnose(capability, candidates, where)
            raise AssertionError("eligible() found agents the static filter did not")
        sub = [candidates[i] for i in idx]
        ids = list(map(_id, sub))
        weights = list(map(_weight, sub))
        if min(weights) < MIN_WEIGHT:
            weights = [max(w, MIN_WEIGHT) for w in weights]
        ready_ms = list(map(_ready_ms, sub))
        same_members = ids == st.ids and weights == st.weights
        if not (same_members and ready_ms == st.ready_ms and now < st.valid_until):
            valid = math.inf
            eff = weights
            if self.slow_start_ms > 0:
                eff = []
                for w, r in zip(weights, ready_ms, strict=True):
                    f, until = slow_start_factor(
                        r, now, self.slow_start_ms, floor=self.slow_start_floor
                    )
                    eff.append(w * f)
                    valid = min(valid, until)
            st.valid_until = valid
            if eff != st.eff or not same_members:
                st.wrr_ok = False
            st.eff = eff
            st.inv_eff = [1.0 / w for w in eff]
            st.lc_qd = None
        if not same_members:
            st.ring_ok = False
        if ids != st.ids:
            st.pos = {a: j for j, a in enumerate(ids)}
        if idx != st.idx:
            if len(idx) == 1:
                only = idx[0]
                st.getter = lambda c: (c[only],)
            else:
                st.getter = itemgetter(*idx)
        st.idx = idx
        st.ids = ids
        st.weights = weights
        st.ready_ms = ready_ms
        st.n = len(candidates)

    def _diagnose(
        self, capability: str, candidates: Sequence[AgentInfo], where: Mapping[str, Any] | None
    ) -> list[AgentInfo]:
        """Full eligibility check: raises with the reason, or returns what is usable."""
        return eligible(
            candidates,
            capability=capability,
            where=where,
            is_open=self.breakers.is_open if self.breakers is not None else None,
            local_inflight=self.inflight,
        )

    def _usable(self, a: AgentInfo, avoid: Collection[str]) -> bool:
        """Dynamic checks of a proposed agent; takes the breaker probe slot when it passes."""
        if avoid and a.agent_id in avoid:
            return False
        mq = a.max_queue
        if mq > 0 and a.queue_depth + self.inflight.get(a.agent_id, 0) >= mq:
            return False
        return self.breakers is None or self.breakers.allow(a.agent_id)

    def _fallback(
        self,
        st: _State,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Mapping[str, Any] | None,
        avoid: Collection[str],
        weights: Sequence[float],
    ) -> AgentInfo:
        """After MAX_SKIPS refusals: filter once, then a weighted random choice of the rest."""
        ok = self._diagnose(capability, candidates, where)  # raises when nothing is usable
        if avoid:
            ok = [a for a in ok if a.agent_id not in avoid] or ok
        pos = st.pos
        w = [weights[pos[a.agent_id]] if a.agent_id in pos else MIN_WEIGHT for a in ok]
        a = self.rng.choices(ok, weights=w)[0]
        if self.breakers is not None:
            self.breakers.allow(a.agent_id)  # not open per the filter: takes the probe slot
        return a

    # -- policies -----------------------------------------------------------------------------
    def _agent(self, st: _State, candidates: Sequence[AgentInfo], j: int) -> AgentInfo:
        a = candidates[st.idx[j]]
        if a.agent_id != st.ids[j]:
            raise _Stale
        return a

    def _pick_wrr(
        self,
        st: _State,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Mapping[str, Any] | None,
        avoid: Collection[str],
    ) -> AgentInfo:
        if not st.wrr_ok:
            st.wrr = self._new_wrr(st, st.wrr)
            st.wrr_ok = True
        sched = st.wrr
        assert sched is not None
        for _ in range(min(MAX_SKIPS, len(st.ids))):
            a = self._agent(st, candidates, sched.next())
            if self._usable(a, avoid):
                return a
        return self._fallback(st, capability, candidates, where, avoid, st.eff)

    def _new_wrr(self, st: _State, old: _Wrr | None) -> _Wrr:
        """A scheduler for the current agents; survivors keep their lag, newcomers a random one.

        Lags are then shifted by their mean so that they sum to zero (EEVDF's invariant: the
        lag a leaving agent had is spread over the others) and stay within (-1, 1) + clamping.
        """
        carried: dict[str, float] = {}
        if old is not None:
            carried = dict(zip(old.ids, old.lags(), strict=True))
        rnd = self.rng.random
        lags = []
        for a in st.ids:
            lag = carried.get(a)
            lags.append(rnd() if lag is None else min(1.0, max(-1.0, lag)))
        shift = sum(lags) / len(lags)
        return _Wrr(list(st.ids), list(st.eff), [shift - lag for lag in lags])

    def _pick_least(
        self,
        st: _State,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Mapping[str, Any] | None,
        avoid: Collection[str],
    ) -> AgentInfo:
        sub = st.getter(candidates)
        qd = list(map(_qd, sub))
        if qd != st.lc_qd:  # queue depths change with heartbeats only: cache their part
            st.lc_qd = qd
            st.lc_base = list(map(mul, map(add, qd, repeat(1)), st.inv_eff))
        scores = st.lc_base.copy()
        inflight, inv = self.inflight, st.inv_eff
        if inflight:
            if len(inflight) * 4 < len(scores):
                pos = st.pos
                for aid, n in inflight.items():
                    j = pos.get(aid)
                    if j is not None and n:
                        scores[j] += n * inv[j]
            else:
                local = map(mul, map(inflight.get, st.ids, repeat(0)), inv)
                scores = list(map(add, scores, local))
        inf = math.inf
        n = len(scores)
        for tries in range(n):
            if tries == MAX_SKIPS:  # many refusals: filter once (raises when none is usable)
                ok = {a.agent_id for a in self._diagnose(capability, candidates, where)}
                scores = [s if i in ok else inf for s, i in zip(scores, st.ids, strict=True)]
            m = min(scores)
            if m == inf:
                break
            ties = scores.count(m)
            if ties == 1:
                j = scores.index(m)
            else:  # the r-th of the tied agents, found at C speed
                r = self.rng.randrange(ties)
                j = next(islice(compress(range(n), map(m.__eq__, scores)), r, None))
            a = sub[j]
            if a.agent_id != st.ids[j]:
                raise _Stale
            if self._usable(a, avoid):
                return a
            scores[j] = inf
        return self._fallback(st, capability, candidates, where, avoid, st.eff)

    def _pick_hash(
        self,
        st: _State,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Mapping[str, Any] | None,
        session_id: str,
        avoid: Collection[str],
    ) -> AgentInfo:
        if not st.ring_ok:
            members = {
                a: max(1, round(self.vnodes * w)) for a, w in zip(st.ids, st.weights, strict=True)
            }
            if st.ring is None or st.ring.members != members:
                st.ring = _Ring(members, self._points, st.ring)
                # keep only the points some cached ring still uses
                live = {
                    (a, v, r.tags[a])
                    for other in self._states.values()
                    if (r := other.ring) is not None
                    for a, v in r.members.items()
                }
                self._points = {k: v for k, v in self._points.items() if k in live}
            st.ring_w = sum(st.weights)
            st.ring_ok = True
        ring = st.ring
        assert ring is not None
        codes, owner, pos = ring.codes, ring.owner, st.pos
        p = ring.position(session_id)
        c = self.hash_load_factor
        if c is None and not avoid:  # fast path: the owner of the session's arc
            a = self._agent(st, candidates, pos[owner[codes[p] & _TAG_MASK]])
            if self._usable(a, avoid):
                return a
        # walk clockwise over the next distinct agents
        n_codes, n_agents = len(codes), len(st.ids)
        seen: set[int] = set()
        ok_ids: set[str] | None = None  # after MAX_SKIPS refusals: the usable ones, found once
        refused = 0
        total: float | None = None
        skipped_for_cap: list[AgentInfo] = []
        inflight = self.inflight
        for step in range(n_codes):
            tag = codes[(p + step) % n_codes] & _TAG_MASK
            if tag in seen:
                continue
            seen.add(tag)
            aid = owner[tag]
            if ok_ids is None or aid in ok_ids:
                j = pos[aid]
                a = self._agent(st, candidates, j)
                own = a.queue_depth + inflight.get(a.agent_id, 0) if c is not None else 0
                if c is not None and own > 0:
                    if total is None:
                        total = sum(map(_qd, st.getter(candidates))) + sum(
                            map(inflight.get, st.ids, repeat(0))
                        )
                    if own + 1 > math.ceil(c * (total + 1) * st.weights[j] / st.ring_w):
                        skipped_for_cap.append(a)
                        continue
                if self._usable(a, avoid):
                    return a
                refused += 1
                if refused == MAX_SKIPS:  # raises when nothing at all is usable
                    ok_ids = {x.agent_id for x in self._diagnose(capability, candidates, where)}
            if len(seen) == n_agents:
                break
        # nobody under its cap is usable: the cap is a balance goal, not a bound to fail on
        for a in skipped_for_cap:
            if self._usable(a, avoid):
                return a
        return self._fallback(st, capability, candidates, where, avoid, st.weights)

    def _pick_direct(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Mapping[str, Any] | None,
        version: object,
        now: float,
        target: str,
    ) -> AgentInfo:
        try:
            st = self._state(capability, candidates, where, version, now)
        except NoAgentAvailable:
            st = None
        if st is not None and target in st.pos:
            j = st.pos[target]
            a = self._agent(st, candidates, j)
            if self._usable(a, ()):
                return a
        raise self._target_error(capability, candidates, where, target)

    def _target_error(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Mapping[str, Any] | None,
        target: str,
    ) -> NoAgentAvailable:
        a = next((x for x in candidates if x.agent_id == target), None)
        msg = f"Target agent {target!r} cannot take {capability!r} now: "
        if a is None:
            why = "it is not registered (see `reach agents`)."
        elif capability not in a.capabilities:
            why = f"it does not declare this capability (it has {', '.join(a.capabilities)})."
        elif a.state != "active":
            why = f"it is in state {a.state!r} (lease missed)."
        elif where and not a.matches(where):
            why = f"it does not match where={dict(where)!r}."
        elif a.draining:
            why = "it is draining (shutting down)."
        elif not a.ready:
            why = "it is not ready yet; retry shortly."
        elif self.breakers is not None and self.breakers.is_open(a.agent_id):
            why = "the circuit breaker of this client is open for it (recent failures)."
        elif over_bound(a, self.inflight):
            return Overloaded(
                msg + f"it is at its queue bound ({a.queue_depth} queued + "
                f"{self.inflight.get(target, 0)} in flight / {a.max_queue}). Back off and retry.",
                capability=capability,
                reason="overloaded",
            )
        else:
            why = "its half-open breaker probe is already in flight."
        return NoAgentAvailable(msg + why, capability=capability, reason="target_unavailable")

"""The router: pick which live agent gets a message, eligibility then policy.

The static checks of eligibility come cached from :mod:`reach.routing.cache`; the *dynamic*
ones (breaker, queue bound, ``avoid``) change with every call and are applied lazily to the
agent a policy proposes: when it fails, the policy proposes the next one (a skipped agent
counts as served, so it gets no burst of catch-up traffic when it recovers). After
:data:`MAX_SKIPS` refusals the router filters the whole set once (O(N)); when nothing is
left, :func:`~reach.routing.eligibility.eligible` names the reason, else ``least_conn`` and
``consistent_hash`` go on among the usable agents and ``weighted_rr`` makes a
weight-proportional random choice among them (a degraded mode, not the hot path).

Policies
    ``weighted_rr`` (default): smooth weighted round-robin, :mod:`reach.routing.wrr`.
    ``least_conn``: the fewest outstanding per unit of weight, :mod:`reach.routing.least_conn`.
    ``consistent_hash``: the ketama ring over ``session_id`` (:mod:`reach.routing.ring`). With
    ``hash_load_factor=c`` (bounded loads, Mirrokni et al.), an agent is skipped while its
    outstanding load is at its cap ``ceil(c · (L + 1) · w_i / W)`` (L = total outstanding of
    the eligible agents; equal weights give ``c ×`` the average) and the walk continues
    clockwise to the next distinct agent. An idle agent is always under its cap, so L (O(N))
    is only computed when the proposed agent already has load. Slow start does not apply (it
    would move sessions).
    ``direct``: the named ``target``; when it is not eligible, ``NoAgentAvailable`` with
    reason ``target_unavailable`` and the cause in the message (``Overloaded`` when the
    target is only over its queue bound).
    broadcast: :meth:`Router.pick_many` returns every eligible agent.

Version splits
    With ``split=`` (a capability's :class:`~reach.routing.split.Split`, docs/routing.md,
    *Version canaries*) every policy but ``direct`` picks among the agents of one
    application version: ``app_version=`` (a session's pinned version), else one drawn by
    share; when that version has no agent that can take the message, the other versions
    with a share, largest first. Versions with share 0 are never picked. ``direct`` and
    broadcast do not look at the split.

Free capacity
    ``weighted_rr`` and ``least_conn`` pass over an agent that is full (no free slot, by
    :class:`~reach.routing.capacity.Capacity`'s estimate) while another usable agent has
    room: a full proposal is skipped like a refused one, and the first one sends the pick
    to one O(N) scan (:meth:`Router._roomiest`): ``weighted_rr`` takes a
    weight-proportional random agent with room, else, every usable agent being full, one
    where the message ends first (expected wait = queued x mean handler time / slots, plus
    its own cost x mean); ``least_conn`` takes where the message ends first among all of
    them (its scores are that estimate already, without this client's untracked sends). ``consistent_hash`` and ``direct`` do not look at capacity
    (they choose the agent for other reasons).

Breakers
    The router calls ``breakers.is_open`` (no side effect) to filter, and ``breakers.allow``
    only on the agent it returns: when that agent is half-open, this pick *is* the probe, and
    the caller must ``record`` its outcome.

Measured (``python bench/pick_bench.py``, 2-core VM, Python 3.11), µs per pick with version
at 10 / 100 / 1,000 agents: weighted_rr ~2 / 2 / 2, consistent_hash ~2.4 / 2.5 / 2.5,
direct ~1, least_conn ~3 / 14 / 105.

Not thread-safe: one :class:`Router` per client, used from one event loop.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from itertools import compress, islice, repeat
from operator import attrgetter
from typing import Any, Final, Literal

from ..breaker import Breakers
from ..errors import ConfigError, NoAgentAvailable
from ..registry import AgentInfo
from . import least_conn, ring
from .cache import State, StateCache
from .capacity import Capacity
from .eligibility import Inflight, eligible, over_bound, target_refusal, version_missing
from .ring import TAG_MASK, Ring
from .split import Split
from .weights import MIN_WEIGHT
from .wrr import Scheduler

__all__ = ["DEFAULT_POLICY", "MAX_SKIPS", "POLICIES", "Policy", "Router"]

Policy = Literal["weighted_rr", "least_conn", "consistent_hash", "direct"]
POLICIES: Final[tuple[str, ...]] = ("weighted_rr", "least_conn", "consistent_hash", "direct")
DEFAULT_POLICY: Final = "weighted_rr"
MAX_SKIPS: Final = 8

_qd = attrgetter("queue_depth")
# What an agent's heartbeat reports (least_conn's cache is kept while none changes).
_report = attrgetter("queue_depth", "slots", "handler_us", "cap_us", "last_heartbeat_ms")
_id = attrgetter("agent_id")


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
        self.capacity = Capacity(self.inflight)
        self.rng = rng if rng is not None else random.Random()
        self.clock = clock
        self._states = StateCache(
            slow_start_ms=self.slow_start_ms, slow_start_floor=slow_start_floor, breakers=breakers
        )
        self._points: ring.PointCache = {}

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
        cost: float = 1.0,
        split: Split | None = None,
        app_version: str | None = None,
    ) -> AgentInfo:
        """The agent that gets the next message for ``capability``.

        ``candidates`` may hold agents of any capability and state (e.g. the whole registry
        snapshot, or the capability's list); see :mod:`reach.routing.cache` for ``version``.
        ``avoid`` names agents (one id or a collection) to pass over when another one is usable
        (a retry preferring another agent); they are still used when nothing else is.
        ``cost``: the message's (:attr:`reach.envelope.Envelope.cost`), weighed by
        ``least_conn`` and where every agent is full. ``split``: the capability's split
        between application versions, ``app_version`` the version to try first (module
        docstring, *Version splits*); without a split, ``app_version`` alone restricts
        the pick to that version's agents.
        Raises :class:`NoAgentAvailable` / :class:`Overloaded` with a reason, and
        :class:`~reach.errors.ConfigError` for a bad policy or a missing session_id/target.
        """
        if isinstance(avoid, str):  # one agent id, not a collection of characters
            avoid = (avoid,) if avoid else ()
        if policy is None:
            policy = DEFAULT_POLICY
        if policy == "consistent_hash" and session_id is None:
            raise ConfigError("Policy 'consistent_hash' needs a session_id to hash.")
        if policy == "direct" and not target:
            raise ConfigError("Policy 'direct' needs target=<agent_id>.")
        if policy == "broadcast":
            raise ConfigError("Broadcast returns many agents: use Router.pick_many().")
        if policy not in POLICIES:
            raise ConfigError(
                f"Unknown routing policy {policy!r}: use one of {', '.join(POLICIES)}."
            )
        if split is not None and policy != "direct":
            return self._pick_split(
                capability,
                candidates,
                split,
                app_version,
                partial(
                    self.pick,
                    capability,
                    candidates,
                    policy=policy,
                    session_id=session_id,
                    where=where,
                    version=version,
                    avoid=avoid,
                    cost=cost,
                ),
                where=where,
                version=version,
            )
        for _ in range(3):
            now = self.clock() * 1000.0
            try:
                if policy == "direct":
                    assert target
                    return self._pick_direct(capability, candidates, where, version, now, target)
                st = self._states.get(capability, candidates, where, version, now, app_version)
                if policy == "weighted_rr":
                    return self._pick_wrr(st, candidates, avoid, cost)
                if policy == "consistent_hash":
                    return self._pick_hash(st, candidates, str(session_id), avoid)
                return self._pick_least(st, candidates, avoid, cost)
            except _Stale:
                version = None  # the caller's version lied: fall back to a full rebuild
        raise AssertionError("unreachable: a rebuild without version cannot be stale")

    def picker(
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
        cost: float = 1.0,
        split: Split | None = None,
    ) -> Callable[[], AgentInfo]:
        """:meth:`pick` for a batch of messages with the same arguments (``send_many``):
        each call of the function returned picks the next message's agent as :meth:`pick`
        would, one message at a time (the rotation, the in-flight counts and the breakers'
        probe slots move between calls), with the arguments checked and the routing state
        looked up once for the batch. Raises as :meth:`pick` does, per call."""
        full = partial(
            self.pick,
            capability,
            candidates,
            policy=policy,
            session_id=session_id,
            target=target,
            where=where,
            avoid=avoid,
            cost=cost,
        )
        if policy is None:
            policy = DEFAULT_POLICY
        if split is not None:  # a version drawn per message: each one picks on its own
            return partial(full, version=version, split=split)
        if policy not in ("weighted_rr", "least_conn"):
            return partial(full, version=version)
        try:
            st = self._states.get(capability, candidates, where, version, self.clock() * 1000.0)
        except NoAgentAvailable:  # raised by each pick, as pick() raises it
            return partial(full, version=version)
        if isinstance(avoid, str):  # one agent id, not a collection of characters
            avoid = (avoid,) if avoid else ()
        one = self._pick_least if policy == "least_conn" else self._pick_wrr

        def pick() -> AgentInfo:
            try:
                return one(st, candidates, avoid, cost)
            except _Stale:  # the list changed under its version: pick() rebuilds the state
                return full(version=None)

        return pick

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
        st = self._states.get(capability, candidates, where, version, now)
        sub = st.getter(candidates)
        if list(map(_id, sub)) != st.ids:  # the list changed under an unchanged version
            st = self._states.get(capability, candidates, where, None, now)
            sub = st.getter(candidates)
        inflight = self.inflight
        out: list[AgentInfo] = []
        is_open = self.breakers.is_open if self.breakers is not None else None
        for a in sub:
            if over_bound(a, inflight) or (is_open is not None and is_open(a.agent_id)):
                continue
            out.append(a)
        if not out:
            self._diagnose(st, candidates)
        return out

    def forget(self, capability: str | None = None) -> None:
        """Drop cached state (of one capability, or all)."""
        self._states.forget(capability)
        if capability is None:
            self._points.clear()

    # -- the dynamic checks ---------------------------------------------------------------
    def _diagnose(self, st: State, candidates: Sequence[AgentInfo]) -> list[AgentInfo]:
        """Full eligibility check: raises with the reason, or returns what is usable (of
        the state's application version, when it has one)."""
        if st.app_version is not None:
            candidates = [a for a in candidates if a.app_version == st.app_version]
        return eligible(
            candidates,
            capability=st.capability,
            where=st.where,
            is_open=self.breakers.is_open if self.breakers is not None else None,
            local_inflight=self.inflight,
        )

    def _usable_ids(self, st: State, candidates: Sequence[AgentInfo]) -> set[str]:
        """The ids of the usable agents (after many refusals); raises when there is none."""
        return {a.agent_id for a in self._diagnose(st, candidates)}

    def _usable(self, a: AgentInfo, avoid: Collection[str]) -> bool:
        """Dynamic checks of a proposed agent; takes the breaker probe slot when it passes."""
        if avoid and a.agent_id in avoid:
            return False
        mq = a.max_queue  # over_bound(), inlined: this runs on every pick
        if mq > 0 and a.queue_depth + self.inflight.get(a.agent_id, 0) >= mq:
            return False
        return self.breakers is None or self.breakers.allow(a.agent_id)

    def _fallback(
        self,
        st: State,
        candidates: Sequence[AgentInfo],
        avoid: Collection[str],
        weights: Sequence[float],
    ) -> AgentInfo:
        """After MAX_SKIPS refusals: filter once, then a weighted random choice of the rest."""
        ok = self._diagnose(st, candidates)  # raises when nothing is usable
        if avoid:
            ok = [a for a in ok if a.agent_id not in avoid] or ok
        pos = st.pos
        w = [weights[pos[a.agent_id]] if a.agent_id in pos else MIN_WEIGHT for a in ok]
        a = self.rng.choices(ok, weights=w)[0]
        if self.breakers is not None:
            self.breakers.allow(a.agent_id)  # not open per the filter: takes the probe slot
        return a

    def _roomiest(
        self,
        st: State,
        candidates: Sequence[AgentInfo],
        avoid: Collection[str],
        weights: Sequence[float],
        scores: Sequence[float] | None = None,
        cost: float = 1.0,
    ) -> AgentInfo:
        """The proposed agent is full: an agent with room, else where the wait is least.

        Among the usable agents (raises when there is none): with ``scores`` (least_conn)
        the one where a message of ``cost`` placed now ends first, by this client's
        estimate of each load (:meth:`Capacity.least_wait`: a long report may rather
        wait for a fast agent than run at an idle slow one); else (weighted_rr) a
        ``weights``-proportional random one of those with a free slot, or, all being full,
        one where the message ends first."""
        ok = self._diagnose(st, candidates)
        if avoid:
            ok = [a for a in ok if a.agent_id not in avoid] or ok
        cap, pos = self.capacity, st.pos
        room = [] if scores is not None else [a for a in ok if not cap.full(a)]
        if room:
            w = [weights[pos[a.agent_id]] if a.agent_id in pos else MIN_WEIGHT for a in room]
            a = self.rng.choices(room, weights=w)[0]
        else:
            a = self.rng.choice(cap.least_wait(ok, st.capability, cost))
        if self.breakers is not None:
            self.breakers.allow(a.agent_id)  # not open per the filter: takes the probe slot
        return a

    @staticmethod
    def _agent(st: State, candidates: Sequence[AgentInfo], j: int) -> AgentInfo:
        """The ``j``-th statically eligible agent; :class:`_Stale` when the list changed."""
        a = candidates[st.idx[j]]
        if a.agent_id != st.ids[j]:
            raise _Stale
        return a

    # -- version splits -------------------------------------------------------------------------
    def split_versions(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        split: Split,
        *,
        where: Mapping[str, Any] | None = None,
        version: object = None,
    ) -> list[str]:
        """The versions of ``split`` with a share above 0 that have an agent passing the
        static checks (O(1) each with ``version``), in the split's order."""
        now = self.clock() * 1000.0
        out = []
        for v in split.live:
            try:
                self._states.get(capability, candidates, where, version, now, v)
            except NoAgentAvailable:
                continue
            out.append(v)
        return out

    def _pick_split(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        split: Split,
        first: str | None,
        pick: Callable[..., AgentInfo],
        *,
        where: Mapping[str, Any] | None,
        version: object,
    ) -> AgentInfo:
        """``pick(app_version=v)`` for ``first`` (or a version drawn by share), then the
        other versions with a share and an agent, largest share first; the error of the
        first version tried when none can take it."""
        among = self.split_versions(capability, candidates, split, where=where, version=version)
        if first is None or first not in split.live:
            first = split.draw(self.rng, among)
        if first is None:  # no version with a share has an agent passing the static checks
            raise self._split_refusal(capability, candidates, split, where)
        try:
            return pick(app_version=first)
        except NoAgentAvailable as e:
            error = e
        for v in split.fallbacks(first, among):
            try:
                return pick(app_version=v)
            except NoAgentAvailable:
                continue
        raise error

    @staticmethod
    def _split_refusal(
        capability: str,
        candidates: Sequence[AgentInfo],
        split: Split,
        where: Mapping[str, Any] | None,
    ) -> NoAgentAvailable:
        """Why no version with a share has an agent: the reason among the agents of those
        versions (not ready, draining, filter...), or ``version`` when there are none."""
        mine = [a for a in candidates if capability in a.capabilities]
        if not mine:  # the capability itself is unknown: the usual error
            eligible(candidates, capability=capability, where=where)
        pool = [a for a in mine if a.app_version in split.live]
        if not pool:
            return version_missing(capability, split.live, mine)
        try:
            eligible(pool, capability=capability, where=where)
        except NoAgentAvailable as e:
            return e
        return version_missing(capability, split.live, mine)  # a view changed meanwhile

    # -- policies -----------------------------------------------------------------------------
    def _pick_wrr(
        self, st: State, candidates: Sequence[AgentInfo], avoid: Collection[str], cost: float
    ) -> AgentInfo:
        if not st.wrr_ok:
            st.wrr = Scheduler.succeeding(st.wrr, st.ids, st.eff, random=self.rng.random)
            st.wrr_ok = True
        sched = st.wrr
        assert sched is not None
        n = len(st.ids)
        if n == 1:
            # One agent: no choice to schedule. Its lag stays 0 whether its scheduler
            # counts the picks or not, so one joining later meets the same lags.
            a = self._agent(st, candidates, 0)
            return a if self._usable(a, avoid) else self._fallback(st, candidates, avoid, st.eff)
        full = self.capacity.full
        for _ in range(min(MAX_SKIPS, n)):
            a = self._agent(st, candidates, sched.next())
            if full(a):  # counts as served, like a refused agent
                return self._roomiest(st, candidates, avoid, st.eff, cost=cost)
            if self._usable(a, avoid):
                return a
        return self._fallback(st, candidates, avoid, st.eff)

    def _pick_least(
        self, st: State, candidates: Sequence[AgentInfo], avoid: Collection[str], cost: float
    ) -> AgentInfo:
        agents = st.getter(candidates)
        reports = list(map(_report, agents))
        if reports != st.lc_reports:  # they change with heartbeats only: cache their part
            st.lc_reports = reports
            st.lc_qd = list(map(_qd, agents))
            st.lc_entry, st.lc_cost = least_conn.factors(agents, st.capability, st.inv_eff)
            st.lc_base = least_conn.base_scores(st.lc_qd, st.lc_entry, st.lc_cost, 1.0)
        base = (
            st.lc_base
            if cost == 1.0
            else least_conn.base_scores(st.lc_qd, st.lc_entry, st.lc_cost, cost)
        )
        scores = least_conn.scores(base, st.lc_entry, st.ids, st.pos, self.inflight)
        inf = math.inf
        n = len(scores)
        for tries in range(n):
            if tries == MAX_SKIPS:  # many refusals: filter once (raises when none is usable)
                ok = self._usable_ids(st, candidates)
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
            a = self._agent(st, candidates, j)
            if n > 1 and self.capacity.full(a):
                return self._roomiest(st, candidates, avoid, st.eff, scores, cost)
            if self._usable(a, avoid):
                return a
            scores[j] = inf
        return self._fallback(st, candidates, avoid, st.eff)

    def _ring(self, st: State) -> Ring:
        """The ketama ring of the state's agents (built when they or their weights changed)."""
        if not st.ring_ok:
            members = ring.members(st.ids, st.weights, self.vnodes)
            if st.ring is None or st.ring.members != members:
                st.ring = Ring(members, self._points, st.ring)
                ring.prune(self._points, self._states.rings())
            st.ring_w = sum(st.weights)
            st.ring_ok = True
        assert st.ring is not None
        return st.ring

    def _pick_hash(
        self, st: State, candidates: Sequence[AgentInfo], session_id: str, avoid: Collection[str]
    ) -> AgentInfo:
        hring = self._ring(st)
        codes, owner, pos = hring.codes, hring.owner, st.pos
        p = hring.position(session_id)
        c = self.hash_load_factor
        if c is None and not avoid:  # fast path: the owner of the session's arc
            a = self._agent(st, candidates, pos[owner[codes[p] & TAG_MASK]])
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
            tag = codes[(p + step) % n_codes] & TAG_MASK
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
                    ok_ids = self._usable_ids(st, candidates)
            if len(seen) == n_agents:
                break
        # nobody under its cap is usable: the cap is a balance goal, not a bound to fail on
        for a in skipped_for_cap:
            if self._usable(a, avoid):
                return a
        return self._fallback(st, candidates, avoid, st.weights)

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
            st: State | None = self._states.get(capability, candidates, where, version, now)
        except NoAgentAvailable:
            st = None
        if st is not None and target in st.pos:
            a = self._agent(st, candidates, st.pos[target])
            if self._usable(a, ()):
                return a
        raise target_refusal(
            candidates,
            capability=capability,
            where=where,
            target=target,
            is_open=self.breakers.is_open if self.breakers is not None else None,
            local_inflight=self.inflight,
        )

"""The statically eligible agents of each ``(capability, where)``, cached per router.

The *static* checks of eligibility (capability, state, filter, draining, ready) depend only
on the registry snapshot, so their result is kept, with the structures the policies build on
it (the round-robin scheduler, the ketama ring, the least-connections scores), in one
:class:`State` per ``(capability, where)``, or per ``(capability, where, app_version)``
when a split chose the agents' application version (:mod:`reach.routing.split`): each
version then has its own rotation, ring and scores.

Validity
    Pass ``version=`` (the registry view's change counter) to make a lookup O(1): the same
    version promises the same agents in the same order with the same *static* fields (state,
    ready, draining, weight, ready_ms, capabilities, metadata). The load fields
    (``queue_depth``, ``inflight``, ``max_queue``) may change freely under one version: they
    are read from the objects passed in each call (a changed list under an unchanged version
    is caught by the router's agent-id check, and rebuilt). Without ``version`` the static
    filter runs on every lookup (O(N), ~200 µs at 1,000 agents) and the policy structures
    are still reused when the filtered ids and weights are unchanged. An entry also expires
    when a slow-start step of one of its agents is due, when a breaker changes state
    (:attr:`~reach.breaker.Breakers.changes`), and when a step of the ramp of an agent
    whose breaker closed is due (:meth:`~reach.breaker.Breakers.ramp`: the effective
    weights are the slowed ones times that factor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any, Final, TypeAlias

from ..breaker import Breakers
from ..registry import AgentInfo
from .eligibility import eligible, version_missing
from .ring import Ring
from .weights import floored, slowed
from .wrr import Scheduler

__all__ = ["State", "StateCache"]

MAX_ENTRIES: Final = 256  # (capability, where) entries kept per router

Where: TypeAlias = Mapping[str, Any] | None
_Key: TypeAlias = tuple[str, tuple[tuple[str, str], ...], str | None]

_id = attrgetter("agent_id")
_weight = attrgetter("weight")
_ready_ms = attrgetter("ready_ms")


def _none(_: Sequence[AgentInfo]) -> tuple[AgentInfo, ...]:
    return ()


class State:
    """Cached eligibility and policy state of one ``(capability, where)`` on one router.

    ``idx`` are the positions in the candidate list of the statically eligible agents,
    ``ids``/``weights``/``eff`` (effective, after slow start) their ids and weights in that
    order, ``pos`` id -> index into those lists, ``getter`` picks them out of the list.
    ``where`` is the filter of the call being served (calls whose filters print alike share
    one entry). ``app_version``: only agents of that application version (None: any).
    The ``*_ok`` flags say whether a policy's structure is still current.
    """

    __slots__ = (
        "app_version",
        "breaker_changes",
        "capability",
        "eff",
        "getter",
        "ids",
        "idx",
        "inv_eff",
        "lc_base",
        "lc_cost",
        "lc_entry",
        "lc_qd",
        "lc_reports",
        "n",
        "pos",
        "ramp_until",
        "ramps",
        "ready_ms",
        "ring",
        "ring_ok",
        "ring_w",
        "valid_until",
        "version",
        "weights",
        "where",
        "wrr",
        "wrr_ok",
    )

    def __init__(self, capability: str, app_version: str | None = None) -> None:
        self.capability = capability
        self.app_version = app_version
        self.where: Where = None
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
        self.getter: Callable[[Sequence[AgentInfo]], tuple[AgentInfo, ...]] = _none
        self.wrr: Scheduler | None = None
        self.wrr_ok = False
        self.ring: Ring | None = None
        self.ring_ok = False
        self.ring_w = 0.0
        self.lc_reports: list[Any] | None = None  # the agents' load reports the below are of
        self.lc_qd: list[int] = []
        self.lc_entry: list[float] = []  # least_conn.factors()
        self.lc_cost: list[float] = []
        self.lc_base: list[float] = []  # the scores of a message of cost 1 before in flight
        self.breaker_changes = -1  # the breakers' change count it was built at
        self.ramps: list[float] | None = None  # breaker ramp factors in effect (None: none)
        self.ramp_until = math.inf  # on the breakers' clock: when a ramp step is due


class StateCache:
    """The :class:`State` of each ``(capability, where)`` a router was asked for (at most
    ``MAX_ENTRIES``, the oldest dropped first). Iterating gives the keys,
    ``(capability, where as sorted (str, str) pairs, app_version)``.

    :param slow_start_ms: ramp time of a freshly ready agent's weight (0: none).
    :param slow_start_floor: the weight factor at the start of the ramp.
    :param breakers: the client's breakers, whose ramps after a close scale the weights.
    """

    def __init__(
        self, *, slow_start_ms: float, slow_start_floor: float, breakers: Breakers | None = None
    ) -> None:
        self.slow_start_ms = slow_start_ms
        self.slow_start_floor = slow_start_floor
        self.breakers = breakers
        self._states: dict[_Key, State] = {}

    def get(
        self,
        capability: str,
        candidates: Sequence[AgentInfo],
        where: Where,
        version: object,
        now_ms: float,
        app_version: str | None = None,
    ) -> State:
        """The state of ``(capability, where)`` over ``candidates`` (only the agents of
        ``app_version`` when given), rebuilt unless ``version`` vouches for the cached one;
        raises :class:`~reach.errors.NoAgentAvailable` (with the reason) when no candidate
        passes the static checks."""
        wkey = tuple(sorted((str(k), str(v)) for k, v in where.items())) if where else ()
        key = (capability, wkey, app_version)
        st = self._states.get(key)
        if (
            st is not None
            and version is not None
            and st.version == version
            and st.n == len(candidates)
            and now_ms < st.valid_until
            and (self.breakers is None or st.breaker_changes == self.breakers.changes)
            and (st.ramps is None or self._ramps_hold(st))
        ):
            st.where = where
            return st
        if st is None:
            st = State(capability, app_version)
            if len(self._states) >= MAX_ENTRIES:
                del self._states[next(iter(self._states))]
            self._states[key] = st
        st.where = where
        self._rebuild(st, candidates, now_ms)
        st.version = version
        return st

    def _ramps(self, ids: list[str]) -> tuple[list[float] | None, float]:
        """The breaker ramp factor of each of ``ids`` and until when they hold, on the
        breakers' clock (``None`` when no agent ramps: O(1) then)."""
        b = self.breakers
        if b is None or not b.ramping:
            return None, math.inf
        factors, hold_s = [], math.inf
        for agent_id in ids:
            f, h = b.ramp(agent_id)
            factors.append(f)
            hold_s = min(hold_s, h)
        if hold_s == math.inf:
            return None, math.inf
        return factors, b.clock() + hold_s

    def _ramps_hold(self, st: State) -> bool:
        """Do the ramp factors ``st`` was built with still hold?"""
        return self.breakers is not None and self.breakers.clock() < st.ramp_until

    def __iter__(self) -> Iterator[_Key]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def forget(self, capability: str | None = None) -> None:
        """Drop the states of one capability, or all."""
        if capability is None:
            self._states.clear()
        else:
            for key in [k for k in self._states if k[0] == capability]:
                del self._states[key]

    def rings(self) -> Iterator[Ring]:
        """The ketama rings the cached states hold."""
        return (r for st in self._states.values() if (r := st.ring) is not None)

    def _rebuild(self, st: State, candidates: Sequence[AgentInfo], now_ms: float) -> None:
        capability, where, app_version = st.capability, st.where, st.app_version
        st.version = None
        # The static checks of eligible(), in one pass (this runs per pick without version).
        idx = [
            i
            for i, a in enumerate(candidates)
            if a.ready
            and not a.draining
            and a.state == "active"
            and capability in a.capabilities
            and (not where or a.matches(where))
            and (app_version is None or a.app_version == app_version)
        ]
        if not idx:
            st.n = -1
            pool = candidates
            if app_version is not None and any(capability in a.capabilities for a in pool):
                pool = [a for a in candidates if a.app_version == app_version]
                if not any(capability in a.capabilities for a in pool):
                    raise version_missing(capability, [app_version], candidates)
            eligible(pool, capability=capability, where=where)  # raises with the reason
            raise AssertionError("eligible() found agents the static filter did not")
        sub = [candidates[i] for i in idx]
        ids = list(map(_id, sub))
        weights = floored(list(map(_weight, sub)))
        ready_ms = list(map(_ready_ms, sub))
        same_members = ids == st.ids and weights == st.weights
        ramps, st.ramp_until = self._ramps(ids)
        if self.breakers is not None:
            st.breaker_changes = self.breakers.changes
        if not (
            same_members
            and ready_ms == st.ready_ms
            and now_ms < st.valid_until
            and ramps == st.ramps
        ):
            eff, st.valid_until = slowed(
                weights, ready_ms, now_ms, self.slow_start_ms, floor=self.slow_start_floor
            )
            if ramps is not None:
                eff = [w * f for w, f in zip(eff, ramps, strict=True)]
            st.ramps = ramps
            if eff != st.eff or not same_members:
                st.wrr_ok = False
            st.eff = eff
            st.inv_eff = [1.0 / w for w in eff]
            st.lc_reports = None
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

"""Smooth weighted round-robin: the scheduler behind policy ``weighted_rr`` (the default).

It has the properties of nginx's algorithm (proportional, interleaved) in **O(log N) per
pick** instead of nginx's O(N) scan. nginx picks the agent with the largest lag
``w_i·T/W − k_i`` (picks owed); keeping that order in a heap is not possible because every
key moves at its own rate. We use instead the EEVDF rule (Stoica & Abdel-Wahab's *Earliest
Eligible Virtual Deadline First*): with virtual time ``V = T/W``, agent *i* with ``k_i``
picks has virtual start ``S_i = k_i/w_i`` and deadline ``F_i = (k_i+1)/w_i``; among agents
with ``S_i <= V`` (not ahead of their share) pick the earliest deadline. Two heaps (waiting
by ``S``, eligible by ``F``) make each pick ~4 heap operations. Like nginx it keeps every
agent's count within a pick or two of its exact share at every moment (property-tested:
< 2), so 4:1 gives 8,000/2,000 of 10,000 and the sequence interleaves (A B A A A ...; a
weight-10 agent among ten weight-1 agents alternates with them instead of taking ten picks
in a row, which plain stride/deadline scheduling would do).

The router caches a scheduler per ``(capability, where)`` and builds a new one only when the
eligible ids or effective weights change (:meth:`Scheduler.succeeding`): each surviving
agent keeps its lag (clamped to ±1 pick), so a membership change or a slow-start step does
not restart the sequence. New agents start with a random lag in ``[0, 1)``, so independent
clients do not all begin with the same agent; lags are then shifted by their mean to sum to
zero.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush

__all__ = ["Scheduler"]


class Scheduler:
    """Earliest eligible virtual deadline first over fixed weights; see the module docstring.

    :param ids: the agents, in the order :meth:`next` indexes them.
    :param weights: their (effective, > 0) weights.
    :param k0: picks each one starts with (fractional: minus its carried lag).
    """

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

    @classmethod
    def succeeding(
        cls,
        old: Scheduler | None,
        ids: list[str],
        weights: list[float],
        *,
        random: Callable[[], float],
    ) -> Scheduler:
        """A scheduler for ``ids``/``weights`` taking over from ``old`` (None: the first one).

        Agents of ``old`` keep their lag (clamped to ±1 pick), newcomers get ``random()``;
        lags are then shifted by their mean so that they sum to zero (EEVDF's invariant: the
        lag a leaving agent had is spread over the others).
        """
        carried: dict[str, float] = {}
        if old is not None:
            carried = dict(zip(old.ids, old.lags(), strict=True))
        lags = []
        for a in ids:
            lag = carried.get(a)
            lags.append(random() if lag is None else min(1.0, max(-1.0, lag)))
        shift = sum(lags) / len(lags)
        return cls(list(ids), list(weights), [shift - lag for lag in lags])

    def next(self) -> int:
        """The index (into ``ids``) of the agent that gets the next pick."""
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

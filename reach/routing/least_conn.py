"""The scores behind policy ``least_conn``: the expected time to finish the message placed.

An agent's score is the time the message would take there, wait and run, per unit of
weight::

    score = ((queued + in flight) x mean / slots + cost x mean) / effective weight

``mean`` is the agent's reported mean run time of a typical message of the capability
(:meth:`~reach.registry.AgentInfo.mean_us`; an agent that reports none is taken to have the
mean of those that do, all alike when none does), ``slots`` its concurrency (1 when not
reported), ``queued`` the queue depth it last reported and ``in flight`` this client's
requests to it, ``cost`` the message's own (1 = typical). So an agent twice as slow gets
about half the traffic of a fast one of equal slots once its mean is known, and a costly
message (a long report) leans harder towards fast agents than a cheap one (a short answer,
which may as well wait less at a slow but idle agent). With equal means and slots it is the
classic least-connections: the fewest outstanding per unit of weight; the weight keeps
slow start working (a fresh agent at 10 % weight is chosen once the others hold ~9 each).

The per-agent factors (:func:`factors`) and the queue-depth part of the scores are cached
until a report changes; this client's in-flight counts are added (:func:`scores`) only for
the agents that have some. Ties are broken at random by the router.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import add, mul

from ..registry import AgentInfo

__all__ = ["base_scores", "factors", "scores"]


def factors(
    agents: Sequence[AgentInfo], capability: str, inv_weights: Sequence[float]
) -> tuple[list[float], list[float]]:
    """Per agent: the time one queued entry adds (``mean / slots / weight``) and the time
    a message of cost 1 runs (``mean / weight``), both in µs per unit of weight."""
    means = [a.mean_us(capability) for a in agents]
    known = [m for m in means if m > 0]
    default = sum(known) / len(known) if known else 1.0
    per_entry: list[float] = []
    per_cost: list[float] = []
    for a, m, inv in zip(agents, means, inv_weights, strict=True):
        t = (m or default) * inv
        per_cost.append(t)
        per_entry.append(t / (a.slots or 1))
    return per_entry, per_cost


def base_scores(
    queue_depths: Sequence[int], per_entry: Sequence[float], per_cost: Sequence[float], cost: float
) -> list[float]:
    """``queue_depth x per_entry + cost x per_cost`` per agent."""
    queued = map(mul, queue_depths, per_entry)
    if cost == 1.0:
        return list(map(add, queued, per_cost))
    return list(map(add, queued, map(mul, per_cost, repeat(cost))))


def scores(
    base: list[float],
    per_entry: Sequence[float],
    ids: Sequence[str],
    pos: Mapping[str, int],
    inflight: Mapping[str, int],
) -> list[float]:
    """``base`` plus each agent's in-flight count x ``per_entry`` (a new list).

    ``ids`` are the agents in score order and ``pos`` their index; with few agents in flight
    only those are visited.
    """
    out = base.copy()
    if not inflight:
        return out
    if len(inflight) * 4 < len(out):
        for aid, n in inflight.items():
            j = pos.get(aid)
            if j is not None and n:
                out[j] += n * per_entry[j]
        return out
    local = map(mul, map(inflight.get, ids, repeat(0)), per_entry)
    return list(map(add, out, local))

"""The scores behind policy ``least_conn``.

The router picks the minimum of ``(outstanding + 1) / effective_weight``, where outstanding
is this client's in-flight count to the agent plus the queue depth it last reported; ties
are broken at random. The ``+ 1`` (the request being placed) makes weights matter at zero
load and makes slow start effective: a fresh agent with 10 % weight is only chosen once the
others hold ~9 outstanding each. It is an exact O(N) scan done with C-level ``map``/``min``:
the queue-depth part of the scores (:func:`base_scores`) is cached until a depth changes,
and this client's in-flight counts are added (:func:`scores`) only for the agents that have
some.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import add, mul

__all__ = ["base_scores", "scores"]


def base_scores(queue_depths: Sequence[int], inv_weights: Sequence[float]) -> list[float]:
    """``(queue_depth + 1) / weight`` per agent (``inv_weights``: 1 / effective weight)."""
    return list(map(mul, map(add, queue_depths, repeat(1)), inv_weights))


def scores(
    base: list[float],
    inv_weights: Sequence[float],
    ids: Sequence[str],
    pos: Mapping[str, int],
    inflight: Mapping[str, int],
) -> list[float]:
    """``base`` plus each agent's in-flight count / weight (a new list).

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
                out[j] += n * inv_weights[j]
        return out
    local = map(mul, map(inflight.get, ids, repeat(0)), inv_weights)
    return list(map(add, out, local))

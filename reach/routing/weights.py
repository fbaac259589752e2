"""Effective weights: the weight floor and slow start.

Weights
    Weights below :data:`MIN_WEIGHT` are raised to it, so weight 0 means "practically never,
    unless nothing else is usable".

Slow start
    An agent whose ``ready_ms`` is less than ``slow_start_s`` ago has its weight multiplied by
    a factor rising linearly from ``slow_start_floor`` (10 %) to 1, in :data:`SLOW_START_STEPS`
    steps so that cached structures change at most that many times per ramp. Used by
    ``weighted_rr`` and ``least_conn``; ``consistent_hash`` ignores it (it would move
    sessions). ``ready_ms == 0`` means "unknown": full weight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

__all__ = ["MIN_WEIGHT", "SLOW_START_STEPS", "floored", "slow_start_factor", "slowed"]

MIN_WEIGHT: Final = 1e-6
SLOW_START_STEPS: Final = 20


def floored(weights: list[float]) -> list[float]:
    """``weights`` with each one raised to at least :data:`MIN_WEIGHT` (the same list when
    none is below it)."""
    if min(weights) < MIN_WEIGHT:
        return [max(w, MIN_WEIGHT) for w in weights]
    return weights


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


def slowed(
    weights: list[float],
    ready_ms: Sequence[int],
    now_ms: float,
    slow_start_ms: float,
    *,
    floor: float,
) -> tuple[list[float], float]:
    """``(effective weights, valid_until_ms)``: each weight times its slow-start factor, and
    the time until which all of those factors hold (``weights`` itself, valid for ever, when
    slow start is off)."""
    if slow_start_ms <= 0:
        return weights, math.inf
    valid = math.inf
    eff = []
    for w, r in zip(weights, ready_ms, strict=True):
        f, until = slow_start_factor(r, now_ms, slow_start_ms, floor=floor)
        eff.append(w * f)
        valid = min(valid, until)
    return eff, valid

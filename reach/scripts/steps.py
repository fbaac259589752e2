"""The typed call of ``lua/step.lua``: journal a durable step's result in its message's
idempotency record, only while the run that made it holds the message's claim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._call import Call, as_bytes, as_int
from .codes import StepBound, StepCode

FIELD_PREFIX = "s:"
"""A journaled result's field in the record is this prefix and the step's name."""

COUNT_FIELD = "steps"
"""The record's field counting the results journaled (absent: none)."""

RESULT_MAX_BYTES = int(StepBound.RESULT_BYTES)
MAX_STEPS = int(StepBound.STEPS)
NAME_MAX_BYTES = int(StepBound.NAME_BYTES)


@dataclass(frozen=True, slots=True)
class StepAnswer:
    """``step.lua``'s answer: the code; with JOURNALED and FULL the number of results
    journaled (``count``), with KEPT the result journaled first (``stored``)."""

    code: StepCode
    count: int = 0
    stored: bytes = b""


def _answer(reply: Any) -> StepAnswer:
    code = StepCode(as_int(reply[0]))
    if code == StepCode.KEPT:
        return StepAnswer(code, stored=as_bytes(reply[1]))
    if code in (StepCode.JOURNALED, StepCode.FULL):
        return StepAnswer(code, count=as_int(reply[1]))
    return StepAnswer(code)


def step_call(record: str, *, owner: str, fence: int, name: str, result: bytes) -> Call[StepAnswer]:
    """One ``step.lua`` call: store ``result`` (msgpack bytes) as step ``name`` in idempotency
    record ``record`` if the claim of ``owner`` with ``fence`` still holds it."""
    return Call("step", (record,), (owner, fence, name, result), _answer)

"""The typed calls of ``lua/ask.lua`` (a handler puts a question and waits for input),
``lua/withdraw_ask.lua`` (its time is up: the question is taken back unless answered) and
``lua/answer.lua`` (the answer is stored and the waiting handler woken):
:mod:`reach.asking` uses them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._call import Call, as_bytes, as_int
from .codes import AnswerCode, AskBound, AskCode

ANSWER_PREFIX = "a:"
"""An answer's field in the record is this prefix and the ask's number."""

QUESTION_MAX_BYTES = int(AskBound.QUESTION_BYTES)
ANSWER_MAX_BYTES = int(AskBound.ANSWER_BYTES)
MAX_ASKS = int(AskBound.ASKS)


@dataclass(frozen=True, slots=True)
class AskAnswer:
    """``ask.lua``'s or ``withdraw_ask.lua``'s answer: the code; with ASKED whether the ask
    was never put before (``new``), with ANSWERED the answer's bytes (``answer``)."""

    code: AskCode
    new: bool = False
    answer: bytes = b""


def _ask_answer(reply: Any) -> AskAnswer:
    code = AskCode(as_int(reply[0]))
    if code == AskCode.ANSWERED:
        return AskAnswer(code, answer=as_bytes(reply[1]))
    if code == AskCode.ASKED:
        return AskAnswer(code, new=as_int(reply[1]) == 1)
    return AskAnswer(code)


def ask_call(
    record: str, *, owner: str, fence: int, n: int, question: str, until_ms: int
) -> Call[AskAnswer]:
    """One ``ask.lua`` call: put ask ``n`` (``question``, giving up at ``until_ms``, 0:
    never) in idempotency record ``record`` if the claim of ``owner`` with ``fence`` holds
    it, or get the ask's stored answer."""
    return Call("ask", (record,), (owner, fence, n, question, until_ms), _ask_answer)


def withdraw_call(record: str, *, owner: str, fence: int, n: int) -> Call[AskAnswer]:
    """One ``withdraw_ask.lua`` call: take ask ``n`` back (no answer came in time), unless
    its answer is stored (then returned)."""
    return Call("withdraw_ask", (record,), (owner, fence, n), _ask_answer)


@dataclass(frozen=True, slots=True)
class AnswerReply:
    """``answer.lua``'s answer: the code; the ask's number with ANSWERED and ALREADY, the
    task's status with NOT_WAITING."""

    code: AnswerCode
    n: int = 0
    status: str = ""


def _answer_reply(reply: Any) -> AnswerReply:
    code = AnswerCode(as_int(reply[0]))
    if code in (AnswerCode.ANSWERED, AnswerCode.ALREADY):
        return AnswerReply(code, n=as_int(reply[1]))
    if code == AnswerCode.NOT_WAITING:
        return AnswerReply(code, status=as_bytes(reply[1]).decode("utf-8", "replace"))
    return AnswerReply(code)


def answer_call(record: str, *, answer: bytes, n: int | None = None) -> Call[AnswerReply]:
    """One ``answer.lua`` call: store ``answer`` (JSON bytes) for ask ``n`` (None: the one
    waiting) of idempotency record ``record``."""
    return Call("answer", (record,), (answer, "" if n is None else n), _answer_reply)

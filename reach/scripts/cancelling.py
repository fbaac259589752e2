"""The typed call of ``lua/cancel.lua``: cancel a message that has not finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._call import Call, as_int, as_text
from .codes import CancelCode

CANCELS_MAXLEN = 10_000
"""The cancel notices stream is trimmed to about this many (workers read it as it comes:
only a worker away longer than that many cancels misses one, and the record's fence still
refuses its completion)."""


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    """``cancel.lua``'s answer: the code, and the status the record had (CANCELLED: the
    one it had before; DONE: the one it ended with)."""

    code: CancelCode
    status: str = ""


def _answer(reply: Any) -> CancelAnswer:
    return CancelAnswer(CancelCode(as_int(reply[0])), as_text(reply[1]))


def cancel_call(
    record: str,
    *,
    msg_id: str,
    error: str,
    ttl_ms: int,
    notices: str | None = None,
    maxlen: int = CANCELS_MAXLEN,
) -> Call[CancelAnswer]:
    """One ``cancel.lua`` call for idempotency record ``record`` (of ``msg_id``); with
    ``notices`` (standalone Redis: any slot), the notice to the workers is added in the same
    step."""
    keys = (record,) if notices is None else (record, notices)
    return Call("cancel", keys, (msg_id, error[:2000], ttl_ms, maxlen), _answer)

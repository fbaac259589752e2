"""The typed calls of ``lua/session_write.lua`` (a batch of writes to one session, its
version raised and announced) and ``lua/session_read.lua`` (a session's values or history
with its version): :mod:`reach.session` and :mod:`reach._sessions` use them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..keys import Keys
from ._call import Arg, Call, as_bytes, as_int

SET, DELETE, APPEND, CLEAR = "S", "D", "A", "C"
"""The op codes of session_write.lua: ``S field value``, ``D field``, ``A item max_len``,
``C``."""


def _written(reply: Any) -> tuple[int, int]:
    return as_int(reply[0]), as_int(reply[1])


def write_call(
    keys: Keys,
    session_id: str,
    ops: Sequence[Arg],
    *,
    ttl_ms: int,
    announce: bool = True,
) -> Call[tuple[int, int]]:
    """One ``session_write.lua`` call applying ``ops`` (op codes and their arguments, in
    order) to session ``session_id``: its new version and its history's length.
    ``announce``: tell the agents caching sessions (the namespace's change channel)."""
    return Call(
        "session_write",
        (
            keys.session(session_id),
            keys.session_history(session_id),
            keys.session_version(session_id),
        ),
        (ttl_ms, keys.session_changes if announce else "", session_id, *ops),
        _written,
    )


def _values(reply: Any) -> tuple[int, dict[bytes, bytes]]:
    flat = reply[1]
    return as_int(reply[0]), {
        as_bytes(flat[i]): as_bytes(flat[i + 1]) for i in range(0, len(flat) - 1, 2)
    }


def _history(reply: Any) -> tuple[int, list[bytes]]:
    return as_int(reply[0]), [as_bytes(x) for x in reply[1]]


def read_values_call(keys: Keys, session_id: str) -> Call[tuple[int, dict[bytes, bytes]]]:
    """One ``session_read.lua`` call: the session's version and its values (encoded)."""
    return Call(
        "session_read",
        (
            keys.session(session_id),
            keys.session_history(session_id),
            keys.session_version(session_id),
        ),
        ("values",),
        _values,
    )


def read_history_call(keys: Keys, session_id: str) -> Call[tuple[int, list[bytes]]]:
    """One ``session_read.lua`` call: the session's version and its whole history
    (encoded items, oldest first)."""
    return Call(
        "session_read",
        (
            keys.session(session_id),
            keys.session_history(session_id),
            keys.session_version(session_id),
        ),
        ("history",),
        _history,
    )

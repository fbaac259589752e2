"""The typed calls of the scheduled sends' scripts: ``mark_scheduled.lua`` (the task
record), ``schedule.lua`` (keep the envelope until due), ``take_due.lua`` (a mover takes
the due ones under a lease) and ``unschedule.lua`` (remove placed or cancelled ones)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..keys import Keys
from ._call import Call, as_bytes, as_int, as_text

UNSCHEDULE_MAX = 1000
"""msg_ids per ``unschedule.lua`` call at most (Lua's unpack bounds it)."""


def mark_scheduled_call(
    record: str, *, capability: str, msg_id: str, due_ms: int, ttl_ms: int
) -> Call[bool]:
    """Write the task record of a scheduled send (status ``scheduled``) unless it exists.
    True: written; False: the record existed."""
    return Call(
        "mark_scheduled",
        (record,),
        (capability, msg_id, due_ms, ttl_ms),
        lambda reply: as_int(reply) == 1,
    )


def schedule_call(keys: Keys, *, msg_id: str, due_ms: int, envelope: bytes) -> Call[bool]:
    """Keep ``envelope`` until ``due_ms``. True: scheduled; False: that msg_id was already."""
    return Call(
        "schedule",
        (keys.scheduled, keys.scheduled_envelopes),
        (msg_id, due_ms, envelope),
        lambda reply: as_int(reply) == 1,
    )


@dataclass(frozen=True, slots=True)
class Taken:
    """``take_due.lua``'s answer: the server time, the earliest due time left (-1: none)
    and the entries taken (msg_id, envelope bytes)."""

    now_ms: int
    next_ms: int
    entries: tuple[tuple[str, bytes], ...]


def _taken(reply: Any) -> Taken:
    rest = reply[2:]
    entries = tuple((as_text(rest[i]), as_bytes(rest[i + 1])) for i in range(0, len(rest), 2))
    return Taken(as_int(reply[0]), as_int(reply[1]), entries)


def take_due_call(keys: Keys, *, limit: int, lease_ms: int) -> Call[Taken]:
    """Take up to ``limit`` due scheduled sends, each leased for ``lease_ms``."""
    return Call(
        "take_due",
        (keys.scheduled, keys.scheduled_envelopes),
        (limit, lease_ms),
        _taken,
    )


def unschedule_call(keys: Keys, msg_ids: Sequence[str]) -> Call[int]:
    """Remove ``msg_ids`` (at most :data:`UNSCHEDULE_MAX`) and their envelopes; how many
    were scheduled."""
    return Call(
        "unschedule",
        (keys.scheduled, keys.scheduled_envelopes),
        tuple(msg_ids),
        as_int,
    )

"""The typed calls of ``lua/watch.lua`` (a task record marked watched: its changes are
announced from then on) and ``lua/progress.lua`` (a running handler's progress, recorded
and announced to the task's watchers): :mod:`reach.watch` uses them."""

from __future__ import annotations

from typing import Any

from ._call import Call, as_int

MAX_NOTE_BYTES = 512
"""The longest progress note ``progress.lua`` takes (UTF-8 bytes); ``ctx.progress`` cuts a
longer one."""


def _recorded(reply: Any) -> bool:
    return as_int(reply) == 1


def progress_call(record: str, *, fence: int, fraction: str, note: str) -> Call[bool]:
    """One ``progress.lua`` call on idempotency record ``record`` for the run holding
    ``fence``: True when recorded (and announced), False when that run no longer holds
    the record (fenced out, cancelled, finished)."""
    return Call("progress", (record,), (fence, fraction, note), _recorded)


def watch_call(record: str) -> Call[bool]:
    """One ``watch.lua`` call: mark idempotency record ``record`` watched; False when there
    is no such record (never sent, or expired)."""
    return Call("watch", (record,), (), _recorded)

"""``reach task MSG_ID --follow``: each change of a task printed as it happens, until the
final one (reach.Client.watch's changes, from any process)."""

from __future__ import annotations

import sys
import time
from typing import Any

from reach.connection import AnyRedis
from reach.envelope import decode_payload
from reach.keys import Keys
from reach.outcomes import Status
from reach.watch import TaskChange, watch_task

from .common import json_line


def _result(change: TaskChange) -> Any:
    reply = change.task.reply if change.task is not None else None
    if reply is None or reply.status != Status.SUCCEEDED:
        return None
    try:
        return decode_payload(reply.result)
    except Exception:  # noqa: BLE001 - whatever the stored bytes are, the change is shown
        return "<undecodable>"


def row(change: TaskChange) -> dict[str, Any]:
    """A change as ``--json`` prints it (one object per line); the final one also carries
    the task's error and result."""
    out: dict[str, Any] = {
        "msg_id": change.msg_id,
        "kind": change.kind,
        "status": change.status,
        "progress": change.progress,
        "note": change.note,
        "final": change.final,
        "ts_ms": int(time.time() * 1000),
    }
    if change.question:  # input_required: what `reach task answer` answers
        out["question"] = change.question
    if change.final and change.task is not None:
        out["error"] = change.task.error_text
        out["result"] = _result(change)
    return out


def line(change: TaskChange) -> str:
    """A change as a person reads it: the local time, the status, then the progress (a
    percentage and its note), or for the final change its error or result."""
    when = time.strftime("%H:%M:%S")
    text = f"{when}  {change.status}"
    if change.kind == "progress" or (change.kind == "current" and change.progress is not None):
        text += f"  {100 * (change.progress or 0):.0f}%"
        if change.note:
            text += f"  {change.note}"
    if change.question:
        text += f"  asks: {change.question}"
    if change.final and change.task is not None:
        if change.task.error_text:
            text += f"  {change.task.error_text}"
        elif (result := _result(change)) is not None:
            text += f"  result: {json_line(result)}"
    return text


async def follow(r: AnyRedis, keys: Keys, msg_id: str, *, json_: bool) -> str:
    """Print each change of ``msg_id``'s task as it comes; returns the final status."""
    status = Status.UNKNOWN.value
    async for change in watch_task(r, r, keys, msg_id):
        sys.stdout.write((json_line(row(change)) if json_ else line(change)) + "\n")
        sys.stdout.flush()
        status = change.status
    return status

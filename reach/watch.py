"""Watching a task: every change of a message's task record, from any process.

The scripts that change a record (send/mark_pending, claim, start, progress, complete,
settle, give_up, cancel) announce the change on a sharded pub/sub channel named as the
record (``lua/includes/announce.lua``, :meth:`reach.keys.Keys.task_changes`) when the
record is watched (its ``watched`` field, set by ``lua/watch.lua``). A watcher subscribes
first, then marks the record watched, then reads it: what it read is the first change it
yields, and every change after it arrives on the channel, in the order the scripts ran.
A message nobody watches costs nothing more than a field the scripts read anyway
(docs/concepts.md, *Watching a task*, says why it is not a stream per task, with the
measurement). A connection lost is survived: the watcher subscribes again and reads the
record again, yielding what changed meanwhile as one change.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
from redis import exceptions as rexc

from .connection import AnyRedis, as_text, is_cluster
from .errors import ConfigError, DeadlineExceeded
from .keys import Keys
from .outcomes import FINAL_STATUSES, Status
from .scripts.watching import MAX_NOTE_BYTES, progress_call, watch_call
from .tasks import TaskStatus, get_status
from .untrusted import safe_text

ENDS: frozenset[str] = frozenset(FINAL_STATUSES | {Status.CANCELLED, Status.FAILED})
"""The statuses after which a task does not change any more: a watch ends with them."""

READ_S = 10.0
"""How long one read of the channel waits before the watcher checks its own timeout (and
the connection): a bound on how late a ``timeout_s`` is noticed, not on any change."""


class TaskChange(msgspec.Struct, kw_only=True, frozen=True):
    """One change of a task, as :meth:`reach.Client.watch` yields it.

    ``kind`` is ``status`` (the task's status changed to ``status``), ``progress`` (its
    handler reported ``progress``, a fraction 0..1, and ``note``), or ``current`` (the
    first change a watch yields: the task as it is when the watch began, with its latest
    progress if any). ``final`` is True for the last change a watch yields: succeeded,
    dead, expired, cancelled, or ``unknown`` (no record: never sent, or expired). ``task``
    is the whole record (its reply, its error) with the first change and the final one."""

    msg_id: str
    kind: str
    status: str
    progress: float | None = None
    note: str = ""
    final: bool = False
    task: TaskStatus | None = None
    question: str = ""
    """With status ``input_required``: the question its handler asked (``ctx.ask``);
    ``client.answer(msg_id, value)`` answers it."""


def parse_fraction(fraction: float) -> str:
    """``fraction`` as ``progress.lua`` takes it (decimal text, at most 12 bytes); raises
    ConfigError unless it is a number 0..1."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise ConfigError(f"progress fraction must be a number 0..1, got {fraction!r}.")
    if not (math.isfinite(fraction) and 0 <= fraction <= 1):
        raise ConfigError(
            f"progress fraction must be within 0..1 (0.25 = a quarter done), got {fraction!r}."
        )
    return f"{float(fraction):.6f}".rstrip("0").rstrip(".") or "0"


def cut_note(note: str) -> str:
    """``note`` cut to :data:`MAX_NOTE_BYTES` UTF-8 bytes (on a character boundary)."""
    if not isinstance(note, str):
        raise ConfigError(f"progress note must be text, got {type(note).__name__}.")
    data = note.encode("utf-8", "replace")
    if len(data) <= MAX_NOTE_BYTES:
        return note
    return data[:MAX_NOTE_BYTES].decode("utf-8", "ignore")


async def report_progress(
    redis: AnyRedis, record: str, *, fence: int, fraction: float, note: str
) -> bool:
    """Record ``fraction`` and ``note`` in ``record`` for the run holding ``fence``, and
    announce them; False when that run no longer holds the record."""
    text = parse_fraction(fraction)
    return await progress_call(record, fence=fence, fraction=text, note=cut_note(note)).run(redis)


class _Channel:
    """One ``SSUBSCRIBE`` connection of its own to the node holding ``channel``'s slot
    (a subscribed connection serves nothing else, so it is not taken from the pool)."""

    def __init__(self, raw: AnyRedis, channel: str) -> None:
        self.raw = raw
        self.channel = channel
        self.conn: Any = None

    async def open(self) -> None:
        """Connect and subscribe; return once the server confirmed the subscription (a
        change announced after that reaches this connection)."""
        raw: Any = self.raw
        if is_cluster(raw):
            node = raw.get_node_from_key(self.channel)
            conn = node.connection_class(**node.connection_kwargs)
        else:
            conn = raw.connection_pool.make_connection()
        self.conn = conn
        await conn.connect()
        await conn.send_command("SSUBSCRIBE", self.channel)
        while True:
            msg = await conn.read_response(disable_decoding=True, timeout=30.0, push_request=True)
            if msg is None:
                raise rexc.TimeoutError(f"SSUBSCRIBE {self.channel} not confirmed in 30 s")
            if isinstance(msg, list) and msg and msg[0] == b"ssubscribe":
                return

    async def read(self, timeout_s: float) -> bytes | None:
        """The next message on the channel, or None when none came within ``timeout_s``;
        raises a Redis or OS error when the connection is lost (or the slot moved)."""
        while True:
            msg = await self.conn.read_response(
                disable_decoding=True, timeout=timeout_s, push_request=True
            )
            if msg is None:
                return None
            if not isinstance(msg, list) or len(msg) < 3:
                continue
            if msg[0] == b"smessage":
                return bytes(msg[2])
            if msg[0] == b"sunsubscribe":  # the server's doing: the slot moved
                raise rexc.ConnectionError(f"{self.channel} unsubscribed by the server")

    async def close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            try:
                await conn.disconnect()
            except Exception:  # noqa: BLE001, S110 - closing a connection that may be broken
                pass


def _current(msg_id: str, task: TaskStatus) -> TaskChange:
    return TaskChange(
        msg_id=msg_id,
        kind="current",
        status=task.status,
        progress=task.progress,
        note=task.progress_note,
        final=task.status in ENDS or task.status == Status.UNKNOWN,
        task=task,
        question=task.question,
    )


def _parse(msg_id: str, status: str, data: bytes) -> TaskChange | None:
    """The change a channel message announces (``status``: the last one yielded), or None
    for a message reach does not send."""
    text = safe_text(data)
    if text.startswith("progress:"):
        fraction, _, note = text[len("progress:") :].partition(":")
        try:
            value = float(fraction)
        except ValueError:
            return None
        return TaskChange(msg_id=msg_id, kind="progress", status=status, progress=value, note=note)
    if text not in Status.__members__.values() or text == Status.UNKNOWN:
        return None
    return TaskChange(msg_id=msg_id, kind="status", status=text)


OPEN_TRIES = 20
"""How many times in a row a watch tries to subscribe (a lost connection, Redis restarting
or failing over) before it gives up with the connection's error: about 15 s in all."""


async def _open(channel: _Channel, end: float | None) -> None:
    """Subscribe ``channel``, trying again after a failure (backing off up to 1 s) until
    :data:`OPEN_TRIES` failed or the watch's time is up."""
    for n in range(OPEN_TRIES):
        try:
            await channel.open()
            return
        except (rexc.ConnectionError, rexc.TimeoutError):
            await channel.close()
            if n == OPEN_TRIES - 1 or (end is not None and time.monotonic() >= end):
                raise
        await anyio.sleep(min(1.0, 0.05 * 2**n))


def _repeats(got: TaskChange, last: TaskChange) -> bool:
    """``got`` says nothing ``last`` did not: the change the record read already showed
    (announced between the subscription and the read), or a run taken over that starts
    'running' again (collapsed: its attempt and progress show in what follows)."""
    if got.kind == "progress":
        return (got.progress, got.note) == (last.progress, last.note)
    return got.status == last.status


async def watch_task(
    commands: AnyRedis,
    raw: AnyRedis,
    keys: Keys,
    msg_id: str,
    *,
    timeout_s: float | None = None,
) -> AsyncIterator[TaskChange]:
    """Yield every change of ``msg_id``'s task (see :meth:`reach.Client.watch`):
    ``commands`` serves the reads, ``raw`` (the plain client under it) the subscription."""
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ConfigError(f"watch timeout_s must be a number > 0 (or None), got {timeout_s!r}.")
    end = None if timeout_s is None else time.monotonic() + timeout_s
    pointer = await commands.get(keys.task(msg_id))
    key = as_text(pointer) if pointer else msg_id
    record = keys.idem(key)
    channel = _Channel(raw, keys.task_changes(key))
    last: TaskChange | None = None
    try:
        while True:  # one pass per connection: subscribe, read the record, follow
            await _open(channel, end)
            if await watch_call(record).run(commands):
                task = await get_status(commands, keys, msg_id)
            else:  # nothing will announce a record that did not exist when it was marked
                task = TaskStatus(msg_id=msg_id, status=Status.UNKNOWN)
            change = _current(msg_id, task)
            if last is None or (change.status, change.progress, change.note) != (
                last.status,
                last.progress,
                last.note,
            ):
                yield change
                last = change
            if change.final:
                return
            while True:
                wait = READ_S if end is None else min(READ_S, end - time.monotonic())
                if wait <= 0:
                    raise DeadlineExceeded(
                        f"Task {msg_id} is still {last.status} after the watch's "
                        f"timeout_s={timeout_s}: watch again to go on following it, or "
                        "cancel it with client.cancel."
                    )
                try:
                    data = await channel.read(wait)
                except (rexc.ConnectionError, rexc.TimeoutError):
                    await channel.close()  # subscribe again, then read the record again
                    break
                if data is not None:
                    got = _parse(msg_id, last.status, data)
                    if got is None or _repeats(got, last):
                        continue
                    if got.status in ENDS:
                        task = await get_status(commands, keys, msg_id)
                        got = msgspec.structs.replace(got, final=True, task=task)
                    elif got.status == Status.INPUT_REQUIRED and got.kind == "status":
                        task = await get_status(commands, keys, msg_id)
                        got = msgspec.structs.replace(got, task=task, question=task.question)
                    yield got
                    last = got
                    if got.final:
                        return
    finally:
        await channel.close()

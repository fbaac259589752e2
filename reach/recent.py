"""The index of recent messages: what the console's message list and ``reach tasks`` read.

Writing (the hot path): each settled batch adds its handled messages to one stream,
``Keys.recent``, in the same ``settle.lua`` call that settles them (on a Cluster, in the
same pipeline): one ``XADD`` per chunk of up to :data:`ROWS_PER_ENTRY` messages, each
message a packed row (:class:`Row`: ids, capability, agent, outcome, attempt, when it ran,
the first bytes of its payload). No extra round trip and no command per message; the
worker's own cost is building the row. ``bench/recent_index_bench.py`` measures it
(docs/web.md has the numbers).

Bounded: the stream is trimmed to about ``maxlen`` entries (``XADD MAXLEN ~``;
:data:`RECENT_MAXLEN` by default), so it holds at least that many recent attempts (when
batches are single messages) and at most ``maxlen * ROWS_PER_ENTRY`` rows of at most
:data:`PAYLOAD_HEAD_BYTES` of payload each.

Reading (the viewer's cost): :func:`list_messages` walks the stream newest first and
reads the current status of each message it lists from its task record (one pipelined
round trip per page); messages still in an inbox (pending, or running) are read from the
inboxes themselves. Rows of agents written in other languages appear only if they write
the index too (it is optional: docs/protocol.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .connection import AnyRedis
from .envelope import BadEnvelope, Envelope, decode_envelope, now_ms
from .keys import PRIORITIES, Keys
from .outcomes import DeadReason, Status
from .untrusted import safe_int, safe_text

RECENT_MAXLEN = 5000
"""Index entries kept (about: ``XADD MAXLEN ~``)."""
ROWS_PER_ENTRY = 64
"""Messages packed into one index entry at most (a larger batch writes several)."""
PAYLOAD_HEAD_BYTES = 256
"""Bytes of each message's (msgpack) payload kept in its row, for a preview."""
SCAN_ENTRIES = 2000
"""Index entries one page of :func:`list_messages` reads at most before it answers."""


class Row(msgspec.Struct, array_like=True, frozen=True):
    """One attempt of one message as the index keeps it (a msgpack array, positional)."""

    msg_id: str
    key: str  # the name of its idempotency record, Envelope.key ('' when it is the msg_id)
    capability: str
    agent_id: str
    status: str  # succeeded, retrying, dead, expired, cancelled: how this attempt ended
    reason: str = ""
    error_type: str = ""
    attempt: int = 1
    sent_ms: int = 0
    started_ms: int = 0  # when the handler started (0: it did not run)
    ended_ms: int = 0  # when it was settled
    payload_len: int = 0
    payload_head: bytes = b""

    @property
    def idempotency_key(self) -> str:
        return self.key or self.msg_id


_ROWS = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder(list[Row])


RowTuple = tuple[str, str, str, str, str, str, str, int, int, int, int, int, memoryview]
"""A :class:`Row`'s fields in order, as the worker builds it (a tuple encodes faster)."""


def row_of(
    env: Envelope,
    *,
    agent_id: str,
    status: str,
    reason: str,
    error_type: str,
    started_ms: int,
    ended_ms: int,
    key: str = "",
) -> RowTuple:
    """The index row of one handled attempt of ``env`` (the fields of :class:`Row`);
    ``key``: its idempotency key when the caller has it at hand (else ``env.key``)."""
    payload = env.payload
    if reason == DeadReason.CANCELLED:
        status = Status.CANCELLED
    key = key or env.key
    return (
        env.msg_id,
        "" if key == env.msg_id else key,
        env.capability,
        agent_id,
        status,
        reason,
        error_type,
        env.attempt,
        env.sent_ms,
        started_ms,
        ended_ms,
        len(payload),
        memoryview(payload)[:PAYLOAD_HEAD_BYTES],  # no copy: msgpack takes a memoryview
    )


def pack(rows: Sequence[RowTuple]) -> tuple[bytes, ...]:
    """The index entries of ``rows``: chunks of at most :data:`ROWS_PER_ENTRY`."""
    return tuple(
        _ROWS.encode(rows[i : i + ROWS_PER_ENTRY]) for i in range(0, len(rows), ROWS_PER_ENTRY)
    )


def unpack(entry_id: Any, fields: Any) -> list[Row]:
    """The rows of one index entry (none for an entry that is not ours)."""
    if isinstance(fields, dict):
        data = fields.get(b"m") or fields.get("m") or b""
    else:
        data = b""
    if not isinstance(data, bytes):
        return []
    try:
        rows = _DECODE.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []
    ended = _entry_ms(entry_id)
    return [r if r.ended_ms else msgspec.structs.replace(r, ended_ms=ended) for r in rows]


def _entry_ms(entry_id: Any) -> int:
    return safe_int(safe_text(entry_id).partition("-")[0])


# -- reading --------------------------------------------------------------------------------
DISPLAY_STATUSES = (
    "pending",
    "running",
    "input_required",
    "retrying",
    "succeeded",
    "failed",
    "dead",
    "expired",
    "cancelled",
)
"""The statuses the listing filters on: a record's status, with ``cancelled`` for a
message dead-lettered because it was cancelled, and ``failed`` for any that was
dead-lettered or expired for another reason."""


@dataclass
class Message:
    """One message in a listing: its latest known attempt, and its status now."""

    msg_id: str
    capability: str
    agent_id: str
    status: str
    reason: str = ""
    error_type: str = ""
    error: str = ""
    attempt: int = 1
    sent_ms: int = 0
    started_ms: int = 0
    ended_ms: int = 0
    idempotency_key: str = ""
    payload_len: int = 0
    payload_head: bytes = field(default=b"", repr=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "msg_id": self.msg_id,
            "capability": self.capability,
            "agent_id": self.agent_id,
            "status": self.status,
            "reason": self.reason,
            "error_type": self.error_type,
            "error": self.error,
            "attempt": self.attempt,
            "sent_ms": self.sent_ms,
            "started_ms": self.started_ms,
            "ended_ms": self.ended_ms,
            "idempotency_key": self.idempotency_key,
        }


@dataclass
class Filters:
    """What a listing keeps: each given field must match (``status``: one of
    :data:`DISPLAY_STATUSES`; times in epoch ms, of the message's last activity)."""

    capability: str = ""
    agent_id: str = ""
    status: str = ""
    since_ms: int = 0
    until_ms: int = 0

    def keeps(self, m: Message) -> bool:
        if self.capability and m.capability != self.capability:
            return False
        if self.agent_id and m.agent_id != self.agent_id:
            return False
        if self.status and not status_matches(m, self.status):
            return False
        t = m.ended_ms or m.started_ms or m.sent_ms
        if self.since_ms and t and t < self.since_ms:
            return False
        return not (self.until_ms and t and t > self.until_ms)


def status_matches(m: Message, wanted: str) -> bool:
    if wanted == "failed":
        return m.status in (Status.DEAD, Status.EXPIRED)
    return m.status == wanted


@dataclass
class Page:
    """One page of a listing, newest first; ``next``: the cursor of the next (older) page
    (``''``: the index has no older entries)."""

    messages: list[Message]
    next: str = ""
    scanned: int = 0  # index entries read


_CURSOR = re.compile(r"^\d{1,20}-\d{1,20}$")
_DURATION = re.compile(r"^(\d{1,9})(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_since(text: str, *, now: int | None = None) -> int:
    """``15m``, ``2h``, ``1d`` (ago) or epoch ms as a time in epoch ms (``''``: 0, none).
    ValueError for anything else."""
    text = text.strip()
    if not text:
        return 0
    if text.isdigit() and len(text) <= 16:
        return int(text)
    m = _DURATION.match(text)
    if not m:
        raise ValueError(
            f"{text!r} is not a time: give an age such as 30s, 15m, 2h or 1d, or epoch ms"
        )
    return (now_ms() if now is None else now) - int(m.group(1)) * _UNIT_MS[m.group(2)]


async def list_messages(
    redis: AnyRedis,
    keys: Keys,
    filters: Filters | None = None,
    *,
    limit: int = 50,
    cursor: str = "",
    agent_ids: Iterable[str] = (),
) -> Page:
    """Recent messages, newest first, that match ``filters``: about ``limit`` (whole index
    entries are read: a page may hold up to 63 more). The first page (no ``cursor``)
    begins with the messages still in the inboxes of ``agent_ids`` (pending or running),
    then the index's; ``Page.next`` continues (a message appears once per page, with its
    latest attempt on that page; one retried across pages may appear again, with an
    earlier attempt). A page reads at most :data:`SCAN_ENTRIES` entries: with a filter
    that keeps few, it may hold fewer than ``limit`` and still have a ``next``."""
    f = filters or Filters()
    out: list[Message] = []
    seen: set[str] = set()
    if not cursor and (not f.status or f.status in (Status.PENDING, Status.RUNNING)):
        for m in await in_inboxes(redis, keys, list(agent_ids), limit):
            if m.msg_id not in seen and f.keeps(m):
                seen.add(m.msg_id)
                out.append(m)
    if cursor and not _CURSOR.match(cursor):
        raise ValueError(f"{cursor!r} is not a listing cursor (they look like 1717171717171-0)")
    hi = f"({cursor}" if cursor else "+"
    if f.until_ms and not cursor:
        hi = str(f.until_ms)
    lo = str(f.since_ms) if f.since_ms else "-"
    scanned, nxt = 0, ""
    count = max(1, min(100, limit))
    while len(out) < limit and scanned < SCAN_ENTRIES:
        entries = await redis.xrevrange(keys.recent, hi, lo, count=count)
        if not entries:
            nxt = ""
            break
        scanned += len(entries)
        per_entry: list[tuple[str, list[Message]]] = []
        for entry_id, fields in entries:
            msgs = []
            for r in reversed(unpack(entry_id, fields)):  # newest first within an entry
                if r.msg_id not in seen:
                    seen.add(r.msg_id)
                    msgs.append(_message_of(r))
            per_entry.append((safe_text(entry_id), msgs))
        await _refresh(redis, keys, [m for _, msgs in per_entry for m in msgs])
        # Whole entries only: the next page starts after the last entry read here.
        for entry_id, msgs in per_entry:
            out += [m for m in msgs if f.keeps(m)]
            hi, nxt = f"({entry_id}", entry_id
            if len(out) >= limit:
                break
        if len(out) < limit and len(entries) < count:
            nxt = ""
            break
    return Page(out, next=nxt, scanned=scanned)


async def attempts_of(
    redis: AnyRedis, keys: Keys, msg_id: str, *, scan: int = SCAN_ENTRIES * 5
) -> list[Row]:
    """The attempts of ``msg_id`` the index still holds, oldest first (it reads at most
    ``scan`` of the newest entries)."""
    rows: list[Row] = []
    hi, read = "+", 0
    while read < scan:
        entries = await redis.xrevrange(keys.recent, hi, "-", count=500)
        if not entries:
            break
        read += len(entries)
        for entry_id, fields in entries:
            rows += [r for r in unpack(entry_id, fields) if r.msg_id == msg_id]
        hi = f"({safe_text(entries[-1][0])}"
        if len(entries) < 500:
            break
    rows.sort(key=lambda r: (r.attempt, r.ended_ms))
    return rows


def _message_of(r: Row) -> Message:
    return Message(
        msg_id=r.msg_id,
        capability=r.capability,
        agent_id=r.agent_id,
        status=r.status,
        reason=r.reason,
        error_type=r.error_type,
        attempt=r.attempt,
        sent_ms=r.sent_ms,
        started_ms=r.started_ms,
        ended_ms=r.ended_ms,
        idempotency_key=r.idempotency_key,
        payload_len=r.payload_len,
        payload_head=r.payload_head,
    )


_FIELDS = ("error", "error_type", "agent_id", "attempt", "updated_ms", "status")


async def _refresh(redis: AnyRedis, keys: Keys, msgs: list[Message]) -> None:
    """Each message's status now, from its task record (one pipelined round trip); one
    whose record is gone (older than its TTL) keeps what the index says."""
    if not msgs:
        return
    pipe = redis.pipeline(transaction=False)
    for m in msgs:
        pipe.hmget(keys.idem(m.idempotency_key or m.msg_id), *_FIELDS)
    got = await pipe.execute(raise_on_error=False)
    for m, vals in zip(msgs, got, strict=True):
        if not isinstance(vals, list) or vals[-1] is None:
            continue
        error, etype, agent, attempt, updated, status = (safe_text(v or b"") for v in vals)
        if status == Status.DEAD and m.reason == DeadReason.CANCELLED:
            status = Status.CANCELLED
        if status:
            m.status = status
        m.error = error
        m.error_type = etype or m.error_type
        m.agent_id = agent or m.agent_id
        m.attempt = safe_int(attempt) or m.attempt
        if status not in (Status.PENDING, Status.RUNNING, Status.INPUT_REQUIRED):
            m.ended_ms = safe_int(updated) or m.ended_ms


async def in_inboxes(
    redis: AnyRedis, keys: Keys, agent_ids: list[str], limit: int
) -> list[Message]:
    """Messages still in the inboxes of ``agent_ids`` (at most ``limit`` per inbox): not
    settled yet, so pending or running (their records say which)."""
    if not agent_ids:
        return []
    pipe = redis.pipeline(transaction=False)
    streams = [(a, keys.inbox(a, p)) for a in agent_ids for p in PRIORITIES]
    for _, s in streams:
        pipe.xrevrange(s, "+", "-", count=limit)
    got = await pipe.execute(raise_on_error=False)
    msgs: list[Message] = []
    for (agent, _), entries in zip(streams, got, strict=True):
        if not isinstance(entries, list):
            continue
        for entry_id, fields in entries:
            data = fields.get(b"e") or fields.get("e") if isinstance(fields, dict) else None
            if not isinstance(data, bytes):
                continue
            try:
                env = decode_envelope(data)
            except BadEnvelope:
                continue
            payload = bytes(env.payload)
            msgs.append(
                Message(
                    msg_id=env.msg_id,
                    capability=env.capability,
                    agent_id=agent,
                    status=Status.PENDING,
                    attempt=env.attempt,
                    sent_ms=env.sent_ms or _entry_ms(entry_id),
                    idempotency_key=env.key,
                    payload_len=len(payload),
                    payload_head=payload[:PAYLOAD_HEAD_BYTES],
                )
            )
    await _refresh(redis, keys, msgs)
    msgs = [
        m
        for m in msgs
        if m.status in (Status.PENDING, Status.RUNNING, Status.INPUT_REQUIRED, Status.RETRYING)
    ]
    msgs.sort(key=lambda m: m.sent_ms, reverse=True)
    return msgs

"""Task status and dead letters: read and written around the idempotency record.

The idempotency record of a message (``Keys.idem(key)``, a hash) carries its task status,
so the hot path keeps one record per message. Every status is written by a Lua script:
``send.lua`` (or on a Cluster ``mark_pending.lua``) marks it pending, ``claim.lua`` (or,
for a message claimed at send, ``start.lua``) marks it running, ``settle.lua`` and
``complete.lua`` follow the runs, ``give_up.lua`` the sweeper's end. When the caller chose its own idempotency key, a small pointer
``Keys.task(msg_id) -> key`` lets the status be found by msg_id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from .connection import AnyRedis
from .envelope import (
    BadEnvelope,
    Envelope,
    Reply,
    caller_key,
    decode_envelope,
    decode_stored,
    now_ms,
)
from .keys import Keys
from .outcomes import STORED_STATUSES, Status
from .untrusted import safe_int, safe_text

STATUSES = STORED_STATUSES  # every status a record may hold
TASK_TTL_MS = 24 * 3600 * 1000


class TaskStatus(msgspec.Struct, kw_only=True):
    """What is known of one message: ``status`` is one of :data:`STATUSES` or ``unknown``."""

    msg_id: str
    status: str
    idempotency_key: str = ""
    capability: str = ""
    agent_id: str = ""
    attempt: int = 0
    runs: int = 0
    error: str = ""
    error_type: str = ""
    """The exception type the handler raised, when it failed (``KeyError``)."""
    traceback: str = ""
    """Its traceback as the worker stored it (bounded: ``RuntimeOptions.traceback_max_bytes``,
    and passed through ``RuntimeOptions.redact_traceback``)."""
    updated_ms: int = 0
    due_ms: int = 0
    """A scheduled send's due time (epoch ms; 0: it was sent at once)."""
    reply: Reply | None = None
    progress: float | None = None
    """The latest fraction done its handler reported (``ctx.progress``), 0..1; None when it
    reported none."""
    progress_note: str = ""
    """The note that came with it."""
    question: str = ""
    """While ``input_required``: the question its handler asked (``ctx.ask``), which
    ``client.answer(msg_id, value)`` answers."""
    asking: int = 0
    """The number of the ask waiting for its answer (a handler's first is 1; 0: none)."""
    asked: int = 0
    """How many questions its handler put (0: it asked none)."""
    ask_until_ms: int = 0
    """When the waiting ask gives up (epoch ms; 0: it waits until the message's deadline)."""

    @property
    def error_text(self) -> str:
        """The error as a person reads it: ``KeyError: 'txt'`` (type and message)."""
        return describe_error(self.error_type, self.error)


def describe_error(error_type: str, error: str) -> str:
    """``Type: message``, or whichever of the two there is (a ``KeyError``'s message alone
    reads ``'txt'``)."""
    if error_type and error:
        return f"{error_type}: {error}"
    return error or error_type


async def get_status(redis: AnyRedis, keys: Keys, msg_id: str) -> TaskStatus:
    """The status of ``msg_id`` (``unknown`` when no record exists, or it expired)."""
    key = await redis.get(keys.task(msg_id))
    idem_key = safe_text(key) if key else msg_id
    h = await redis.hgetall(keys.idem(idem_key))
    if not h:
        return TaskStatus(msg_id=msg_id, status=Status.UNKNOWN)
    d = {safe_text(k): v for k, v in h.items()}
    status = safe_text(d.get("status", b""))  # none stored, or not ours: unknown
    agent_id = safe_text(d.get("agent_id", b""))
    try:
        # Either form (docs/protocol.md, *Stored reply*): the short one is rebuilt from the
        # record's msg_id (absent: the key it is named by), status and agent_id, as the
        # worker replays it.
        reply = (
            decode_stored(
                d["reply"],
                msg_id=safe_text(d.get("msg_id", b"")) or idem_key,
                status=status,
                agent_id=agent_id,
            )
            if d.get("reply")
            else None
        )
    except BadEnvelope:
        reply = None  # a damaged stored reply: the status fields still say what happened
    # A record that succeeded on a later attempt may still hold an earlier one's failure.
    failed = status not in (
        Status.SUCCEEDED,
        Status.PENDING,
        Status.RUNNING,
        Status.INPUT_REQUIRED,
    )
    # A question stays in the record of a run cut off while it waited: shown only while
    # the task waits for it.
    waiting = status == Status.INPUT_REQUIRED
    return TaskStatus(
        msg_id=msg_id,
        status=status if status in STATUSES else Status.UNKNOWN,
        idempotency_key=caller_key(idem_key) if key else "",
        capability=safe_text(d.get("capability", b"")),
        agent_id=agent_id,
        attempt=safe_int(d.get("attempt")),
        runs=safe_int(d.get("runs")),
        error=safe_text(d.get("error", b"")),
        error_type=safe_text(d.get("error_type", b"")) if failed else "",
        traceback=safe_text(d.get("traceback", b"")) if failed else "",
        updated_ms=safe_int(d.get("updated_ms")),
        due_ms=safe_int(d.get("due_ms")),
        reply=reply,
        progress=_fraction(d.get("progress")),
        progress_note=safe_text(d.get("progress_note", b"")),
        question=safe_text(d.get("question", b"")) if waiting else "",
        asking=safe_int(d.get("asking")) if waiting else 0,
        asked=safe_int(d.get("asked")),
        ask_until_ms=safe_int(d.get("ask_until_ms")) if waiting else 0,
    )


def _fraction(value: bytes | None) -> float | None:
    """A stored progress fraction, or None (none stored, or not one ``progress.lua`` wrote)."""
    try:
        x = float(safe_text(value)) if value else None
    except ValueError:
        return None
    return x if x is not None and 0 <= x <= 1 else None


# -- dead letters --------------------------------------------------------------------


class DeadLetter(msgspec.Struct, kw_only=True):
    """One dead-lettered message: why, after how many attempts, and the envelope itself."""

    id: str
    capability: str
    reason: str
    error: str = ""
    error_type: str = ""
    attempts: int = 0
    agent_id: str = ""
    msg_id: str = ""
    ts: int = 0
    envelope: Envelope | None = None
    raw: bytes = b""  # the original bytes when they were not a valid envelope
    traceback: str = ""  # the handler's traceback, when it raised (bounded, redacted)

    @property
    def error_text(self) -> str:
        """The error as a person reads it: ``KeyError: 'txt'`` (type and message)."""
        return describe_error(self.error_type, self.error)


MALFORMED_CAP = "_malformed"
# Dead-letter streams are bounded (approximately: XADD MAXLEN ~), per capability; the
# oldest letters go first. A Runtime's ``dlq_maxlen`` option overrides it.
DLQ_MAXLEN = 100_000
# Bytes that are not an envelope are kept only up to this size (with their full size
# noted): a forged 10 MB entry must not become 10 MB in every dead-letter stream.
DLQ_RAW_MAX_BYTES = 64 * 1024


def dead_letter_op(
    keys: Keys,
    *,
    capability: str,
    reason: str,
    data: bytes,
    error: str = "",
    error_type: str = "",
    attempts: int = 0,
    agent_id: str = "",
    msg_id: str = "",
    maxlen: int = DLQ_MAXLEN,
) -> tuple[Any, ...]:
    """The XADD that files a dead letter under its capability (the stream is trimmed to
    about ``maxlen`` letters, oldest first)."""
    return (
        "XADD",
        keys.dlq(capability),
        "MAXLEN",
        "~",
        maxlen,
        "*",
        "reason",
        reason,
        "error",
        error[:2000],
        "error_type",
        error_type,
        "attempts",
        attempts,
        "agent_id",
        agent_id,
        "msg_id",
        msg_id,
        "capability",
        capability,
        "ts",
        now_ms(),
        "env",
        data,
    )


def raw_dead_letter_op(
    keys: Keys,
    *,
    reason: str,
    data: bytes,
    error: str,
    agent_id: str = "",
    maxlen: int = DLQ_MAXLEN,
    raw_max_bytes: int = DLQ_RAW_MAX_BYTES,
) -> tuple[Any, ...]:
    """File bytes that are not a usable envelope under ``_malformed``: at most
    ``raw_max_bytes`` of them are kept, and the error says how many there were."""
    if len(data) > raw_max_bytes:
        error = f"{error} [{len(data)} bytes; the first {raw_max_bytes} kept]"
        data = data[:raw_max_bytes]
    return dead_letter_op(
        keys,
        capability=MALFORMED_CAP,
        reason=reason,
        data=data,
        error=error,
        agent_id=agent_id,
        maxlen=maxlen,
    )


def parse_dead_letter(entry_id: Any, fields: Mapping[Any, Any]) -> DeadLetter:
    """A dead-letter stream entry as a :class:`DeadLetter`, whatever its fields hold
    (text is decoded with replacement characters, a bad number reads as 0)."""
    f = {safe_text(k): v for k, v in fields.items()}
    raw = f.get("env", b"")
    raw = raw if isinstance(raw, bytes) else str(raw).encode()
    env: Envelope | None
    try:
        env = decode_envelope(raw)
    except BadEnvelope:  # an undecodable entry is still listed, as raw bytes
        env = None
    return DeadLetter(
        id=safe_text(entry_id),
        capability=safe_text(f.get("capability", b"")),
        reason=safe_text(f.get("reason", b"")),
        error=safe_text(f.get("error", b"")),
        error_type=safe_text(f.get("error_type", b"")),
        attempts=safe_int(f.get("attempts")),
        agent_id=safe_text(f.get("agent_id", b"")),
        msg_id=safe_text(f.get("msg_id", b"")),
        ts=safe_int(f.get("ts")),
        envelope=env,
        raw=b"" if env else raw,
        traceback=safe_text(f.get("traceback", b"")),
    )

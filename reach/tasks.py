"""Task status and dead letters: read and written around the idempotency record.

The idempotency record of a message (``Keys.idem(key)``, a hash written by
``lua/claim.lua`` and ``lua/complete.lua``) carries its task status, so the hot path keeps
one record per message. When the caller chose its own idempotency key, a small pointer
``Keys.task(msg_id) -> key`` lets the status be found by msg_id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from .connection import AnyRedis, as_text
from .envelope import Envelope, Reply, decode_envelope, decode_reply, now_ms
from .keys import Keys

STATUSES = ("pending", "running", "succeeded", "failed", "retrying", "expired", "dead")
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
    updated_ms: int = 0
    reply: Reply | None = None


def pending_ops(keys: Keys, env: Envelope, *, ttl_ms: int = TASK_TTL_MS) -> list[tuple[Any, ...]]:
    """Commands that record a sent message as ``pending`` (kept if a record exists)."""
    rec = keys.idem(env.key)
    ops: list[tuple[Any, ...]] = [
        ("HSETNX", rec, "status", "pending"),
        ("HSET", rec, "capability", env.capability, "attempt", env.attempt,
         "sent_msg_id", env.msg_id),
        ("PEXPIRE", rec, ttl_ms),
    ]  # fmt: skip
    if env.idempotency_key:
        ops.append(("SET", keys.task(env.msg_id), env.idempotency_key, "PX", ttl_ms))
    return ops


async def get_status(redis: AnyRedis, keys: Keys, msg_id: str) -> TaskStatus:
    """The status of ``msg_id`` (``unknown`` when no record exists, or it expired)."""
    key = await redis.get(keys.task(msg_id))
    idem_key = as_text(key) if key else msg_id
    h = await redis.hgetall(keys.idem(idem_key))
    if not h:
        return TaskStatus(msg_id=msg_id, status="unknown")
    d = {as_text(k): v for k, v in h.items()}
    reply = decode_reply(d["reply"]) if d.get("reply") else None
    return TaskStatus(
        msg_id=msg_id,
        status=as_text(d.get("status", b"unknown")),
        idempotency_key=idem_key if key else "",
        capability=as_text(d.get("capability", b"")),
        agent_id=as_text(d.get("agent_id", b"")),
        attempt=int(d.get("attempt", 0)),
        runs=int(d.get("runs", 0)),
        error=as_text(d.get("error", b"")),
        updated_ms=int(d.get("updated_ms", 0)),
        reply=reply,
    )


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


MALFORMED_CAP = "_malformed"


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
) -> tuple[Any, ...]:
    """The XADD that files a dead letter under its capability (never trimmed)."""
    return (
        "XADD", keys.dlq(capability), "*",
        "reason", reason, "error", error[:2000], "error_type", error_type,
        "attempts", attempts, "agent_id", agent_id, "msg_id", msg_id,
        "capability", capability, "ts", now_ms(), "env", data,
    )  # fmt: skip


def parse_dead_letter(entry_id: Any, fields: Mapping[Any, Any]) -> DeadLetter:
    f = {as_text(k): v for k, v in fields.items()}
    raw = f.get("env", b"")
    raw = raw if isinstance(raw, bytes) else str(raw).encode()
    env: Envelope | None
    try:
        env = decode_envelope(raw)
    except Exception:  # noqa: BLE001 - an undecodable entry is still listed, as raw bytes
        env = None
    return DeadLetter(
        id=as_text(entry_id),
        capability=as_text(f.get("capability", b"")),
        reason=as_text(f.get("reason", b"")),
        error=as_text(f.get("error", b"")),
        error_type=as_text(f.get("error_type", b"")),
        attempts=int(f.get("attempts", 0)),
        agent_id=as_text(f.get("agent_id", b"")),
        msg_id=as_text(f.get("msg_id", b"")),
        ts=int(f.get("ts", 0)),
        envelope=env,
        raw=b"" if env else raw,
    )


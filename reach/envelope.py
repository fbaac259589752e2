"""The message envelope and the reply, msgpack on the wire (msgspec).

The payload travels as :class:`msgspec.Raw` msgpack bytes: routing, the sweeper and the
dead-letter tools move envelopes without ever decoding what is inside; only the handler
(:func:`decode_payload`) does.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec

from .errors import ConfigError

VERSION = 1


class Envelope(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=False):
    """One message. ``deadline_ms`` is absolute (epoch ms, 0 = none)."""

    v: int = VERSION
    msg_id: str
    capability: str
    payload: msgspec.Raw = msgspec.Raw(b"\xc0")  # msgpack nil
    session_id: str = ""
    trace_id: str = ""
    source: str = ""
    target: str = ""
    policy: str = ""
    priority: str = "normal"
    deadline_ms: int = 0
    attempt: int = 1
    max_attempts: int = 3
    idempotency_key: str = ""
    reply_to: str = ""  # the caller's client id ('' = nobody waits for a reply)
    headers: dict[str, str] = {}
    sent_ms: int = 0

    @property
    def key(self) -> str:
        """The idempotency key: the caller's, or the msg_id."""
        return self.idempotency_key or self.msg_id


class _Version(msgspec.Struct):
    v: int | None = None  # None: no version field at all (not an envelope: malformed)


class Reply(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The outcome of one message, as published to the caller and stored for replays.

    ``status`` is the final task status: succeeded, failed, expired or dead.
    """

    msg_id: str
    status: str
    result: msgspec.Raw = msgspec.Raw(b"\xc0")
    error_type: str = ""
    error: str = ""
    reason: str = ""
    agent_id: str = ""
    attempt: int = 1


_enc = msgspec.msgpack.Encoder()
_env_dec = msgspec.msgpack.Decoder(Envelope)
_ver_dec = msgspec.msgpack.Decoder(_Version)
_reply_dec = msgspec.msgpack.Decoder(Reply)
_any_dec = msgspec.msgpack.Decoder()


class BadEnvelope(Exception):
    """Bytes in an inbox that cannot be used; ``reason`` is ``malformed`` or ``version``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def encode(obj: Any) -> bytes:
    """Encode an envelope, a reply, or any msgpack-able value."""
    return _enc.encode(obj)


def decode_envelope(data: bytes) -> Envelope:
    """Decode inbox bytes; raises :class:`BadEnvelope` (``malformed`` / ``version``)."""
    try:
        env = _env_dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        try:
            v = _ver_dec.decode(data).v
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise BadEnvelope("malformed", f"not a reach envelope ({e})") from e
        if v is not None and v != VERSION:
            raise BadEnvelope("version", f"unknown envelope version {v}") from e
        raise BadEnvelope("malformed", str(e)) from e
    if env.v != VERSION:
        raise BadEnvelope("version", f"unknown envelope version {env.v}")
    return env


def decode_reply(data: bytes) -> Reply:
    return _reply_dec.decode(data)


def encode_payload(payload: Any) -> msgspec.Raw:
    """Encode a payload or result to opaque msgpack bytes."""
    try:
        return msgspec.Raw(_enc.encode(payload))
    except (TypeError, msgspec.EncodeError) as e:
        raise ConfigError(
            f"Payload of type {type(payload).__name__} cannot be sent: use JSON-like values "
            f"(dict, list, str, int, float, bool, None, bytes) or msgspec Structs ({e})."
        ) from e


def decode_payload(raw: msgspec.Raw | bytes, type: Any = Any) -> Any:
    """Decode opaque payload bytes, optionally into ``type`` (validation)."""
    if type is Any:
        return _any_dec.decode(raw)
    return msgspec.msgpack.decode(raw, type=type)


def new_id() -> str:
    """A time-ordered unique id (48-bit ms time + 80 random bits, hex): sorts by creation."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000

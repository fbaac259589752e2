"""The message envelope and the reply, msgpack on the wire (msgspec).

The payload travels as :class:`msgspec.Raw` msgpack bytes: routing, the sweeper and the
dead-letter tools move envelopes without ever decoding what is inside; only the handler
(:func:`decode_payload`) does.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from .clock import CLOCK
from .errors import ConfigError

VERSION = 1

# Bounds checked when an envelope is decoded. Whatever sits in an inbox may have been
# written by anyone holding the namespace's keys, so every number that later feeds a
# computation (backoff, leases, deadlines) and every string that ends up in a key name or
# a log line has a range; an envelope outside them is dead-lettered as ``malformed``.
MAX_ATTEMPTS = 1_000_000
MAX_ID_CHARS = 1024  # msg_id, idempotency_key, session_id, trace_id, source, target, reply_to
MAX_CAPABILITY_CHARS = 256
MAX_HEADERS = 64
MAX_HEADER_CHARS = 4096
MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
CAPABILITY_PATTERN = r"^[a-z0-9_]+(\.[a-z0-9_]+)*$"
MAX_PATH = 32  # the call path keeps this many hops, the nearest (docs/concepts.md, Call graphs)
MAX_HOPS = 1_000_000
MIN_COST = 0.01  # a message's cost, in multiples of its capability's typical message
MAX_COST = 1000.0

Id = Annotated[str, Meta(max_length=MAX_ID_CHARS)]
EpochMs = Annotated[int, Meta(ge=0, le=MAX_EPOCH_MS)]
Attempts = Annotated[int, Meta(ge=1, le=MAX_ATTEMPTS)]
HeaderText = Annotated[str, Meta(max_length=MAX_HEADER_CHARS)]
KeyId = Annotated[str, Meta(max_length=64)]
Signature = Annotated[bytes, Meta(max_length=128)]
# Patterns rather than Literal types, so code building envelopes passes plain strings.
Priority = Annotated[str, Meta(pattern="^(high|normal|low)$")]
# '' = the capability's advertised policy, else the client's default.
Policy = Annotated[
    str, Meta(pattern="^(|weighted_rr|least_conn|consistent_hash|direct|broadcast)$")
]


class Hop(msgspec.Struct, array_like=True, frozen=True):
    """One call a message descends from: the ``capability`` a handler ran, the
    ``agent_id`` it ran on, and whether it ``waits`` for the result of its call
    (``request``, ``stream``) or sent it and went on (``send``). On the wire
    ``[capability, agent_id, waits]``."""

    capability: Annotated[str, Meta(max_length=MAX_CAPABILITY_CHARS, pattern=CAPABILITY_PATTERN)]
    agent_id: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
    waits: bool


class Envelope(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=False):
    """One message. ``deadline_ms`` is absolute (epoch ms, 0 = none)."""

    v: int = VERSION
    msg_id: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
    capability: Annotated[str, Meta(max_length=MAX_CAPABILITY_CHARS, pattern=CAPABILITY_PATTERN)]
    payload: msgspec.Raw = msgspec.Raw(b"\xc0")  # msgpack nil
    session_id: Id = ""
    trace_id: Id = ""
    source: Id = ""
    target: Id = ""
    policy: Policy = ""
    priority: Priority = "normal"
    deadline_ms: EpochMs = 0
    attempt: Attempts = 1
    max_attempts: Attempts = 3
    idempotency_key: Id = ""
    reply_to: Id = ""  # the caller's client id ('' = nobody waits for a reply)
    headers: Annotated[dict[HeaderText, HeaderText], Meta(max_length=MAX_HEADERS)] = {}
    sent_ms: EpochMs = 0
    # Routing hints the runtime writes on the copies it schedules itself. They are fields,
    # not headers, so a user's headers never collide with them and their types are checked
    # when the envelope is decoded.
    avoid: Id = ""
    """The agent this message failed on (set on a retry): routing prefers another one."""
    busy_waits: Annotated[int, Meta(ge=0, le=MAX_ATTEMPTS)] = 0
    """How often this copy waited for another live worker holding its key (its backoff)."""
    preempts: Annotated[int, Meta(ge=0, le=MAX_ATTEMPTS)] = 0
    """How often this message was cut for high-priority work and requeued (aging: at the
    agent's ``max_preempts`` it runs to its end). A field, not a header: headers are
    covered by the sender's signature, which the runtime cannot renew."""
    holds: Annotated[int, Meta(ge=0, le=MAX_ATTEMPTS)] = 0
    """How often a rate limit held this copy back. Each held copy's bytes differ from the
    last one's, so the sweeper, removing a copy it moved from the delayed set (by its
    bytes, after the move), never removes the next hold of the same message."""
    # The call graph (reach.callpath): set by ``ctx.client`` on a handler's calls, absent
    # on a top-level message, so a message that is no child call carries nothing more.
    hops: Annotated[int, Meta(ge=0, le=MAX_HOPS)] = 0
    """How many calls this message descends from (0: sent by a caller, not a handler)."""
    path: Annotated[list[Hop], Meta(max_length=MAX_PATH)] = []
    """The calls it descends from, oldest first, the last :data:`MAX_PATH` of them."""
    cost: Annotated[float, Meta(ge=MIN_COST, le=MAX_COST)] = 1.0
    """How much work this message is, in multiples of a typical message of its capability
    (1: typical; 0.1 a short answer, 10 a long report): ``least_conn`` weighs its own run
    time by it, and the agent that runs it divides its run time by it before averaging
    (docs/routing.md, *Cost-aware routing*). A routing hint the caller sets, not signed."""
    # Signing (reach.signing): absent unless the sender has a secret, so an unsigned
    # envelope is byte for byte what it was before signing existed.
    kid: KeyId = ""
    """The key id of the signature: which secret of a rollover signed it."""
    sig: Signature = b""
    """The signature over the fields the sender decides (reach.signing says which)."""

    @property
    def key(self) -> str:
        """The name of this message's idempotency record: the msg_id, or, when the caller
        chose an ``idempotency_key``, that key scoped to the capability and to the verified
        identity that signed it (:func:`scoped_key`): one caller's key never names another
        caller's record, nor the record of another capability."""
        k = self.idempotency_key
        if not k:
            return self.msg_id
        # Only an Ed25519 signature (64 bytes) names its signer: a shared secret's (32
        # bytes) says "a member of the team", and the team is the namespace.
        return scoped_key(
            self.capability, k, self.kid if len(self.sig) == ED25519_SIG_BYTES else ""
        )


ED25519_SIG_BYTES = 64


def checked_cost(cost: float | None) -> float:
    """A caller's ``cost=`` as the envelope holds it (None: 1, a typical message);
    :class:`ConfigError` outside :data:`MIN_COST`..:data:`MAX_COST`."""
    if cost is None:
        return 1.0
    if isinstance(cost, bool) or not isinstance(cost, (int, float)):
        raise ConfigError(f"cost must be a number (1 = a typical message), got {cost!r}.")
    if not MIN_COST <= cost <= MAX_COST:  # also refuses nan
        raise ConfigError(
            f"cost must be within {MIN_COST:g}..{MAX_COST:g} (a multiple of a typical "
            f"message of the capability: 0.1 a short answer, 10 a long report), got {cost!r}."
        )
    return float(cost)


_SCOPE_SEP = "|"  # in neither a capability's nor an identity name's alphabet


def scoped_key(capability: str, idempotency_key: str, identity: str = "") -> str:
    """The idempotency record name of a caller-chosen ``idempotency_key`` sent to
    ``capability`` by ``identity`` (the Ed25519 signer's name; ``''`` unsigned or signed
    with the namespace's shared secret): ``"<capability>|<identity>|<key>"``.

    Idempotency is scoped to (namespace, capability, identity): a replay is served only
    to the same caller of the same capability (docs/concepts.md, *Idempotency scope*)."""
    return f"{capability}{_SCOPE_SEP}{identity}{_SCOPE_SEP}{idempotency_key}"


def caller_key(record_key: str) -> str:
    """The caller's own idempotency key inside a record name made by :func:`scoped_key`
    (a name that is not one, e.g. a msg_id, is returned as it is)."""
    parts = record_key.split(_SCOPE_SEP, 2)
    return parts[2] if len(parts) == 3 else record_key


class _Version(msgspec.Struct):
    v: int | None = None  # None: no version field at all (not an envelope: malformed)


CHUNK = "chunk"
"""The ``status`` of a chunk entry: streamed output of a handler, not its outcome."""
MAX_CHUNK_SEQ = 2**53


class Reply(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The outcome of one message, as published to the caller and stored for replays.

    ``status`` is the final task status: succeeded, failed, expired or dead; or
    :data:`CHUNK` for a *chunk entry* (docs/protocol.md, *Chunk*): ``result`` is then a
    msgpack array of chunks, the first of them number ``seq`` of the run that sent them.
    """

    msg_id: Annotated[str, Meta(max_length=MAX_ID_CHARS)]
    status: Annotated[str, Meta(max_length=32)]
    result: msgspec.Raw = msgspec.Raw(b"\xc0")
    error_type: Annotated[str, Meta(max_length=MAX_HEADER_CHARS)] = ""
    error: str = ""
    reason: Annotated[str, Meta(max_length=MAX_HEADER_CHARS)] = ""
    agent_id: Id = ""
    attempt: Attempts = 1
    kid: KeyId = ""  # signed by the answering agent when it has a secret (reach.signing)
    sig: Signature = b""
    seq: Annotated[int, Meta(ge=0, le=MAX_CHUNK_SEQ)] = 0
    """A chunk entry's first chunk number (0 and absent in a final reply)."""


class StoredReply(msgspec.Struct, array_like=True):
    """A final reply as the idempotency record stores it (field ``reply``, protocol
    version 2): the array ``[result, attempt, kid, sig, error_type, error, reason]``,
    trailing defaults left out (a succeeded unsigned first attempt is ``[result]``).
    ``msg_id``, ``status`` and ``agent_id`` are the record's own fields, which a done
    record never changes: :func:`decode_stored` rebuilds the :class:`Reply` from both,
    the same fields that were signed. Kept short so a small result leaves the record in
    Redis's compact hash encoding (docs/operations.md, *Memory per completed record*)."""

    result: msgspec.Raw
    attempt: Attempts = 1
    kid: KeyId = ""
    sig: Signature = b""
    error_type: Annotated[str, Meta(max_length=MAX_HEADER_CHARS)] = ""
    error: str = ""
    reason: Annotated[str, Meta(max_length=MAX_HEADER_CHARS)] = ""


_enc = msgspec.msgpack.Encoder()
_stored_dec = msgspec.msgpack.Decoder(StoredReply)
_env_dec = msgspec.msgpack.Decoder(Envelope)
_ver_dec = msgspec.msgpack.Decoder(_Version)
_reply_dec = msgspec.msgpack.Decoder(Reply)
_any_dec = msgspec.msgpack.Decoder()


class BadEnvelope(Exception):
    """Bytes that cannot be used as an envelope (or a reply); ``reason`` is ``malformed``
    or ``version``, ``detail`` says what is wrong, in words for an operator."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def encode(obj: Any) -> bytes:
    """Encode an envelope, a reply, or any msgpack-able value."""
    return _enc.encode(obj)


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: Any, what: str) -> Any:
    """Decode with one outcome for every kind of bad input: :class:`BadEnvelope`.

    msgspec skips over the opaque payload recursively, so a value nested thousands of
    levels deep raises RecursionError: that is bad input like any other, not a crash.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadEnvelope("malformed", f"{what} is {type(data).__name__}, not bytes")
    try:
        return decoder.decode(data)
    except RecursionError:
        raise BadEnvelope("malformed", f"{what} is nested too deeply to decode") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BadEnvelope("malformed", f"not a valid reach {what} ({e})") from e


def decode_envelope(data: bytes) -> Envelope:
    """Decode inbox bytes into a validated envelope (every field in range).

    Raises :class:`BadEnvelope` (``malformed`` / ``version``) for anything else; never
    another exception, whatever the bytes.
    """
    try:
        env: Envelope = _decode(_env_dec, data, "envelope")
    except BadEnvelope as e:
        try:
            v = _decode(_ver_dec, data, "envelope").v
        except BadEnvelope:
            raise e from None
        if v is not None and v != VERSION:
            raise BadEnvelope("version", f"unknown envelope version {v!r}") from None
        raise
    if env.v != VERSION:
        raise BadEnvelope("version", f"unknown envelope version {env.v}")
    return env


def decode_reply(data: bytes) -> Reply:
    """Decode a reply (from a reply stream or an idempotency record); raises
    :class:`BadEnvelope` for bytes that are not a valid reply, never anything else."""
    reply: Reply = _decode(_reply_dec, data, "reply")
    return reply


def encode_stored(reply: Reply) -> bytes:
    """The record's ``reply`` field for ``reply`` (a final one: no ``seq``): the
    :class:`StoredReply` form, its trailing defaults left out (msgspec's ``omit_defaults``
    does not shorten an array)."""
    values = [
        reply.result,
        reply.attempt,
        reply.kid,
        reply.sig,
        reply.error_type,
        reply.error,
        reply.reason,
    ]
    n = len(values)
    while n > 1 and values[n - 1] == _STORED_DEFAULTS[n - 1]:
        n -= 1
    return _enc.encode(values[:n])


# StoredReply's defaults, by position (result has none).
_STORED_DEFAULTS: tuple[Any, ...] = (None, 1, "", b"", "", "", "")


# The first byte of a msgpack map (fixmap, map 16, map 32): a stored reply of protocol
# version 1, the whole reply; an array is version 2's StoredReply.
_MAP_FIRST = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])


def decode_stored(data: bytes, *, msg_id: str, status: str, agent_id: str) -> Reply:
    """The reply an idempotency record stores (field ``reply``), given the record's
    ``msg_id``, ``status`` and ``agent_id``: version 2's :class:`StoredReply` rebuilt, or
    version 1's whole reply as it is (records written before an upgrade live on for
    their TTL). Raises :class:`BadEnvelope` for bytes that are neither, never anything
    else."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or not data:
        raise BadEnvelope("malformed", "a stored reply is empty or not bytes")
    if data[0] in _MAP_FIRST:
        return decode_reply(data)
    s: StoredReply = _decode(_stored_dec, data, "stored reply")
    return Reply(
        msg_id=msg_id,
        status=status,
        result=s.result,
        agent_id=agent_id,
        error_type=s.error_type,
        error=s.error,
        reason=s.reason,
        attempt=s.attempt,
        kid=s.kid,
        sig=s.sig,
    )


def encode_payload(payload: Any) -> msgspec.Raw:
    """Encode a payload or result to opaque msgpack bytes."""
    try:
        return msgspec.Raw(_enc.encode(payload))
    except RecursionError as e:
        raise ConfigError("Payload is nested too deeply to send: flatten it.") from e
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as e:
        raise ConfigError(
            f"Payload of type {type(payload).__name__} cannot be sent: use JSON-like values "
            f"(dict, list, str, int, float, bool, None, bytes) or msgspec Structs ({e})."
        ) from e


def decode_payload(raw: msgspec.Raw | bytes, type: Any = Any) -> Any:
    """Decode opaque payload bytes, optionally into ``type`` (validation).

    Raises :class:`msgspec.DecodeError` / :class:`msgspec.ValidationError` for bytes that
    do not fit, including a value nested too deeply to decode.
    """
    try:
        if type is Any:
            return _any_dec.decode(raw)
        return msgspec.msgpack.decode(raw, type=type)
    except RecursionError:
        raise msgspec.DecodeError("payload is nested too deeply to decode") from None


class _RandomHex:
    """Random bits from ``os.urandom`` read 4 KiB at a time (one system call per ~400 ids
    instead of one each: it was a tenth of a sending caller's time), kept as hex text. A
    forked child starts with an empty buffer, so parent and child never hand out the same
    bits."""

    CHUNK = 4096

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0
        self._lock = threading.Lock()  # ids are made from any thread (sync handlers)
        # An id's 80 bits, cut ahead: a deque's popleft is atomic (documented thread-safe),
        # so one id costs no lock.
        self._ids: collections.deque[str] = collections.deque()

    def reset(self) -> None:
        self._hex, self._at = "", 0
        self._ids = collections.deque()

    def take(self, n: int) -> str:
        """``n`` random bytes as ``2 * n`` hex digits."""
        n *= 2
        with self._lock:
            at = self._at
            if at + n > len(self._hex):
                self._hex, at = os.urandom(max(self.CHUNK, n // 2)).hex(), 0
            self._at = at + n
            return self._hex[at : at + n]

    def take_id(self) -> str:
        """80 random bits (20 hex digits)."""
        try:
            return self._ids.popleft()
        except IndexError:
            bits = os.urandom(self.CHUNK).hex()
            # Threads refilling at once each cut bits of their own read: no id is handed
            # out twice.
            self._ids.extend([bits[i : i + 20] for i in range(20, len(bits) - 19, 20)])
            return bits[:20]


_random_hex = _RandomHex()
os.register_at_fork(after_in_child=_random_hex.reset)
_stamp: tuple[int, str] = (-1, "")  # the last ms an id was made in, and its hex text


def new_id() -> str:
    """A time-ordered unique id (48-bit ms time + 80 random bits, hex): sorts by creation."""
    global _stamp
    ms = time.time_ns() // 1_000_000
    last = _stamp  # one read: another thread may replace it (with its own pair) meanwhile
    if last[0] != ms:
        _stamp = last = (ms, f"{ms:012x}")
    return last[1] + _random_hex.take_id()


def new_ids(n: int) -> list[str]:
    """``n`` ids as :func:`new_id` makes them, for a batch: the clock read once and the
    random bits taken at once (the ids of one batch share their time part)."""
    stamp = f"{time.time_ns() // 1_000_000:012x}"
    bits = _random_hex.take(10 * n)
    return [stamp + bits[i : i + 20] for i in range(0, 20 * n, 20)]


now_ms = CLOCK.now_ms
"""Epoch ms on Redis's clock: this host's corrected by its measured offset
(:mod:`reach.clock`); deadlines are set and judged on it. The clock's own method, not a
function calling it: it is read a few times per message on both sides."""

"""docs/protocol.md's recipes, followed by hand (a msgpack writer of our own, not the
runtime's), give what the runtime accepts: an envelope signed as *Signatures* says
verifies, its payload copied as it is on the wire whatever encoding the sender chose; the
key id is derived as documented."""

from __future__ import annotations

import hashlib
import hmac
import struct

from reach.envelope import decode_envelope
from reach.signing import Keyring, key_id

SECRET = "a shared secret of the team, text"


def s(text: str) -> bytes:
    """A msgpack str in its shortest form."""
    b = text.encode()
    n = len(b)
    if n < 32:
        return bytes([0xA0 | n]) + b
    if n < 256:
        return b"\xd9" + bytes([n]) + b
    return b"\xda" + struct.pack(">H", n) + b


def u(n: int) -> bytes:
    """A non-negative msgpack int in its shortest form."""
    if n < 128:
        return bytes([n])
    if n < 256:
        return b"\xcc" + bytes([n])
    if n < 65536:
        return b"\xcd" + struct.pack(">H", n)
    if n < 2**32:
        return b"\xce" + struct.pack(">I", n)
    return b"\xcf" + struct.pack(">Q", n)


def m(pairs: list[tuple[bytes, bytes]]) -> bytes:
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


def test_an_envelope_signed_by_the_documented_recipe_verifies() -> None:
    ns = "prod"
    # the payload {"text": "hi"} written with a str16 for "hi": not the shortest form
    payload = b"\x81" + s("text") + b"\xda\x00\x02hi"
    headers = m([(s("b"), s("2")), (s("a"), s("1"))])  # wire order b, a: kept
    fields = {
        "msg_id": s("0190aa"), "capability": s("text.summarize"), "payload": payload,
        "source": s("c-1"), "deadline_ms": u(1796039878211), "reply_to": s("c-1"),
        "headers": headers, "sent_ms": u(1796039848211),
    }  # fmt: skip
    # the signed array: label (bin8), namespace, then the fields in the documented order,
    # defaults for those absent from the wire
    signed = b"".join(
        [
            b"\xdc\x00\x10",  # array16 of 16 elements
            b"\xc4" + bytes([len(b"reach/envelope/1")]) + b"reach/envelope/1",
            s(ns),
            u(1),  # v
            fields["msg_id"],
            fields["capability"],
            payload,  # copied as it is on the wire
            s(""),  # session_id
            s(""),  # trace_id
            fields["source"],
            s("normal"),  # priority
            fields["deadline_ms"],
            u(3),  # max_attempts
            s(""),  # idempotency_key
            fields["reply_to"],
            headers,
            fields["sent_ms"],
        ]
    )
    key = SECRET.encode("utf-8")  # the secret's text, as UTF-8 bytes
    kid = hmac.new(key, b"reach/key-id/1", hashlib.sha256).digest()[:8].hex()
    assert kid == key_id(key) and len(kid) == 16
    sig = hmac.new(key, signed, hashlib.sha256).digest()
    wire = m(
        [(s(k), v) for k, v in fields.items()] + [(s("kid"), s(kid)), (s("sig"), b"\xc4\x20" + sig)]
    )
    env = decode_envelope(wire)
    assert bytes(env.payload) == payload and list(env.headers) == ["b", "a"]
    ring = Keyring(ns, [key])
    assert ring.check_envelope(env) is None
    assert Keyring("other-ns", [key]).check_envelope(env) == "bad signature"
    # any other encoding of the signed bytes (here: the payload re-encoded) does not verify
    forged = hmac.new(key, signed.replace(payload, b"\x81" + s("text") + s("hi")), hashlib.sha256)
    env.sig = forged.digest()
    assert ring.check_envelope(env) == "bad signature"


def test_a_reply_signed_by_the_documented_recipe_verifies() -> None:
    from reach.envelope import decode_reply

    ns, key = "prod", SECRET.encode("utf-8")
    result = b"\x92\x01\xcd\x00\x02"  # [1, 2] with a uint16 for 2: not the shortest form
    signed = b"".join(
        [
            b"\x9a",  # fixarray of 10 elements
            b"\xc4" + bytes([len(b"reach/reply/1")]) + b"reach/reply/1",
            s(ns), s("0190aa"), s("succeeded"), result,
            s(""), s(""), s(""),  # error_type, error, reason
            s("agent/1"), u(2),  # agent_id, attempt
        ]
    )  # fmt: skip
    sig = hmac.new(key, signed, hashlib.sha256).digest()
    wire = m(
        [
            (s("msg_id"), s("0190aa")), (s("status"), s("succeeded")), (s("result"), result),
            (s("agent_id"), s("agent/1")), (s("attempt"), u(2)),
            (s("kid"), s(key_id(key))), (s("sig"), b"\xc4\x20" + sig),
        ]
    )  # fmt: skip
    assert Keyring(ns, [key]).check_reply(decode_reply(wire)) is None

"""The stored reply of an idempotency record (docs/protocol.md, *Stored reply*): version 2's
short form rebuilds the reply the caller got, signature included; version 1's whole reply
still decodes; anything else is a BadEnvelope."""

from __future__ import annotations

import msgspec
import pytest

from reach.envelope import (
    BadEnvelope,
    Reply,
    decode_stored,
    encode,
    encode_payload,
    encode_stored,
)
from reach.signing import Keyring

NS = "ns"
RESULT = "r" * 50


def _reply(**kw: object) -> Reply:
    base: dict[str, object] = {
        "msg_id": "0123456789abcdef0123456789abcdef",
        "status": "succeeded",
        "result": encode_payload(RESULT),
        "agent_id": "mem-1",
    }
    return Reply(**{**base, **kw})  # type: ignore[arg-type]


def _back(stored: bytes, reply: Reply) -> Reply:
    return decode_stored(stored, msg_id=reply.msg_id, status=reply.status, agent_id=reply.agent_id)


def test_a_succeeded_first_attempt_stores_its_result_alone() -> None:
    reply = _reply()
    stored = encode_stored(reply)
    assert msgspec.msgpack.decode(stored) == [RESULT]
    assert len(stored) == 53  # within hash-max-listpack-value (64 bytes)
    assert len(encode(reply)) > 64  # the whole reply was not
    assert _back(stored, reply) == reply
    assert encode(_back(stored, reply)) == encode(reply)  # byte for byte


def test_every_field_the_record_does_not_hold_is_kept() -> None:
    reply = _reply(
        status="dead", error_type="ValueError", error="boom", reason="max_attempts", attempt=3
    )
    assert _back(encode_stored(reply), reply) == reply


def test_a_signed_reply_rebuilt_still_verifies() -> None:
    ring = Keyring(NS, [b"team-secret-0123456789abcdef"])
    reply = ring.sign_reply(_reply(attempt=2))
    back = _back(encode_stored(reply), reply)
    assert back == reply and ring.check_reply(back) is None
    # Rebuilt from other record fields, it no longer does.
    other = decode_stored(encode_stored(reply), msg_id="x", status="succeeded", agent_id="mem-1")
    assert ring.check_reply(other) == "bad signature"


def test_a_version_1_record_stores_the_whole_reply_and_it_still_reads() -> None:
    reply = _reply()
    # The record's fields do not matter then: the reply says it all.
    assert decode_stored(encode(reply), msg_id="", status="", agent_id="") == reply


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01\x02\x03", b"\xa3abc", b"\x90"])
def test_bytes_of_neither_form_are_a_bad_envelope(data: bytes) -> None:
    with pytest.raises(BadEnvelope):
        decode_stored(data, msg_id="m", status="succeeded", agent_id="a")

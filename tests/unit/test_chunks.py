"""The caller's reassembly of streamed chunks (reach._chunks) and the chunk entry's
signature (reach.signing): plain values, no Redis."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from reach._chunks import ChunkSink
from reach.envelope import CHUNK, BadEnvelope, Reply, decode_reply, encode
from reach.signing import Keyring, reply_data

SECRET = "team-secret-0123456789abcdef"


def entry(seq: int, items: Any, *, attempt: int = 1) -> Reply:
    return Reply(
        msg_id="m", status=CHUNK, result=msgspec.Raw(encode(items)), seq=seq, attempt=attempt
    )


def test_chunks_are_kept_in_order_each_number_once() -> None:
    sink = ChunkSink()
    sink.add(entry(0, ["a", "b"]))
    sink.add(entry(2, ["c"]))
    # A redelivered run numbers from 0 again: what was seen is dropped, the rest kept.
    sink.add(entry(0, ["a", "b"], attempt=2))
    sink.add(entry(2, ["c", "d", "e"], attempt=2))
    sink.add(entry(1, ["b"]))  # a duplicate written twice
    assert list(sink.chunks) == ["a", "b", "c", "d", "e"]
    assert sink.next_seq == 5 and sink.duplicates == 4 and sink.dropped == 0


def test_an_entry_past_the_next_number_is_dropped_not_skipped_to() -> None:
    sink = ChunkSink()
    sink.add(entry(0, ["a"]))
    sink.add(entry(1000, ["far"]))
    sink.add(entry(1, ["b"]))
    assert list(sink.chunks) == ["a", "b"] and sink.dropped == 1


@pytest.mark.parametrize("result", [encode("text"), encode({"a": 1}), b"\xc1", b""])
def test_an_entry_that_is_no_array_of_chunks_raises_bad_envelope(result: bytes) -> None:
    sink = ChunkSink()
    with pytest.raises(BadEnvelope):
        sink.add(Reply(msg_id="m", status=CHUNK, result=msgspec.Raw(result)))
    assert not sink.chunks and sink.next_seq == 0


def test_seq_is_on_the_wire_only_for_chunks_and_bounded() -> None:
    assert b"seq" not in encode(Reply(msg_id="m", status="succeeded"))
    assert decode_reply(encode(entry(7, []))).seq == 7
    with pytest.raises(BadEnvelope):
        decode_reply(encode({"msg_id": "m", "status": CHUNK, "seq": -1}))


def test_a_chunk_signature_covers_seq_and_differs_from_a_reply_s() -> None:
    ring = Keyring.from_option("ns", SECRET)
    assert ring is not None
    signed = ring.sign_reply(entry(3, ["x"]))
    assert ring.check_reply(signed) is None
    assert ring.check_reply(msgspec.structs.replace(signed, seq=4)) is not None
    assert ring.check_reply(msgspec.structs.replace(signed, status="succeeded")) is not None
    final = Reply(msg_id="m", status="succeeded", result=msgspec.Raw(encode(["x"])))
    assert reply_data("ns", final) != reply_data("ns", msgspec.structs.replace(final, status=CHUNK))
    # The bytes a final reply's signature covers are what they were before chunks existed.
    assert reply_data("ns", final) == encode(
        (b"reach/reply/1", "ns", "m", "succeeded", final.result, "", "", "", "", 1)
    )


def test_a_sink_bounded_in_bytes_keeps_nothing_past_its_bound() -> None:
    """``max_bytes`` counts the encoded chunk entries taken: the entry that would pass it
    and every one after it are not kept, and the sink says so (the caller's loop then
    raises StreamTooLarge); what came before stays to be read."""
    first, second = entry(0, ["a" * 40]), entry(1, ["b" * 40])
    size = len(first.result)
    sink = ChunkSink(max_bytes=size + 10)
    sink.add(first)
    assert list(sink.chunks) == ["a" * 40] and not sink.overflowed
    sink.add(second)
    sink.add(entry(2, ["c"]))
    assert list(sink.chunks) == ["a" * 40] and sink.overflowed
    assert sink.next_seq == 1 and sink.received_bytes == 2 * size


def test_a_sink_without_a_bound_keeps_everything() -> None:
    sink = ChunkSink()
    for i in range(1000):
        sink.add(entry(i, ["x" * 1000]))
    assert len(sink.chunks) == 1000 and not sink.overflowed

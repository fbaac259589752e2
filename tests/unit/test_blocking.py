"""reach._blocking.stream_reply: an XREAD/XREADGROUP reply in either protocol, as redis-py's
client returns it (the readers iterate over it the same way)."""

from __future__ import annotations

from reach._blocking import stream_reply


def test_a_resp3_map_and_resp2_pairs_read_alike() -> None:
    resp3 = {b"s": [[b"1-0", [b"a", b"1", b"b", b"2"]], [b"2-0", [b"r", b"x"]]]}
    resp2 = [[b"s", [[b"1-0", [b"a", b"1", b"b", b"2"]], [b"2-0", [b"r", b"x"]]]]]
    want = [(b"s", [(b"1-0", {b"a": b"1", b"b": b"2"}), (b"2-0", {b"r": b"x"})])]
    assert stream_reply(resp3) == want
    assert stream_reply(resp2) == want


def test_nil_and_deleted_fields() -> None:
    assert stream_reply(None) == []
    assert stream_reply({}) == []
    # an entry deleted after it was read (XREADGROUP of pending ids) has nil fields
    assert stream_reply({b"s": [[b"1-0", None]]}) == [(b"s", [(b"1-0", {})])]


def test_streams_keep_their_order() -> None:
    reply = {b"hi": [[b"1-0", [b"e", b"x"]]], b"lo": [[b"2-0", [b"e", b"y"]]]}
    assert [k for k, _ in stream_reply(reply)] == [b"hi", b"lo"]

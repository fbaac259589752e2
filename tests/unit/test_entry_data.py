"""reach._worker.consumer.entry_data: the envelope bytes of an inbox entry as read."""

from __future__ import annotations

from typing import Any

import pytest

from reach._worker.consumer import entry_data


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ([b"e", b"ENV"], b"ENV"),  # fetch.lua's flat list, as reach writes it
        ({b"e": b"ENV"}, b"ENV"),  # redis-py's dict (XREADGROUP)
        ({"e": b"ENV"}, b"ENV"),
        ([b"x", b"1", b"e", b"ENV"], b"ENV"),  # other fields beside it
        ([b"e", b"A", b"e", b"B"], b"B"),  # a field twice: the last, as a dict keeps it
        ([b"e", "text"], None),  # not bytes
        ([b"x", b"ENV"], None),  # no 'e' field
        ([b"e"], None),
        ([], None),
        (None, None),
        ("e", None),
    ],
)
def test_entry_data(fields: Any, want: bytes | None) -> None:
    assert entry_data(fields) == want

"""reach._worker.consumer.entry_data: the envelope bytes of an inbox entry as read."""

from __future__ import annotations

from typing import Any

import pytest

from reach._worker.consumer import entry_claim, entry_data, entry_fields


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


@pytest.mark.parametrize(
    "fields",
    [
        [b"e", b"ENV"],
        [b"e", b"ENV", b"c", b"a/1", b"l", b"123"],  # send.lua's entry with a claim
        [b"e", b"ENV", b"c", b"a/1", b"l", b"12x"],  # a lease that is no number
        [b"e", b"ENV", b"c", b"a/1", b"l", b"1" * 17],  # one too long
        [b"e", "text", b"c", b"a/1", b"l", b"123"],
        [b"e", b"ENV", b"c", "a/1", b"l", b"123"],
        [b"e", b"A", b"c", b"a/1", b"e", b"B"],  # fields out of order: the generic path
        [b"c", b"a/1", b"l", b"123"],
        {b"e": b"ENV", b"c": b"a/1", b"l": b"9"},
        [b"e", b"A", b"e", b"B"],
        [],
        None,
    ],
)
def test_entry_fields_as_the_two_looks(fields: Any) -> None:
    """entry_fields is entry_data and entry_claim at once, whatever the entry holds."""
    assert entry_fields(fields) == (entry_data(fields), entry_claim(fields))

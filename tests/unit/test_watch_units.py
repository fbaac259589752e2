"""reach.watch without Redis: the progress fraction and note as progress.lua takes them,
and the channel messages read back as changes."""

from __future__ import annotations

import math

import pytest

from reach import ConfigError, TaskChange
from reach.scripts.watching import MAX_NOTE_BYTES
from reach.watch import _parse, _repeats, cut_note, parse_fraction


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (1, "1"), (0.25, "0.25"), (1 / 3, "0.333333"), (0.0000001, "0"), (0.5, "0.5")],
)
def test_a_fraction_is_decimal_text_of_at_most_12_bytes(value: float, text: str) -> None:
    assert parse_fraction(value) == text
    assert len(text) <= 12


@pytest.mark.parametrize("value", [-0.1, 1.0001, math.nan, math.inf, True, "0.5", None])
def test_a_fraction_outside_0_1_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="progress fraction"):
        parse_fraction(value)  # type: ignore[arg-type]


def test_a_long_note_is_cut_on_a_character_boundary() -> None:
    assert cut_note("short") == "short"
    cut = cut_note("é" * MAX_NOTE_BYTES)  # 2 bytes each
    assert cut == "é" * (MAX_NOTE_BYTES // 2)
    assert len(cut_note("ab€" * 400).encode()) <= MAX_NOTE_BYTES
    with pytest.raises(ConfigError, match="note must be text"):
        cut_note(3)  # type: ignore[arg-type]


def test_channel_messages_read_as_changes() -> None:
    got = _parse("m", "running", b"progress:0.5:step: two of four")
    assert got == TaskChange(
        msg_id="m", kind="progress", status="running", progress=0.5, note="step: two of four"
    )
    assert _parse("m", "pending", b"succeeded") == TaskChange(
        msg_id="m", kind="status", status="succeeded"
    )
    for junk in (b"unknown", b"", b"progress:x:y", b"\xff\xfe", b"hello"):
        assert _parse("m", "running", junk) is None


def test_a_repeat_of_what_was_shown_is_skipped() -> None:
    current = TaskChange(msg_id="m", kind="current", status="running", progress=0.5, note="a")
    assert _repeats(TaskChange(msg_id="m", kind="status", status="running"), current)
    assert not _repeats(TaskChange(msg_id="m", kind="status", status="succeeded"), current)
    same = TaskChange(msg_id="m", kind="progress", status="running", progress=0.5, note="a")
    assert _repeats(same, current)
    later = TaskChange(msg_id="m", kind="progress", status="running", progress=0.75, note="a")
    assert not _repeats(later, current)

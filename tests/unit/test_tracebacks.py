"""How a handler's traceback is bounded and redacted before it is stored, and how the
dead-letter log lines are rate-limited (plain values, no Redis)."""

from __future__ import annotations

from reach._worker.letters import ReportLimit
from reach._worker.outcome import format_traceback


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001 - the test wants it with its traceback
        return e


def test_a_short_traceback_is_kept_whole() -> None:
    tb = format_traceback(raised(KeyError("txt")), max_bytes=8192)
    assert tb.startswith("Traceback (most recent call last):")
    assert tb.endswith("KeyError: 'txt'\n") and "in raised" in tb


def test_a_long_traceback_keeps_its_last_bytes_from_a_line_start() -> None:
    tb = format_traceback(raised(ValueError("x" * 5000 + "\nlast line")), max_bytes=200)
    assert len(tb.encode()) <= 200
    assert tb.startswith("[... earlier lines cut]\n") and tb.endswith("last line\n")


def test_a_cut_never_splits_a_character() -> None:
    tb = format_traceback(raised(ValueError("é" * 3000)), max_bytes=101)
    assert len(tb.encode()) <= 101 and "\ufffd" not in tb


def test_zero_bytes_means_no_traceback() -> None:
    assert format_traceback(raised(KeyError("txt")), max_bytes=0) == ""


def test_the_redaction_hook_sees_the_text_and_returns_what_is_kept() -> None:
    tb = format_traceback(
        raised(RuntimeError("token=abc123")),
        max_bytes=8192,
        redact=lambda text: text.replace("abc123", "[redacted]"),
    )
    assert "abc123" not in tb and "token=[redacted]" in tb


def test_a_redaction_hook_that_fails_withholds_the_text() -> None:
    def broken(text: str) -> str:
        raise ValueError("bad pattern")

    tb = format_traceback(raised(RuntimeError("token=abc123")), max_bytes=8192, redact=broken)
    assert "abc123" not in tb and "redaction hook raised ValueError: bad pattern" in tb


def test_report_limit_allows_a_burst_then_counts_the_rest() -> None:
    limit = ReportLimit(per_window=3, window_s=10.0)
    assert [limit.take(now_s=100.0 + i / 10) for i in range(5)] == [True] * 3 + [False] * 2
    assert limit.suppressed == 2
    assert limit.take(now_s=110.1)  # a new window

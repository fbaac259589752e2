"""reach.logs.OutageLog: an outage is one line, a reminder now and then, and one line when
it ends, however many attempts fail in between (issue 9, item 12)."""

from __future__ import annotations

import logging
import threading

import pytest

from reach.logs import OutageLog


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "reach.test_outage"]


def test_a_minute_of_failures_eight_a_second_is_four_lines(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reach.test_outage")
    out = OutageLog("reach.test_outage", "reply stream read", remind_s=30, clock=clock)
    assert not out.down and out.down_for_s == 0.0
    logged = 0
    for _ in range(481):  # 60 s of retries, one every 0.125 s (exact in binary)
        logged += out.failed(ConnectionError("Connection refused"))
        clock.t += 0.125
    assert out.down and out.attempts == 481
    assert out.down_for_s == 60.125
    assert out.ok() is True
    assert not out.down and out.attempts == 0
    got = lines(caplog)
    assert logged == 3 and len(got) == 4, got
    assert got[0] == (
        "reply stream read failed: ConnectionError: Connection refused; retrying "
        "(reminder every 30 s, one line when it works again)"
    )
    assert got[1] == (
        "reply stream read still failing after 30 s (241 attempts): "
        "ConnectionError: Connection refused"
    )
    assert got[2].startswith("reply stream read still failing after 60 s (481 attempts)")
    assert got[3] == "reply stream read works again after 60.1 s (481 failed attempts)"


def test_ok_without_an_outage_says_nothing(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reach.test_outage")
    out = OutageLog(logging.getLogger("reach.test_outage"), "refresh", clock=clock)
    for _ in range(100):
        assert out.ok() is False
    assert lines(caplog) == []


def test_each_outage_starts_with_its_own_first_line(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reach.test_outage")
    out = OutageLog("reach.test_outage", "refresh", remind_s=30, clock=clock)
    for _ in range(2):
        out.failed("WRONGTYPE")
        clock.t += 1
        out.failed("WRONGTYPE")
        out.ok()
        clock.t += 1
    got = lines(caplog)
    assert len(got) == 4, got
    assert got[0] == got[2] and "refresh failed: WRONGTYPE" in got[0]
    assert got[1] == got[3] == "refresh works again after 1.0 s (2 failed attempts)"


def test_level_and_exceptions_without_text(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="reach.test_outage")
    out = OutageLog("reach.test_outage", "tick", level=logging.ERROR, clock=clock)
    out.failed(TimeoutError())
    assert caplog.records[-1].levelno == logging.ERROR
    assert "tick failed: TimeoutError;" in caplog.records[-1].getMessage()


def test_shared_between_threads_it_still_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reach.test_outage")
    out = OutageLog("reach.test_outage", "heartbeat", remind_s=3600)
    start = threading.Barrier(8)

    def hammer() -> None:
        start.wait()
        for _ in range(500):
            out.failed("down")

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out.attempts == 4000
    assert len(lines(caplog)) == 1

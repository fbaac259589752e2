"""Circuit breaker transitions, driven by recorded outcomes and a fake clock."""

from __future__ import annotations

import math

import pytest

from reach.breaker import CLOSED, HALF_OPEN, OPEN, BreakerChange, Breakers
from reach.errors import ConfigError


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def make(clock: FakeClock, **kw: object) -> tuple[Breakers, list[BreakerChange]]:
    changes: list[BreakerChange] = []
    opts: dict[str, object] = {
        "window_s": 10.0,
        "buckets": 10,
        "min_requests": 4,
        "error_rate": 0.5,
        "cooldown_s": 5.0,
    }
    opts.update(kw)
    b = Breakers(clock=clock, on_change=changes.append, **opts)  # type: ignore[arg-type]
    return b, changes


def trip(b: Breakers, agent: str = "a", n: int = 4) -> None:
    for _ in range(n):
        b.record(agent, ok=False)


def test_unknown_agent_is_closed_and_allowed() -> None:
    b, changes = make(FakeClock())
    assert b.state("x") == CLOSED
    assert b.allow("x")
    assert not b.is_open("x")
    assert b.counts("x") == (0, 0)
    assert changes == []


def test_stays_closed_below_min_requests() -> None:
    b, changes = make(FakeClock())
    trip(b, n=3)
    assert b.state("a") == CLOSED
    assert b.allow("a")
    assert b.counts("a") == (3, 3)
    assert changes == []


def test_stays_closed_below_error_rate() -> None:
    b, _ = make(FakeClock())
    for ok in (True, True, False, True, True, False, True):  # 2/7 < 50 %
        b.record("a", ok)
    assert b.state("a") == CLOSED


def test_full_cycle_closed_open_half_open_closed() -> None:
    clock = FakeClock()
    b, changes = make(clock)
    b.record("a", True)
    b.record("a", False)
    b.record("a", True)
    assert b.state("a") == CLOSED
    b.record("a", False)  # 2 of 4 = 50 % >= threshold, 4 >= min_requests
    assert b.state("a") == OPEN
    assert changes[-1] == BreakerChange("a", CLOSED, OPEN, clock.t, 4, 2)
    assert not b.allow("a")
    assert b.is_open("a")

    clock.advance(4.9)
    assert not b.allow("a")
    assert b.state("a") == OPEN
    clock.advance(0.1)
    assert not b.is_open("a")  # a probe slot is free
    assert b.state("a") == HALF_OPEN
    assert b.allow("a")  # the probe
    assert b.is_open("a")  # its slot is taken
    assert not b.allow("a")  # no second probe
    b.record("a", True)
    assert b.state("a") == CLOSED
    assert b.counts("a") == (0, 0)  # window cleared on close
    assert b.allow("a")
    assert [(c.old, c.new) for c in changes] == [
        (CLOSED, OPEN),
        (OPEN, HALF_OPEN),
        (HALF_OPEN, CLOSED),
    ]


def test_failed_probe_reopens_with_growing_cooldown() -> None:
    clock = FakeClock()
    b, changes = make(clock, max_cooldown_s=12.0)
    trip(b)
    assert b.state("a") == OPEN
    clock.advance(5.0)
    assert b.allow("a")
    b.record("a", False)
    assert b.state("a") == OPEN
    clock.advance(5.0)
    assert b.state("a") == OPEN  # cool-down doubled to 10 s
    clock.advance(5.0)
    assert b.allow("a")
    b.record("a", False)
    clock.advance(11.9)
    assert b.state("a") == OPEN  # 20 s capped at 12 s
    clock.advance(0.1)
    assert b.allow("a")
    b.record("a", True)
    assert b.state("a") == CLOSED
    # after a close the cool-down starts from cooldown_s again
    trip(b)
    clock.advance(5.0)
    assert b.state("a") == HALF_OPEN
    assert [c.new for c in changes].count(OPEN) == 4


def test_several_probes() -> None:
    clock = FakeClock()
    b, _ = make(clock, half_open_probes=2)
    trip(b)
    clock.advance(5.0)
    assert b.allow("a") and b.allow("a")
    assert not b.allow("a")
    b.record("a", True)
    assert b.state("a") == HALF_OPEN  # one success of two
    assert b.allow("a")  # the finished probe's slot is free again
    b.record("a", True)
    assert b.state("a") == CLOSED


def test_lost_probe_frees_its_slot_after_a_cooldown() -> None:
    clock = FakeClock()
    b, _ = make(clock)
    trip(b)
    clock.advance(5.0)
    assert b.allow("a")  # probe sent, outcome never recorded
    clock.advance(4.0)
    assert not b.allow("a")
    clock.advance(1.0)
    assert b.allow("a")


def test_outcomes_while_open_are_ignored() -> None:
    clock = FakeClock()
    b, _ = make(clock)
    trip(b)
    b.record("a", True)
    b.record("a", True)
    assert b.state("a") == OPEN


def test_old_outcomes_leave_the_window() -> None:
    clock = FakeClock()
    b, _ = make(clock)
    trip(b, n=3)
    clock.advance(10.0)  # those failures are now out of the 10 s window
    assert b.counts("a") == (0, 0)
    b.record("a", False)
    assert b.state("a") == CLOSED
    assert b.counts("a") == (1, 1)


def test_window_slides_bucket_by_bucket() -> None:
    clock = FakeClock(0.0)
    b, _ = make(clock, min_requests=100)
    for _ in range(10):
        b.record("a", False)
        clock.advance(1.0)
    assert b.counts("a") == (9, 9)  # the first bucket left as the 11th began
    clock.advance(4.0)
    assert b.counts("a") == (5, 5)


def test_is_open_takes_no_probe_slot() -> None:
    clock = FakeClock()
    b, _ = make(clock)
    trip(b)
    clock.advance(5.0)
    for _ in range(3):
        assert not b.is_open("a")
    assert b.allow("a")


def test_breakers_are_per_agent() -> None:
    b, _ = make(FakeClock())
    trip(b, "a")
    assert b.state("a") == OPEN
    assert b.state("b") == CLOSED
    assert b.allow("b")
    assert b.snapshot() == {"a": OPEN}
    b.forget("a")
    assert b.state("a") == CLOSED
    trip(b, "b")
    b.reset()
    assert b.snapshot() == {}


def test_a_failing_listener_does_not_break_the_breaker(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def boom(change: BreakerChange) -> None:
        raise RuntimeError("metrics down")

    b = Breakers(min_requests=1, clock=FakeClock(), on_change=boom)
    b.listeners.append(lambda c: seen.append(c.new))
    b.record("a", False)
    assert b.state("a") == OPEN
    assert seen == [OPEN]
    assert "breaker listener" in caplog.text


@pytest.mark.parametrize(
    "kw",
    [
        {"window_s": 0},
        {"buckets": 0},
        {"min_requests": 0},
        {"error_rate": 0},
        {"error_rate": 1.5},
        {"cooldown_s": -1},
        {"half_open_probes": 0},
        {"cooldown_s": 5, "max_cooldown_s": 1},
        {"window_s": math.nan},
        {"cooldown_s": math.nan},
    ],
)
def test_bad_settings(kw: dict[str, float]) -> None:
    # A ConfigError (a ReachError, still a ValueError) naming the setting.
    with pytest.raises(ConfigError, match=next(iter(kw))):
        Breakers(**kw)  # type: ignore[arg-type]


# -- the ramp after a close -------------------------------------------------------------------
def close_after_probe(b: Breakers, clock: FakeClock, agent: str = "a") -> None:
    trip(b, agent)
    clock.advance(5.0)
    assert b.allow(agent)  # the half-open probe
    b.record(agent, ok=True)
    assert b.state(agent) == CLOSED


def test_a_closed_breaker_ramps_its_share_back_in_steps() -> None:
    clock = FakeClock()
    b, _ = make(clock, ramp_s=10.0, ramp_floor=0.1)
    assert b.ramp("a") == (1.0, math.inf) and not b.ramping  # never opened: whole
    close_after_probe(b, clock)
    assert b.ramping
    factor, hold_s = b.ramp("a")
    assert factor == pytest.approx(0.1) and hold_s == pytest.approx(0.5)  # 20 steps of 0.5 s
    clock.advance(5.0)
    assert b.ramp("a")[0] == pytest.approx(0.55)
    clock.advance(4.99)
    assert b.ramp("a") == (pytest.approx(0.1 + 0.9 * 19 / 20), pytest.approx(0.01))
    clock.advance(0.01)
    assert b.ramp("a") == (1.0, math.inf) and not b.ramping  # whole again: the ramp is over
    assert b.ramp("other") == (1.0, math.inf)


def test_a_failure_during_the_ramp_opens_it_and_the_next_close_ramps_anew() -> None:
    clock = FakeClock()
    b, _ = make(clock, ramp_s=10.0, min_requests=1)
    close_after_probe(b, clock)
    clock.advance(6.0)
    b.record("a", ok=False)  # 1 of 1 failed: open again
    assert b.state("a") == OPEN and not b.ramping
    assert b.ramp("a") == (1.0, math.inf)  # open: routing filters it, nothing to scale
    clock.advance(10.0)  # the cool-down (doubled) passed
    close_after_probe(b, clock)
    assert b.ramp("a")[0] == pytest.approx(0.1)


def test_ramp_s_zero_closes_at_full_share_and_bad_ramps_are_refused() -> None:
    clock = FakeClock()
    b, _ = make(clock, ramp_s=0)
    close_after_probe(b, clock)
    assert b.ramp("a") == (1.0, math.inf) and not b.ramping
    for kw in ({"ramp_s": -1}, {"ramp_s": math.inf}, {"ramp_floor": 0}, {"ramp_floor": 1.5}):
        with pytest.raises(ConfigError, match=next(iter(kw))):
            Breakers(**kw)  # type: ignore[arg-type]


def test_every_state_change_is_counted_for_the_routing_caches() -> None:
    clock = FakeClock()
    b, changes = make(clock)
    before = b.changes
    close_after_probe(b, clock)  # closed -> open -> half_open -> closed
    assert b.changes - before == len(changes) == 3

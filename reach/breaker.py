"""Client-side circuit breakers, one per target agent.

A caller keeps one :class:`Breakers` per client. Before sending to an agent it asks
:meth:`Breakers.allow`; after the outcome is known it calls :meth:`Breakers.record`. The router
(:mod:`reach.routing`) skips agents whose breaker is open and uses :meth:`Breakers.allow` on the
agent it finally picks, so a half-open probe slot is only taken by a message actually sent.

States::

    closed --(>= min_requests in the window and error rate >= error_rate)--> open
    open --(cool-down elapsed; checked lazily on the next allow/state call)--> half_open
    half_open --(half_open_probes successes)--> closed   (window cleared, then a ramp)
    half_open --(one failure)--> open                    (cool-down doubles, up to max_cooldown_s)

Ramp after recovery: a breaker that closes after a probe does not give its agent its whole
share at once (a recovered agent may still be cold, or fail again under full load). For
``ramp_s`` seconds its share is scaled by :meth:`Breakers.ramp`, a factor that grows
linearly from ``ramp_floor`` to 1 in :data:`RAMP_STEPS` steps, as slow start does for a new
agent; the weighted policies (``weighted_rr``, ``least_conn``) apply it to its weight. A
failure that opens the breaker again ends the ramp; the next close starts a new one.

Window: **time-based**, ``window_s`` seconds split into ``buckets`` buckets (default 30 s in
10 buckets of 3 s). A time window was chosen over a count window because agents see very
different traffic: with a count window, a rarely used agent would be judged on failures from
long ago; with time buckets, old outcomes age out and ``min_requests`` keeps a quiet agent from
tripping on one or two errors. Cost per record is O(1) amortised.

Half-open admits ``half_open_probes`` probe calls (default 1). A probe whose outcome never
arrives (lost reply, caller crashed before :meth:`record`) frees its slot after another
cool-down, so a breaker cannot stay half-open forever. In half-open every recorded outcome
counts, including late outcomes of calls sent before the breaker opened (a breaker cannot tell
them apart); outcomes recorded while open are ignored.

Single-threaded by design (one event loop per client); not thread-safe.
State changes are delivered to ``listeners`` (and ``on_change``) as :class:`BreakerChange`; a
listener that raises is logged and otherwise ignored.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Final, Literal, NamedTuple

from .errors import ConfigError

__all__ = [
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "RAMP_STEPS",
    "BreakerChange",
    "BreakerState",
    "Breakers",
]

log = logging.getLogger(__name__)

BreakerState = Literal["closed", "open", "half_open"]
CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half_open"
RAMP_STEPS: Final = 20
"""Steps of the ramp after a close: the factor changes at most this many times, so the
routing structures built on it are rebuilt at most that often."""


class BreakerChange(NamedTuple):
    """One state change of one agent's breaker."""

    agent_id: str
    old: BreakerState
    new: BreakerState
    at: float
    """The breaker clock's time of the change (seconds)."""
    requests: int
    """Outcomes in the window when the change happened (0 after a half-open decision)."""
    failures: int


class _Breaker:
    __slots__ = (
        "closed_at",
        "cooldown",
        "failures",
        "opened_at",
        "opens",
        "probe_at",
        "probes",
        "state",
        "successes",
        "total",
        "window",
    )

    def __init__(self) -> None:
        self.state: BreakerState = CLOSED
        # deque of [bucket_no, total, failures], oldest first
        self.window: deque[list[int]] = deque()
        self.total = 0
        self.failures = 0
        self.opened_at = 0.0
        self.cooldown = 0.0
        self.opens = 0  # consecutive opens without a close in between
        self.probes = 0  # probes in flight (half-open)
        self.probe_at = 0.0
        self.successes = 0  # probe successes (half-open)
        self.closed_at = 0.0  # when a probe closed it (0: not ramping)


def _bad(name: str, value: object, wanted: str) -> ConfigError:
    return ConfigError(f"Breakers({name}={value!r}): {name} must be {wanted}.")


class Breakers:
    """A circuit breaker per target agent, created on first use.

    :param window_s: length of the sliding time window (seconds).
    :param buckets: number of buckets the window is split into (its resolution).
    :param min_requests: outcomes needed in the window before the error rate is judged.
    :param error_rate: failure fraction (0..1] at or above which the breaker opens.
    :param cooldown_s: time open before a half-open probe is allowed.
    :param max_cooldown_s: cap for the cool-down, which doubles each time a probe fails
        (default: ``cooldown_s``, i.e. no growth).
    :param half_open_probes: probes admitted in half-open; that many successes close it.
    :param ramp_s: after a close, how long the agent's share takes to grow back from
        ``ramp_floor`` to whole (:meth:`ramp`; 0: at once).
    :param ramp_floor: the share factor at the start of the ramp, in (0, 1].
    :param clock: monotonic seconds; inject a fake one in tests.
    :param on_change: called with a :class:`BreakerChange` on every state change
        (also reachable as ``listeners``, a list the caller may append to).
    :raises reach.ConfigError: a setting out of its range (the message says which and why).
    """

    def __init__(
        self,
        *,
        window_s: float = 30.0,
        buckets: int = 10,
        min_requests: int = 10,
        error_rate: float = 0.5,
        cooldown_s: float = 5.0,
        max_cooldown_s: float | None = None,
        half_open_probes: int = 1,
        ramp_s: float = 10.0,
        ramp_floor: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerChange], None] | None = None,
    ) -> None:
        # Written as "not (valid)" so that NaN, which no comparison accepts, is refused too.
        if not window_s > 0:
            raise _bad("window_s", window_s, "a number of seconds > 0 (default 30)")
        if not buckets >= 1:
            raise _bad("buckets", buckets, "a whole number >= 1 (default 10)")
        if not min_requests >= 1:
            raise _bad("min_requests", min_requests, "a whole number >= 1 (default 10)")
        if not 0.0 < error_rate <= 1.0:
            raise _bad(
                "error_rate",
                error_rate,
                "a failure fraction above 0 and at most 1 (default 0.5: the breaker "
                "opens once half the calls in the window failed)",
            )
        if not cooldown_s >= 0:
            raise _bad("cooldown_s", cooldown_s, "a number of seconds >= 0 (default 5)")
        if not half_open_probes >= 1:
            raise _bad("half_open_probes", half_open_probes, "a whole number >= 1 (default 1)")
        self.window_s = float(window_s)
        self.buckets = int(buckets)
        self.bucket_s = self.window_s / self.buckets
        self.min_requests = int(min_requests)
        self.error_rate = float(error_rate)
        self.cooldown_s = float(cooldown_s)
        self.max_cooldown_s = float(cooldown_s if max_cooldown_s is None else max_cooldown_s)
        if not self.max_cooldown_s >= self.cooldown_s:
            raise _bad(
                "max_cooldown_s",
                max_cooldown_s,
                f"a number of seconds >= cooldown_s ({cooldown_s:g}), or None to keep the "
                "cool-down at cooldown_s",
            )
        self.half_open_probes = int(half_open_probes)
        if not 0 <= ramp_s < math.inf:
            raise _bad("ramp_s", ramp_s, "a number of seconds >= 0 (default 10; 0: no ramp)")
        if not 0.0 < ramp_floor <= 1.0:
            raise _bad("ramp_floor", ramp_floor, "a share above 0 and at most 1 (default 0.1)")
        self.ramp_s = float(ramp_s)
        self.ramp_floor = float(ramp_floor)
        self.changes = 0
        """Counts state changes: a cache of what depends on the states keys on it."""
        self._ramping: set[str] = set()
        self.clock = clock
        self.listeners: list[Callable[[BreakerChange], None]] = []
        if on_change is not None:
            self.listeners.append(on_change)
        self._b: dict[str, _Breaker] = {}

    # -- queries ----------------------------------------------------------------------
    def state(self, agent_id: str) -> BreakerState:
        """The breaker's state (an open breaker whose cool-down passed reports half_open)."""
        b = self._b.get(agent_id)
        if b is None:
            return CLOSED
        self._advance(agent_id, b, self.clock())
        return b.state

    def is_open(self, agent_id: str) -> bool:
        """True when :meth:`allow` would refuse now. Takes no probe slot (for filtering)."""
        b = self._b.get(agent_id)
        if b is None or b.state == CLOSED:
            return False
        now = self.clock()
        if b.state == OPEN:
            return now - b.opened_at < b.cooldown
        return b.probes >= self.half_open_probes and now - b.probe_at < b.cooldown

    def counts(self, agent_id: str) -> tuple[int, int]:
        """``(requests, failures)`` currently in the agent's window."""
        b = self._b.get(agent_id)
        if b is None:
            return 0, 0
        self._expire(b, self.clock())
        return b.total, b.failures

    @property
    def ramping(self) -> bool:
        """True while some agent's share is ramping back after a close (:meth:`ramp`)."""
        return bool(self._ramping)

    def ramp(self, agent_id: str) -> tuple[float, float]:
        """``(factor, hold_s)``: the share of its weight ``agent_id`` gets now (1.0 unless
        its breaker closed less than ``ramp_s`` ago: then from ``ramp_floor`` to 1, linear in
        :data:`RAMP_STEPS` steps) and for how many more seconds that factor holds (``inf``
        once whole)."""
        b = self._b.get(agent_id)
        if b is None or not b.closed_at:
            return 1.0, math.inf
        if b.state != CLOSED:
            return 1.0, math.inf  # open or probing: routing filters it, no share to scale
        now = self.clock()
        age = max(0.0, now - b.closed_at)
        if age >= self.ramp_s:
            b.closed_at = 0.0
            self._ramping.discard(agent_id)
            return 1.0, math.inf
        step = int(age * RAMP_STEPS // self.ramp_s)
        factor = self.ramp_floor + (1.0 - self.ramp_floor) * step / RAMP_STEPS
        return factor, b.closed_at + (step + 1) * self.ramp_s / RAMP_STEPS - now

    def snapshot(self) -> dict[str, BreakerState]:
        """State of every breaker that is not closed (for the CLI / metrics)."""
        return {a: s for a in list(self._b) if (s := self.state(a)) != CLOSED}

    # -- the two calls around a request -----------------------------------------------
    def allow(self, agent_id: str) -> bool:
        """May a request go to ``agent_id`` now? In half-open this takes a probe slot."""
        b = self._b.get(agent_id)
        if b is None or b.state == CLOSED:
            return True
        now = self.clock()
        self._advance(agent_id, b, now)
        if b.state == OPEN:
            return False
        if b.probes >= self.half_open_probes:
            if now - b.probe_at < b.cooldown:
                return False
            b.probes = 0  # the probes never reported back: give up on them
        b.probes += 1
        b.probe_at = now
        return True

    def record(self, agent_id: str, ok: bool) -> None:
        """Record the outcome of one request to ``agent_id``."""
        b = self._b.get(agent_id)
        if b is None:
            b = self._b[agent_id] = _Breaker()
        now = self.clock()
        if b.state == CLOSED:
            self._add(b, now, ok)
            if b.total >= self.min_requests and b.failures >= self.error_rate * b.total:
                self._open(agent_id, b, now)
            return
        self._advance(agent_id, b, now)
        if b.state == OPEN:
            return  # late outcome of a call sent before the breaker opened
        b.probes = max(0, b.probes - 1)
        if not ok:
            self._open(agent_id, b, now)
            return
        b.successes += 1
        if b.successes >= self.half_open_probes:
            b.window.clear()
            b.total = b.failures = 0
            b.opens = 0
            if self.ramp_s > 0:
                b.closed_at = now or 1e-9  # 0 means "not ramping"
                self._ramping.add(agent_id)
            self._set(agent_id, b, CLOSED, now)

    def forget(self, agent_id: str) -> None:
        """Drop an agent's breaker (e.g. it deregistered)."""
        self._b.pop(agent_id, None)
        self._ramping.discard(agent_id)
        self.changes += 1

    def reset(self) -> None:
        """Drop every breaker (all closed, empty windows)."""
        self._b.clear()
        self._ramping.clear()
        self.changes += 1

    # -- internals --------------------------------------------------------------------
    def _add(self, b: _Breaker, now: float, ok: bool) -> None:
        no = math.floor(now / self.bucket_s)
        self._expire(b, now, no)
        w = b.window
        if w and w[-1][0] == no:
            cell = w[-1]
        else:
            cell = [no, 0, 0]
            w.append(cell)
        cell[1] += 1
        b.total += 1
        if not ok:
            cell[2] += 1
            b.failures += 1

    def _expire(self, b: _Breaker, now: float, no: int | None = None) -> None:
        if no is None:
            no = math.floor(now / self.bucket_s)
        oldest = no - self.buckets + 1
        w = b.window
        while w and w[0][0] < oldest:
            _, t, f = w.popleft()
            b.total -= t
            b.failures -= f

    def _advance(self, agent_id: str, b: _Breaker, now: float) -> None:
        if b.state == OPEN and now - b.opened_at >= b.cooldown:
            b.probes = 0
            b.successes = 0
            self._set(agent_id, b, HALF_OPEN, now)

    def _open(self, agent_id: str, b: _Breaker, now: float) -> None:
        b.closed_at = 0.0  # a ramp ends when it fails again
        self._ramping.discard(agent_id)
        b.opens += 1
        b.cooldown = min(self.cooldown_s * 2.0 ** (b.opens - 1), self.max_cooldown_s)
        b.opened_at = now
        b.probes = 0
        b.successes = 0
        self._set(agent_id, b, OPEN, now)

    def _set(self, agent_id: str, b: _Breaker, new: BreakerState, now: float) -> None:
        old = b.state
        if old == new:
            return
        b.state = new
        self.changes += 1
        change = BreakerChange(agent_id, old, new, now, b.total, b.failures)
        for fn in list(self.listeners):
            try:
                fn(change)
            except Exception:  # a broken metrics hook must not break routing
                log.exception("breaker listener %r failed on %s", fn, change)

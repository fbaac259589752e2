"""Run a ``reach`` command with this process's wall clock shifted (test-only).

    python -m tests.support.skewed SECONDS worker mod:factory --redis-url ...

``time.time`` and ``time.time_ns`` (what every epoch time in reach reads) are moved by
SECONDS (negative: behind) before reach is imported: the process behaves as one on a host
whose clock is that far off, while Redis's ``TIME`` and the monotonic clocks (timeouts,
sleeps) are not. Used by tests/integration/test_clock_skew.py.
"""

from __future__ import annotations

import sys
import time


def _shift(seconds: float) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    shift_ns = int(seconds * 1e9)
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + shift_ns  # type: ignore[assignment]


def main() -> None:
    _shift(float(sys.argv[1]))
    sys.argv = ["reach", *sys.argv[2:]]
    from reach_cli.app import main as reach_main

    reach_main()


if __name__ == "__main__":
    main()

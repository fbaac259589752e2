"""bench/caller_cost.py --many: send_many timed beside the lean floor's caller in one
process (issue 27's "send_many costs the caller less per message than the lean floor's
caller"). A short run: both figures printed, every message sent, and the ratio the two
figures make; and send_many's Python path alone (``--fake-redis``)."""

from __future__ import annotations

import re
import subprocess

from tests.support.bench_scripts import run_bench


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench("caller_cost.py", *args)


def test_send_many_is_timed_beside_the_lean_caller() -> None:
    done = _run("--many", "100", "--messages", "600", "--repeat", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    reach = re.search(r"send_many of 100.*\n\s+CPU per send ([\d.]+) µs", out)
    lean = re.search(r"lean floor's caller, 100 a call.*\n\s+CPU per send ([\d.]+) µs", out)
    ratio = re.search(r"ratio reach send_many / lean floor: ([\d.]+) of the medians", out)
    assert reach and lean and ratio, out
    assert float(reach[1]) > 0 and float(lean[1]) > 0
    # the ratio is of the unrounded figures; the printed ones are rounded to 0.1 µs
    assert abs(float(ratio[1]) - float(reach[1]) / float(lean[1])) < 0.15 * float(ratio[1])


def test_fake_redis_times_send_many_up_to_the_connection() -> None:
    # the send.lua calls answered without Redis: send_many's own path, every message
    # "sent" (a failed one stops the round with its error), and no lean caller to compare
    done = _run("--many", "100", "--messages", "600", "--repeat", "1", "--fake-redis")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert re.search(r"Python path alone \(Redis faked\), send_many of 100", out), out
    cpu = re.search(r"CPU per send ([\d.]+) µs", out)
    assert cpu and float(cpu[1]) > 0, out
    assert "lean floor" not in out

"""bench/request_cpu.py: a short run measures both systems' lone requests (reach's
Client.request and the lean floor's request) and prints their CPU and ratio lines."""

from __future__ import annotations

import re
import subprocess

from tests.support.bench_scripts import run_bench


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench("request_cpu.py", *args)


def test_both_systems_are_measured_side_by_side() -> None:
    done = _run("--requests", "100", "--repeat", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for name in ("reach", "lean floor"):
        row = re.search(rf"^\s+{name}\s+([\d.]+) µs\s+([\d.]+) µs\s+(\d+) µs$", out, re.MULTILINE)
        assert row, out
        assert float(row[1]) > 0 and float(row[3]) > 0, out  # the worker's may read 0 ticks
    ratios = r"reach / lean floor: caller [\d.]+, worker ([\d.]+|n/a), p50 [\d.]+"
    assert re.search(ratios, out), out


def test_too_few_requests_are_refused() -> None:
    done = _run("--requests", "10")
    assert done.returncode != 0 and "--requests must be >= 100" in done.stderr

"""bench/request_calls.py: a short run counts a lone request's calls in reach's caller,
the lean floor's caller and reach's worker, and prints a row for each."""

from __future__ import annotations

import re

from tests.support.bench_scripts import run_bench


def test_each_process_is_counted() -> None:
    done = run_bench("request_calls.py", "--requests", "100")
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("reach caller", "lean caller", "reach worker"):
        row = re.search(rf"^\s+{name}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", done.stdout, re.MULTILINE)
        assert row, done.stdout
        assert float(row[1]) > 0 and float(row[2]) > 0, done.stdout  # calls and loop turns
    # reach's own limits are entered on its request path; the lean floor has none
    reach = re.search(r"reach caller\s+[\d.]+\s+[\d.]+\s+([\d.]+)", done.stdout)
    assert reach and float(reach[1]) > 0, done.stdout

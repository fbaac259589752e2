"""bench/expiry_cost.py: a short run prints what each form of time limit adds to an await
(no figure is judged here: the benchmark is the place for that)."""

from __future__ import annotations

import re

from tests.support.bench_scripts import run_bench


def test_each_form_is_timed() -> None:
    done = run_bench("expiry_cost.py", "--uses", "2000", "--repeat", "1", timeout_s=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for form in ("asyncio.timeout", "anyio.move_on_after", "reach expire_after"):
        assert re.search(rf"{re.escape(form)}\s+-?[\d.]+ µs", done.stdout), done.stdout


def test_bad_arguments_are_refused() -> None:
    done = run_bench("expiry_cost.py", "--uses", "0", timeout_s=60)
    assert done.returncode != 0 and "must be >= 1" in done.stderr

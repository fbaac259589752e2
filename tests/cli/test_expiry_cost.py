"""bench/expiry_cost.py: a short run prints what each form of time limit adds to an await
(no figure is judged here: the benchmark is the place for that)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_form_is_timed() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "expiry_cost.py"), "--uses", "2000", "--repeat", "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for form in ("asyncio.timeout", "anyio.move_on_after", "reach expire_after"):
        assert re.search(rf"{re.escape(form)}\s+-?[\d.]+ µs", done.stdout), done.stdout


def test_bad_arguments_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "expiry_cost.py"), "--uses", "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode != 0 and "must be >= 1" in done.stderr

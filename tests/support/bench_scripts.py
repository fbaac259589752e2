"""Run a script of ``bench/`` as a user would (``python bench/<name>.py ...``, from the
project's root), for the tests that check a short run of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``python bench/<script> <args>``: its exit code, stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )

"""The soak of the HTTP faces, short form (bench/faces_soak.py has the long one): two
``reach gateway`` processes and one ``reach web`` on one Redis, each limited to 256 open
files; 100 legitimate A2A requests from the ``a2a-sdk`` client while hostile callers open
never-read streams, send oversized bodies, reuse the legitimate callers' task and context
ids and hold 300 idle sockets per process, twice (docs/a2a.md, *The soak*)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.faces_soak import MiB, soak

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
# The bounds the docs state for this form (docs/a2a.md, docs/web.md): RSS of each process
# throughout, and each log at the end.
GATEWAY_RSS = 250 * MiB
CONSOLE_RSS = 150 * MiB
LOG_BYTES = 64 * 1024


@pytest.mark.timeout(900)
async def test_the_faces_hold_under_hostile_callers(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    report = await soak(
        redis_url, tmp_path, legit=100, streams=3, oversized=4, foreign=40, idle=300,
        open_files=256, namespace=ns,
    )  # fmt: skip
    print("\n".join(report.lines()))
    assert report.wrong == [], report.wrong[:10]
    assert report.answered == 100
    assert report.console_polls >= 1 and report.console_answered == report.console_polls
    assert report.streams_opened == 3
    assert report.oversized_refused == report.oversized_sent == 4
    assert report.foreign_ids_tried >= 20
    assert report.foreign_ids_refused == report.foreign_ids_tried
    assert report.foreign_contexts_own_session == report.foreign_contexts_tried
    assert all(report.alive.values()), report.alive
    for name, peak in report.peak_rss.items():
        bound = CONSOLE_RSS if name == "console" else GATEWAY_RSS
        assert peak < bound, f"{name} peaked at {peak / MiB:.0f} MB"
    for name, size in report.log_bytes.items():
        assert size < LOG_BYTES, f"the {name} log grew to {size} bytes"

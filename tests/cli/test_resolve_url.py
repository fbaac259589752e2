"""reach.embedded.resolve_url (examples/run_all.py, reach demo) finds the Redis in the
order of reach.config: an explicit URL, REACH_REDIS_URL, the nearest project file; only
where nothing names one does it start an embedded server."""

from __future__ import annotations

from pathlib import Path

import pytest

from reach.config import write_project_url
from reach.embedded import resolve_url


def test_a_project_file_comes_before_an_embedded_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REACH_REDIS_URL", raising=False)
    write_project_url("redis://project:7/0", tmp_path / ".reach" / "config")
    sub = tmp_path / "examples"
    sub.mkdir()
    monkeypatch.chdir(sub)
    assert resolve_url(None) == ("redis://project:7/0", None)
    monkeypatch.setenv("REACH_REDIS_URL", "redis://env:1/0")
    assert resolve_url(None) == ("redis://env:1/0", None)
    assert resolve_url("redis://given:2/0") == ("redis://given:2/0", None)

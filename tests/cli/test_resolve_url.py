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
    for name in ("REACH_REDIS_URL", "REACH_REDIS_URL_FILE", "REACH_REDIS_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    write_project_url("redis://project:7/0", tmp_path / ".reach" / "config")
    sub = tmp_path / "examples"
    sub.mkdir()
    monkeypatch.chdir(sub)
    assert resolve_url(None) == ("redis://project:7/0", None)
    monkeypatch.setenv("REACH_REDIS_URL", "redis://env:1/0")
    assert resolve_url(None) == ("redis://env:1/0", None)
    assert resolve_url("redis://given:2/0") == ("redis://given:2/0", None)


def test_the_url_and_password_files_of_the_environment_count_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REACH_REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "url").write_text("redis://app@fromfile:3/0\n")
    (tmp_path / "pw").write_text("s3cret\n")
    monkeypatch.setenv("REACH_REDIS_URL_FILE", str(tmp_path / "url"))
    monkeypatch.setenv("REACH_REDIS_PASSWORD_FILE", str(tmp_path / "pw"))
    assert resolve_url(None) == ("redis://app:s3cret@fromfile:3/0", None)

"""Where the Redis is: an explicit URL, then REACH_REDIS_URL, then the nearest project file
(reach.toml or .reach/config), else an error that says how to set one. Never a guess."""

from __future__ import annotations

from pathlib import Path

import pytest

import reach
from reach.config import (
    find_project_file,
    locate_redis_url,
    resolve_redis_url,
    write_project_url,
)
from reach.errors import ConfigError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACH_REDIS_URL", raising=False)


def test_nothing_configured_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        resolve_redis_url(start=tmp_path)
    msg = str(ei.value)
    for needle in ("--redis-url", "REACH_REDIS_URL", "reach redis", "reach init", "6379"):
        assert needle in msg
    assert isinstance(ei.value, reach.ReachError)


def test_the_order_explicit_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_project_url("redis://file:1/0", tmp_path / ".reach" / "config")
    assert locate_redis_url(start=tmp_path).url == "redis://file:1/0"
    assert locate_redis_url(start=tmp_path).source.endswith(".reach/config")
    monkeypatch.setenv("REACH_REDIS_URL", "redis://env:1/0")
    assert resolve_redis_url(start=tmp_path) == "redis://env:1/0"
    assert resolve_redis_url("redis://given:1/0", start=tmp_path) == "redis://given:1/0"


def test_nearest_parent_wins_and_reach_toml_before_dot_reach(tmp_path: Path) -> None:
    sub = tmp_path / "a" / "b" / "c"
    sub.mkdir(parents=True)
    write_project_url("redis://top:1/0", tmp_path / ".reach" / "config")
    assert resolve_redis_url(start=sub) == "redis://top:1/0"
    write_project_url("redis://mid-dot:1/0", tmp_path / "a" / ".reach" / "config")
    write_project_url("redis://mid-toml:1/0", tmp_path / "a" / "reach.toml")
    assert resolve_redis_url(start=sub) == "redis://mid-toml:1/0"
    assert find_project_file(sub) == (tmp_path / "a" / "reach.toml").resolve()


def test_a_file_without_redis_url_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "reach.toml").write_text('namespace = "prod"\n')
    sub = tmp_path / "x"
    sub.mkdir()
    (sub / "reach.toml").write_text("# nothing yet\n")
    with pytest.raises(ConfigError):
        resolve_redis_url(start=sub)
    write_project_url("redis://here:1/0", tmp_path / "reach.toml")
    assert resolve_redis_url(start=sub) == "redis://here:1/0"
    assert 'namespace = "prod"' in (tmp_path / "reach.toml").read_text()  # kept


def test_a_broken_file_names_itself(tmp_path: Path) -> None:
    (tmp_path / "reach.toml").write_text("redis_url = [unclosed\n")
    with pytest.raises(ConfigError, match="reach.toml is not valid TOML"):
        resolve_redis_url(start=tmp_path)
    (tmp_path / "reach.toml").write_text("redis_url = 5\n")
    with pytest.raises(ConfigError, match="non-empty string"):
        resolve_redis_url(start=tmp_path)


def test_client_and_agent_refuse_to_guess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="No Redis configured"):
        reach.Client()
    app = reach.Agent("cfg-1", capabilities=["x.y"])
    import anyio

    with pytest.raises(ConfigError, match="No Redis configured"):
        anyio.run(app.run)
    write_project_url("redis://127.0.0.1:1/0", tmp_path / ".reach" / "config")
    assert reach.Client().redis_url == "redis://127.0.0.1:1/0"

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
    for name in ("REACH_REDIS_URL", "REACH_REDIS_URL_FILE", "REACH_REDIS_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)


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


# -- secrets in files: --redis-url-file, REACH_REDIS_URL_FILE, a password file ----------------
SECRET = "p@ss:w/rd with space"


def secret(tmp_path: Path, name: str, text: str) -> Path:
    f = tmp_path / name
    f.write_text(text)
    f.chmod(0o600)
    return f


def test_a_url_file_ranks_with_its_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_project_url("redis://file:1/0", tmp_path / "reach.toml")
    url_file = secret(tmp_path, "url", "redis://fromfile:2/0\n")
    loc = locate_redis_url(url_file=url_file, start=tmp_path)
    assert (loc.url, loc.source) == ("redis://fromfile:2/0", "--redis-url-file")
    with pytest.raises(ConfigError, match="not both"):
        locate_redis_url("redis://given:1/0", url_file=url_file, start=tmp_path)
    # the environment's file: after REACH_REDIS_URL's rank, before the project file
    monkeypatch.setenv("REACH_REDIS_URL_FILE", str(url_file))
    loc = locate_redis_url(start=tmp_path)
    assert (loc.url, loc.source) == ("redis://fromfile:2/0", "REACH_REDIS_URL_FILE")
    assert resolve_redis_url("redis://given:1/0", start=tmp_path) == "redis://given:1/0"
    monkeypatch.setenv("REACH_REDIS_URL", "redis://env:1/0")
    with pytest.raises(ConfigError, match="unset one"):
        locate_redis_url(start=tmp_path)


def test_a_password_file_goes_into_the_url_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pw = secret(tmp_path, "pw", SECRET + "\n")
    url = resolve_redis_url("redis://app@h:1/0", password_file=pw)
    assert url == "redis://app:p%40ss%3Aw%2Frd%20with%20space@h:1/0"
    from urllib.parse import unquote, urlsplit

    assert unquote(urlsplit(url).password or "") == SECRET
    assert resolve_redis_url(url, password_file=pw) == url  # resolved twice: the same
    # from the environment, whatever step gave the URL (here a project file)
    write_project_url("rediss://h:2/0?ssl_ca_certs=/ca.pem", tmp_path / "reach.toml")
    monkeypatch.setenv("REACH_REDIS_PASSWORD_FILE", str(pw))
    loc = locate_redis_url(start=tmp_path)
    assert loc.url.startswith("rediss://:p%40ss") and loc.url.endswith("?ssl_ca_certs=/ca.pem")
    assert "password from REACH_REDIS_PASSWORD_FILE" in loc.source
    # Sentinel: the master's password, the sentinels' options kept
    url = resolve_redis_url("redis+sentinel://a:1,b:2/svc", password_file=pw)
    from reach.connection import parse_sentinel_url

    assert parse_sentinel_url(url).password == SECRET


def test_a_password_given_twice_or_a_bad_file_is_an_error_without_the_secret(
    tmp_path: Path,
) -> None:
    pw = secret(tmp_path, "pw", SECRET)
    for url in ("redis://:other@h:1/0", "redis://h:1/0?password=other"):
        with pytest.raises(ConfigError, match="keep one"):
            resolve_redis_url(url, password_file=pw)
    cases = {
        "missing": tmp_path / "nope",
        "empty": secret(tmp_path, "empty", "\n"),
        "two lines": secret(tmp_path, "two", f"{SECRET}\nsecond-line {SECRET}\n"),
        "not text": tmp_path / "bin",
    }
    cases["not text"].write_bytes(b"\xff\xfe" + SECRET.encode())
    for what, f in cases.items():
        with pytest.raises(ConfigError) as e:
            resolve_redis_url("redis://h:1/0", password_file=f)
        assert str(f) in str(e.value), what
        assert SECRET not in str(e.value) and "second-line" not in str(e.value), what
        with pytest.raises(ConfigError):
            resolve_redis_url(url_file=f)

"""reach.planes and the planes of reach.keys (issue 32, item 2): where the control plane's
URL comes from, and which keys belong to which plane."""

from __future__ import annotations

from pathlib import Path

import pytest

from reach.errors import ConfigError
from reach.keys import CONTROL, CONTROL_BUILDERS, DATA, LAYOUT, Keys, plane_of
from reach.planes import locate_registry_url, resolve_registry_url

DATA_URL = "redis://data:6379/0"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACH_REGISTRY_URL", raising=False)


def test_none_configured_is_one_redis_for_both(tmp_path: Path) -> None:
    assert resolve_registry_url(None, data_url=DATA_URL, start=tmp_path) is None


def test_the_order_is_explicit_then_environment_then_project_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "reach.toml").write_text(
        f'redis_url = "{DATA_URL}"\nregistry_url = "redis://from-file:6379/0"\n'
    )
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    assert locate_registry_url(None, start=sub) == (
        "redis://from-file:6379/0",
        str(tmp_path / "reach.toml"),
    )
    monkeypatch.setenv("REACH_REGISTRY_URL", "redis://from-env:6379/0")
    assert resolve_registry_url(None, data_url=DATA_URL, start=sub) == "redis://from-env:6379/0"
    assert (
        resolve_registry_url("redis://given:6379/0", data_url=DATA_URL, start=sub)
        == "redis://given:6379/0"
    )


def test_the_data_url_itself_is_no_split(tmp_path: Path) -> None:
    assert resolve_registry_url(DATA_URL, data_url=DATA_URL, start=tmp_path) is None


def test_the_nearest_project_file_decides(tmp_path: Path) -> None:
    (tmp_path / "reach.toml").write_text('registry_url = "redis://outer:6379/0"\n')
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "reach.toml").write_text(f'redis_url = "{DATA_URL}"\n')
    # the inner project names its Redis and no registry_url: one Redis, not the outer's
    assert resolve_registry_url(None, data_url=DATA_URL, start=inner) is None


def test_a_bad_registry_url_in_the_file_says_what_to_write(tmp_path: Path) -> None:
    (tmp_path / "reach.toml").write_text("registry_url = 5\n")
    with pytest.raises(ConfigError, match="registry_url must be a non-empty string"):
        resolve_registry_url(None, data_url=DATA_URL, start=tmp_path)


def test_every_control_builder_is_a_form_of_the_layout() -> None:
    assert CONTROL_BUILDERS <= {f.builder for f in LAYOUT}


def test_each_key_has_its_plane() -> None:
    k = Keys("prod", shards=16)
    control = [
        k.agents_of(3),
        k.agent("a1"),
        k.cap_of("x.y", 2),
        k.events,
        k.reroute_of(5),
        k.left_of(0),
        k.limits,
        k.rate_state("x.y"),
        k.agent_rate_state("x.y", "a1"),
        k.quotas,
        k.audit,
        k.access,
        k.send_rate_state("alice"),
        k.caller_rate_state("gateway", "bob"),
    ]
    data = [
        *k.inboxes("a1"),
        k.replies("c1"),
        k.idem("i1"),
        k.task("m1"),
        k.kept_chunks("i1"),
        k.delayed,
        k.scheduled,
        k.scheduled_envelopes,
        k.dlq("x.y"),
        k.parked("x.y"),
        k.parked_caps,
        k.cancels,
        k.recent,
        k.gateway_task("t1"),
        k.session("s1"),
        k.session_history("s1"),
        k.session_version("s1"),
    ]
    assert {key: plane_of(key, "prod") for key in control} == dict.fromkeys(control, CONTROL)
    assert {key: plane_of(key, "prod") for key in data} == dict.fromkeys(data, DATA)
    assert plane_of("reach:{prod}:unknown", "prod") is None

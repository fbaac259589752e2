"""The CLI with the control plane apart (reach.planes): ``--registry-url`` (and
``REACH_REGISTRY_URL``) on the shared options, the registry and quota commands reading and
writing the control plane's Redis, ``reach doctor`` checking both and naming each key's
plane."""

from __future__ import annotations

import json

import anyio
import pytest
from reach_cli.app import app
from typer.testing import CliRunner

from reach.connection import connect
from reach.embedded import RedisServer
from reach.keys import Keys
from reach.registry import Registry

runner = CliRunner()


def cli(url: str, ns: str, *args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, [*args, "--redis-url", url, "--namespace", ns])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture
def registered(registry_server: RedisServer, redis_url: str, ns: str) -> None:
    """An agent registered on the control plane's Redis, an inbox entry on the data one."""

    async def setup() -> None:
        control, data = await connect(registry_server.url), await connect(redis_url)
        try:
            await Registry(control, ns).register(
                "pc-1",
                instance_id="i1",
                version=1,
                ready=True,
                capabilities=["pc.echo"],
                lease_ms=60_000,
                evict_after_ms=120_000,
            )
            await data.xadd(Keys(ns).inbox("pc-1", "normal"), {"e": b"x"})
        finally:
            await control.aclose()
            await data.aclose()

    anyio.run(setup)


def test_registry_url_points_the_registry_commands_at_the_control_plane(
    registered: None, registry_server: RedisServer, redis_url: str, ns: str
) -> None:
    code, out, err = cli(redis_url, ns, "agents", "--json")
    assert code == 0, err
    assert json.loads(out) == []  # the data Redis holds no registry
    code, out, err = cli(redis_url, ns, "agents", "--json", "--registry-url", registry_server.url)
    assert code == 0, err
    assert [a["agent_id"] for a in json.loads(out)] == ["pc-1"]


def test_the_environment_names_it_too(
    registered: None,
    registry_server: RedisServer,
    redis_url: str,
    ns: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REACH_REGISTRY_URL", registry_server.url)
    code, _out, err = cli(redis_url, ns, "quota", "set", "--max-inbox", "7", "--json")
    assert code == 0, err

    async def stored() -> tuple[object, object]:
        control, data = await connect(registry_server.url), await connect(redis_url)
        try:
            k = Keys(ns).quotas
            return await control.hget(k, "max_inbox"), await data.exists(k)
        finally:
            await control.aclose()
            await data.aclose()

    assert anyio.run(stored) == (b"7", 0)


def test_a_version_split_is_the_control_planes(
    registered: None,
    registry_server: RedisServer,
    redis_url: str,
    ns: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """reach caps split writes the control plane's Redis (configuration, beside the
    registry whose agents' versions it shows); a Client reads it there (test_canary.py
    covers the routing)."""
    monkeypatch.setenv("REACH_REGISTRY_URL", registry_server.url)
    code, out, err = cli(redis_url, ns, "caps", "split", "pc.echo", "1.0=100", "--json")
    assert code == 0, err
    assert json.loads(out)["split"] == "1.0=100"

    async def stored() -> tuple[object, object]:
        control, data = await connect(registry_server.url), await connect(redis_url)
        try:
            k = Keys(ns).splits
            return await control.hget(k, "pc.echo"), await data.exists(k)
        finally:
            await control.aclose()
            await data.aclose()

    assert anyio.run(stored) == (b"1.0=100", 0)


def test_doctor_checks_both_redis_and_names_each_keys_plane(
    registered: None, registry_server: RedisServer, redis_url: str, ns: str
) -> None:
    code, out, err = cli(redis_url, ns, "doctor", "--json", "--registry-url", registry_server.url)
    assert code in (0, 1), err
    report = json.loads(out)
    assert report["registry_url"]
    planes = {f["check"]: f for f in report["findings"] if f["check"].endswith("planes")}
    assert planes["data plane: planes"]["level"] == "ok"
    assert "1 data" in planes["data plane: planes"]["message"]
    assert planes["control plane: planes"]["level"] == "ok"
    assert "control" in planes["control plane: planes"]["message"]
    assert {f["check"].split(":")[0] for f in report["findings"]} == {
        "data plane",
        "control plane",
    }


def test_doctor_warns_about_keys_on_the_wrong_plane(
    registered: None, registry_server: RedisServer, redis_url: str, ns: str
) -> None:
    async def stray() -> None:  # a process that did not know the split
        data = await connect(redis_url)
        try:
            await data.hset(Keys(ns).limits, "pc.echo", "5/1s,5")
        finally:
            await data.aclose()

    anyio.run(stray)
    _code, out, _err = cli(redis_url, ns, "doctor", "--json", "--registry-url", registry_server.url)
    found = [f for f in json.loads(out)["findings"] if f["check"] == "data plane: planes"]
    assert found[0]["level"] == "warning", found
    assert Keys(ns).limits in found[0]["message"] and "registry_url" in found[0]["fix"]

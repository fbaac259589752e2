"""`reach doctor --all-tenants`: a section per tenant of the map, each tenant's own Redis
checked (issue 32 item 1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

from reach.embedded import RedisServer, free_port
from tests.support.tenants import write_map

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def two_servers(server_binary) -> Iterator[tuple[RedisServer, RedisServer]]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary) as a, RedisServer(binary=server_binary) as b:
        yield a, b


async def cli(*args: str, code: int) -> str:
    res = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli_app, list(args)))
    assert res.exit_code == code, (args, res.exit_code, res.output)
    return res.stdout if code in (0, 1) else res.output


async def test_every_tenant_gets_a_section(
    two_servers: tuple[RedisServer, RedisServer],
    ns: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = two_servers
    write_map(tmp_path, {"acme": (a.url, f"{ns}-acme"), "beta": (b.url, f"{ns}-beta")})
    monkeypatch.chdir(tmp_path)
    out = json.loads(await cli("doctor", "--all-tenants", "--json", code=0))
    sections = {s["tenant"]: s for s in out["tenants"]}
    assert list(sections) == ["acme", "beta"]
    assert sections["acme"]["redis_url"] == a.url and sections["beta"]["redis_url"] == b.url
    assert sections["beta"]["namespace"] == f"{ns}-beta"
    for s in sections.values():
        assert {f["check"] for f in s["findings"]} >= {"version", "key scheme"}
        assert s["status"] != "error"
    text = await cli("doctor", "--all-tenants", code=0)
    assert "tenant acme" in text and "tenant beta" in text and f"'{ns}-beta'" in text
    # `--tenant` checks one of them, as --redis-url would
    one = json.loads(await cli("doctor", "--tenant", "beta", "--json", code=0))
    assert (one["redis_url"], one["namespace"]) == (b.url, f"{ns}-beta")


async def test_a_tenant_redis_down_is_its_section_s_error(
    two_servers: tuple[RedisServer, RedisServer],
    ns: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, _ = two_servers
    down_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    write_map(tmp_path, {"acme": (a.url, f"{ns}-acme"), "gone": (down_url, "gone")})
    monkeypatch.chdir(tmp_path)
    out = json.loads(await cli("doctor", "--all-tenants", "--json", code=1))
    sections = {s["tenant"]: s for s in out["tenants"]}
    assert out["status"] == "error"
    assert sections["acme"]["status"] != "error"
    assert sections["gone"]["status"] == "error"
    assert sections["gone"]["findings"][0]["check"] == "connection"


async def test_all_tenants_without_a_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = await cli("doctor", "--all-tenants", code=2)
    assert "no tenant map here" in out

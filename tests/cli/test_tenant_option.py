"""`--tenant` (and REACH_TENANT) on every command that talks to a namespace: the tenant
map in reach.toml gives the Redis URL and namespace (issue 32 item 1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

import reach
from reach.embedded import RedisServer
from tests.support.agents_messaging import wait_until
from tests.support.tenants import agents_on, where_am_i, write_map

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def two_servers(server_binary) -> Iterator[tuple[RedisServer, RedisServer]]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary) as a, RedisServer(binary=server_binary) as b:
        yield a, b


async def cli(*args: str, code: int = 0, env: dict[str, str] | None = None) -> str:
    res = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli_app, list(args), env=env))
    assert res.exit_code == code, (args, res.exit_code, res.output)
    return res.stdout if code == 0 else res.output


async def test_tenant_picks_the_redis_and_namespace(
    two_servers: tuple[RedisServer, RedisServer],
    ns: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = two_servers
    ns_a, ns_b = f"{ns}-acme", f"{ns}-beta"
    write_map(tmp_path, {"acme": (a.url, ns_a), "beta": (b.url, ns_b)})
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REACH_REDIS_URL", raising=False)
    async with (
        agents_on((where_am_i("A"), a.url, ns_a), (where_am_i("B"), b.url, ns_b)),
        reach.Client(redis_url=a.url, namespace=ns_a, tenants=reach.Tenants.load()) as client,
    ):
        sent = {t: await client.send("where", {"tenant": t}, tenant=t) for t in ("acme", "beta")}
        for t, msg_id in sent.items():
            await client.result(msg_id, tenant=t, timeout_s=20)

        async def listed(tenant: str) -> list[str] | None:
            out = json.loads(await cli("tasks", "--tenant", tenant, "--json"))
            ids = [m["msg_id"] for m in out["messages"]]
            return ids or None

        assert await wait_until(lambda: listed("acme"), what="acme's task") == [sent["acme"]]
        assert await wait_until(lambda: listed("beta"), what="beta's task") == [sent["beta"]]
        # REACH_TENANT does what --tenant does
        agents_b = await cli("agents", "--json", env={"REACH_TENANT": "beta"})
        assert "echo-B" in agents_b and "echo-A" not in agents_b
        agents_a = await cli("agents", "--tenant", "acme", "--json")
        assert "echo-A" in agents_a and "echo-B" not in agents_a
        # a --namespace that agrees is fine; one that does not is refused
        await cli("agents", "--tenant", "acme", "--namespace", ns_a, "--json")
        out = await cli("agents", "--tenant", "acme", "--namespace", "other", code=2)
        assert "give one" in out
        out = await cli("agents", "--tenant", "acme", "--redis-url", b.url, code=2)
        assert "not both" in out
        out = await cli("agents", "--tenant", "gamma", code=2)
        assert "Unknown tenant 'gamma'" in out and "acme, beta" in out


async def test_tenant_without_a_map_says_how_to_add_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = await cli("tasks", "--tenant", "acme", code=2)
    assert "no tenant map here" in out and "[tenants.acme]" in out

"""``reach mcp`` and tenants (issue 32 item 1): over HTTP ``--all-tenants`` picks each
request's tenant by its X-Reach-Tenant header; over stdio ``--tenant`` serves one. The
official MCP client; each tenant on a Redis server of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent

from reach.embedded import RedisServer, free_port
from tests.support.gateway import stop_process
from tests.support.tenants import agents_on, where_am_i, write_map
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio
TOKEN = "mcp-test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def two_servers(server_binary) -> Iterator[tuple[RedisServer, RedisServer]]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary) as a, RedisServer(binary=server_binary) as b:
        yield a, b


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}


def start(cmd: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(cmd, cwd=cwd, env=env(), stdin=subprocess.DEVNULL, stderr=err)


def answer(result: Any) -> dict[str, str]:
    [content] = result.content
    assert isinstance(content, TextContent)
    got: dict[str, str] = json.loads(content.text)
    return got


async def test_http_all_tenants_by_header(
    two_servers: tuple[RedisServer, RedisServer], ns: str, tmp_path: Path
) -> None:
    a, b = two_servers
    ns_a, ns_b = f"{ns}-acme", f"{ns}-beta"
    write_map(tmp_path, {"acme": (a.url, ns_a), "beta": (b.url, ns_b)})
    (tmp_path / "tokens.txt").write_text(f"model:{TOKEN}\n")
    port = free_port()
    log = tmp_path / "mcp.log"
    cmd = [sys.executable, "-m", "reach_cli.app", "mcp", "--all-tenants", "--port", str(port)]
    cmd += ["--token-file", "tokens.txt", "--poll-s", "0.1", "--log-level", "warning"]
    proc = start(cmd, tmp_path, log)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with agents_on((where_am_i("A"), a.url, ns_a), (where_am_i("B"), b.url, ns_b)):

            async def serving() -> bool:
                assert proc.poll() is None, log.read_text()
                return "serving http://" in log.read_text()

            await wait_until(serving, timeout_s=60, what="reach mcp serving")
            for tenant, label in (("acme", "A"), ("beta", "B")):
                headers = {"Authorization": f"Bearer {TOKEN}", "X-Reach-Tenant": tenant}
                http = httpx2.AsyncClient(headers=headers, timeout=30)
                async with http, Client(streamable_http_client(url, http_client=http)) as c:
                    assert [t.name for t in (await c.list_tools()).tools] == [
                        "where",
                        "where.chunks",
                    ]
                    got = answer(await c.call_tool("where", {"tenant": tenant}))
                    assert got == {"served_by": label, "tenant": tenant}
            async with httpx2.AsyncClient(timeout=30) as h:
                r = await h.post(url, headers={"X-Reach-Tenant": "gamma"}, json={})
                assert r.status_code == 404 and "acme" not in r.text
    finally:
        stop_process(proc)


async def test_stdio_serves_the_tenant_named(
    two_servers: tuple[RedisServer, RedisServer], ns: str, tmp_path: Path
) -> None:
    a, b = two_servers
    ns_a, ns_b = f"{ns}-acme", f"{ns}-beta"
    write_map(tmp_path, {"acme": (a.url, ns_a), "beta": (b.url, ns_b)})
    cmd = [sys.executable, "-m", "reach_cli.app", "mcp", "--stdio", "--tenant", "beta"]
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], cwd=str(tmp_path), env=env())
    async with (
        agents_on((where_am_i("A"), a.url, ns_a), (where_am_i("B"), b.url, ns_b)),
        Client(params) as c,
    ):
        got = answer(await c.call_tool("where", {"tenant": "beta"}))
        assert got == {"served_by": "B", "tenant": "beta"}

"""reach.mcp.remote: an outside MCP server (tests/support/mcp_server.py, written with the
official SDK and knowing nothing of reach) becomes a reach capability provider; reach
callers reach its tools by capability with ``request`` and ``stream``, over stdio (the
server a child of the proxy) and streamable HTTP, and ``reach mcp-proxy`` does it as a
process of its own (docs/mcp.md, *Outside MCP servers as capabilities*)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reach.client import Client
from reach.errors import ConfigError, Rejected, RemoteError
from reach.mcp import RemoteMCPError, capability_of, remote
from reach.schemas import capability_schemas
from tests.support.agents_messaging import serving, wait_eligible
from tests.support.gateway import gateway_served_app, stop_process
from tests.support.mcp_server import server
from tests.support.workers import FAST, ROOT

pytestmark = pytest.mark.anyio

STDIO = [sys.executable, "-m", "tests.support.mcp_server"]


@pytest.fixture(params=["stdio", "http"])
async def target(request: pytest.FixtureRequest) -> AsyncIterator[str | list[str]]:
    if request.param == "stdio":
        yield STDIO
        return
    async with gateway_served_app(lambda base: server().streamable_http_app()) as url:
        yield f"{url}/mcp"


def test_capability_names_of_tools() -> None:
    assert capability_of("weather.today") == "weather.today"
    assert capability_of("get_weather") == "get_weather"
    assert capability_of("Shout-It") == "shout.it"
    with pytest.raises(ConfigError, match="gives no capability"):
        capability_of("!!!")


async def test_a_reach_request_reaches_a_tool_of_an_mcp_server(
    target: str | list[str], redis_url: str, ns: str
) -> None:
    proxy = (
        await remote(target, cwd=str(ROOT)) if isinstance(target, list) else await remote(target)
    )
    assert proxy.agent_id == "mcp-outside-tools"
    assert proxy.capabilities == ["add", "shout.it", "count", "broken"]
    async with serving(redis_url, ns, proxy) as client:
        # a structured result as it is; a text result as the text
        assert await client.request("add", {"a": 2, "b": 40}) == {"total": 42}
        assert await client.request("shout.it", {"text": "hi"}) == {"result": "HI"}
        # the tools' schemas are the capabilities' schemas
        schemas = capability_schemas(await client.registry.agents("add"), "add")
        assert schemas["input"]["required"] == ["a", "b"]
        assert schemas["output"]["properties"]["total"]["type"] == "integer"
        # progress notifications are chunks
        stream = client.stream("count", {"n": 3})
        async with stream:
            chunks = [c async for c in stream]
        assert [c["message"] for c in chunks] == ["step 1", "step 2", "step 3"]
        assert stream.result == {"result": "counted to 3"}
        # a tool error is a refusal (no retry); arguments that are not an object too
        with pytest.raises(Rejected, match="MCP tool 'broken' said: Error executing tool broken"):
            await client.request("broken", {"text": "x"})
        with pytest.raises(Rejected, match="JSON object of arguments"):
            await client.request("add", [1, 2])
        # arguments the tool's own validation refuses: its error, as a refusal
        with pytest.raises((Rejected, RemoteError)):
            await client.request("add", {"a": "x"}, timeout_s=10)


async def test_capabilities_name_tools(redis_url: str, ns: str) -> None:
    proxy = await remote(STDIO, capabilities={"math.add": "add"}, agent_id="m-1", cwd=str(ROOT))
    assert (proxy.agent_id, proxy.capabilities) == ("m-1", ["math.add"])
    async with serving(redis_url, ns, proxy) as client:
        assert await client.request("math.add", {"a": 1, "b": 1}) == {"total": 2}
    with pytest.raises(ConfigError, match="no tool 'nope'"):
        await remote(STDIO, capabilities={"x.y": "nope"}, cwd=str(ROOT))
    with pytest.raises(ConfigError, match="give no capability 'x.y'"):
        await remote(STDIO, capabilities=["x.y"], cwd=str(ROOT))
    with pytest.raises(RemoteMCPError, match="could not be reached"):
        await remote("http://127.0.0.1:9/mcp", timeout_s=2)


async def test_reach_mcp_proxy_process(redis_url: str, ns: str, tmp_path: Path) -> None:
    """``reach mcp-proxy -- COMMAND``: the proxy as a process of its own (a worker)."""
    log = tmp_path / "proxy.log"
    cmd = [sys.executable, "-m", "reach_cli.app", "mcp-proxy", "--redis-url", redis_url,
           "--namespace", ns, "--agent-id", "proxy-1", "--cap", "add", *FAST[:6],
           "--log-level", "warning", "--", *STDIO]  # fmt: skip
    with open(log, "wb") as err:  # noqa: ASYNC230 - a local file, before the process
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=err)  # noqa: ASYNC220
    try:
        async with Client(redis_url=redis_url, namespace=ns) as client:
            await wait_eligible(client, "add", ["proxy-1"], timeout=60)
            assert await client.request("add", {"a": 3, "b": 4}) == {"total": 7}
    finally:
        assert stop_process(proc) == 0, log.read_text()
    assert "reach mcp-proxy: proxy-1 serving add" in log.read_text()

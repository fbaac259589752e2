"""McpFace in this process (the SDK's client connected to its server in-process, agents
served here): ``where=`` offers only the matching agents' capabilities and routes calls to
them only; an unknown tool is a tool error naming the tools (docs/mcp.md)."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client
from mcp_types import TextContent

from reach import Agent, Context
from reach.client import Client as ReachClient
from reach.mcp import McpFace
from tests.support.agents_messaging import serving

pytestmark = pytest.mark.anyio


def _agent(agent_id: str, region: str, caps: list[str]) -> Agent:
    app = Agent(agent_id, capabilities=caps, metadata={"region": region})
    for cap in caps:

        @app.handler(cap)
        async def who(payload: Any, ctx: Context) -> str:
            return ctx.agent_id

    return app


async def test_where_filters_tools_and_calls(redis_url: str, ns: str) -> None:
    eu = _agent("geo-eu-1", "eu", ["geo.who", "geo.eu_only"])
    us = _agent("geo-us-1", "us", ["geo.who", "geo.us_only"])
    async with serving(redis_url, ns, eu, us):
        face = McpFace(ReachClient(redis_url=redis_url, namespace=ns), where={"region": "eu"})
        async with face.running(), Client(face.server) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert names == {"geo.who", "geo.eu_only"}
            for _ in range(6):  # routed to the eu agent only
                res = await c.call_tool("geo.who", {})
                assert not res.is_error
                [content] = res.content
                assert isinstance(content, TextContent) and content.text == "geo-eu-1"
            res = await c.call_tool("geo.us_only", {})
            assert res.is_error
            [content] = res.content
            assert isinstance(content, TextContent)
            assert "No tool 'geo.us_only'" in content.text and "geo.eu_only" in content.text


async def test_capabilities_filter(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, _agent("geo-eu-2", "eu", ["geo.a", "geo.b"])):
        face = McpFace(ReachClient(redis_url=redis_url, namespace=ns), capabilities=["Geo.B"])
        async with face.running(), Client(face.server) as c:
            assert [t.name for t in (await c.list_tools()).tools] == ["geo.b"]

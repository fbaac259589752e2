"""A small MCP server written with the official SDK (its ``MCPServer``), knowing nothing of
reach: what tests/integration/test_mcp_remote.py reaches through ``reach.mcp.remote``.
``python -m tests.support.mcp_server`` serves it over stdio; :func:`server` is the server
(for streamable HTTP in-process)."""

from __future__ import annotations

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel


class Total(BaseModel):
    total: int


def server() -> MCPServer:
    mcp = MCPServer("Outside Tools")

    @mcp.tool(description="Adds two integers.")
    def add(a: int, b: int) -> Total:
        return Total(total=a + b)

    @mcp.tool(name="Shout-It", description="Upper-cases a text.")
    def shout(text: str) -> str:
        return text.upper()

    @mcp.tool(description="Counts to n, reporting each step as progress.")
    async def count(n: int, ctx: Context) -> str:
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"step {i}")
            await anyio.sleep(0.01)
        return f"counted to {n}"

    @mcp.tool(description="Always fails.")
    def broken(text: str) -> str:
        raise ValueError(f"cannot do {text!r}")

    return mcp


if __name__ == "__main__":
    server().run("stdio")

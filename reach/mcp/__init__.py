"""MCP both ways (``pip install 'reach-fabric[mcp]'``; docs/mcp.md): the capabilities of a
namespace as MCP tools (:class:`McpFace`, ``reach mcp``), and an outside MCP server's
tools as reach capabilities (:func:`remote`, ``reach mcp-proxy``).

Not imported by ``import reach``: it needs the ``mcp`` extra (the official ``mcp`` SDK).
"""

from __future__ import annotations

from .remote import RemoteMCPError, capability_of, proxy_agent, remote
from .server import CALLER_HEADER, TOKENS_ENV, BearerAuth, McpFace

__all__ = [
    "CALLER_HEADER",
    "TOKENS_ENV",
    "BearerAuth",
    "McpFace",
    "RemoteMCPError",
    "capability_of",
    "proxy_agent",
    "remote",
]

"""Outside MCP servers as reach capability providers: :func:`remote` (docs/mcp.md,
*Outside MCP servers as capabilities*; the ``mcp`` extra).

``agent = await reach.mcp.remote(["npx", "some-mcp-server"])`` (a command: the server
runs as a child over stdio) or ``await reach.mcp.remote("https://host/mcp", token=...)``
(streamable HTTP) lists the server's tools with the official SDK's client and returns a
:class:`reach.Agent` (a proxy, not started) with one capability per tool (or those named
by ``capabilities``); run it like any agent and reach callers reach the tools by
capability, with reach's routing, deadlines, retries and idempotency in front of them.

* A tool ``name`` becomes the capability of that name when it is one (``weather.today``),
  else its words joined by dots (``get_weather`` stays, ``Get Weather`` is
  ``get.weather``); ``capabilities={"weather.today": "get_weather"}`` names them.
* The tool's ``inputSchema`` and ``outputSchema`` are published as the capability's
  schemas (:mod:`reach.schemas`), so ``reach caps show`` and ``reach mcp`` show them.
* A message's payload (a JSON object) is the call's ``arguments``; its result is the
  tool's ``structuredContent`` when it gives one, else its content: one text item as the
  text, several items as a list (text items as text, others as their JSON objects).
* The tool's progress notifications are chunks (``ctx.emit``: ``{"progress", "total",
  "message"}``), which ``Client.stream`` callers see as they come.
* A result with ``isError`` is a refusal (:class:`reach.Reject`, no retry: the tool
  looked at the arguments and said no); a protocol error, a server that cannot be
  reached or that died raises :class:`RemoteMCPError`, which reach retries as any
  handler error (the connection is opened again for the next message).
* A cancelled reach message (``client.cancel``, its deadline) cancels the tool call (the
  SDK tells the server with ``notifications/cancelled``).

The proxy holds one MCP connection (one child process over stdio), opened at its first
message and shared by the messages it runs at once, closed when the agent stops.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any

import anyio
import httpx2
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent, Tool

from ..agent import Agent
from ..context import Context
from ..envelope import new_id
from ..errors import ConfigError, Reject
from ..hooks import Hooks, WorkerInfo
from ..registry import normalize_capability

log = logging.getLogger("reach.mcp.remote")

__all__ = ["RemoteMCPError", "capability_of", "proxy_agent", "remote"]

Target = str | Sequence[str]
"""A URL (``http://``/``https://``: streamable HTTP) or a command (a string, split as a
shell would, or its argument list: a stdio server)."""


class RemoteMCPError(Exception):
    """The outside MCP server could not be reached, died, or answered with a protocol
    error (raised in the proxy's handler: reach retries it up to the message's max
    attempts, then dead-letters it)."""


def capability_of(tool_name: str) -> str:
    """The capability a tool's name gives: the name when it is a capability name, else
    its words (letters and digits) joined by dots."""
    try:
        return normalize_capability(tool_name)
    except ConfigError:
        words = re.findall(r"[a-z0-9_]+", tool_name.lower())
        if not words:
            raise ConfigError(
                f"MCP tool {tool_name!r} gives no capability name: name its capability with "
                "capabilities={'my.capability': tool_name}."
            ) from None
        return normalize_capability(".".join(words))


def _is_url(target: Target) -> bool:
    return isinstance(target, str) and target.startswith(("http://", "https://"))


def _argv(target: Target) -> list[str]:
    argv = shlex.split(target) if isinstance(target, str) else list(target)
    if not argv:
        raise ConfigError("An MCP server command is empty: give the command and its arguments.")
    return argv


def _show(target: Target) -> str:
    return target if isinstance(target, str) else shlex.join(target)


class _Connection:
    """How to open the MCP client of one server (its HTTP headers, its child's env)."""

    def __init__(
        self,
        target: Target,
        *,
        headers: Mapping[str, str] | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout_s: float,
    ) -> None:
        self.target, self.timeout_s = target, timeout_s
        self.headers, self.env, self.cwd = dict(headers or {}), env, cwd

    def open(self) -> AbstractAsyncContextManager[McpClient]:
        if _is_url(self.target):
            assert isinstance(self.target, str)
            http = httpx2.AsyncClient(headers=self.headers, timeout=self.timeout_s)
            return _closing(http, McpClient(streamable_http_client(self.target, http_client=http)))
        argv = _argv(self.target)
        params = StdioServerParameters(
            command=argv[0],
            args=argv[1:],
            env=dict(self.env) if self.env is not None else None,
            cwd=self.cwd,
        )
        return McpClient(params)


class _closing(AbstractAsyncContextManager[McpClient]):
    """The MCP client, then its HTTP client closed after it."""

    def __init__(self, http: httpx2.AsyncClient, client: McpClient) -> None:
        self.http, self.client = http, client

    async def __aenter__(self) -> McpClient:
        await self.http.__aenter__()
        try:
            return await self.client.__aenter__()
        except BaseException:
            await self.http.__aexit__(None, None, None)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.client.__aexit__(exc_type, exc, tb)
        finally:
            await self.http.__aexit__(None, None, None)


class _Remote(Hooks):
    """The MCP connection of one proxy: opened by a task of its own (the SDK's client
    lives in the task that entered it) at the first message, shared by the messages the
    agent runs at once, opened again after it broke, closed when the agent stops."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self._client: McpClient | None = None
        self._lock: anyio.Lock | None = None
        self._stop: anyio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def _client_now(self) -> McpClient:
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._client is not None and self._task is not None and not self._task.done():
                return self._client
            ready: asyncio.Future[McpClient] = asyncio.get_running_loop().create_future()
            self._stop = anyio.Event()
            self._task = asyncio.get_running_loop().create_task(self._hold(ready, self._stop))
            try:
                self._client = await ready
            except Exception as e:
                raise RemoteMCPError(
                    f"MCP server {_show(self.conn.target)} could not be reached: {_cause(e)}"
                ) from e
            return self._client

    async def _hold(self, ready: asyncio.Future[McpClient], stop: anyio.Event) -> None:
        try:
            async with self.conn.open() as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))
            elif not isinstance(e, asyncio.CancelledError):
                log.warning("MCP server %s: the connection ended: %s", _show(self.conn.target), e)
            if not isinstance(e, Exception):
                raise
        finally:
            self._client = None

    def _broken(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def on_stop(self, worker: WorkerInfo) -> None:
        self._broken()

    async def aclose(self) -> None:
        """Close the connection (the agent's stop does it too)."""
        self._broken()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def call(self, tool: str, payload: Any, ctx: Context) -> Any:
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise Reject(
                f"MCP tool {tool!r} takes a JSON object of arguments, not {type(payload).__name__}."
            )
        client = await self._client_now()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            await ctx.emit({"progress": progress, "total": total, "message": message})

        try:
            result = await client.call_tool(tool, payload, progress_callback=on_progress)
        except MCPError as e:
            raise RemoteMCPError(f"MCP server {_show(self.conn.target)}: {e}") from e
        except (
            OSError,
            httpx2.HTTPError,
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
        ) as e:
            self._broken()
            raise RemoteMCPError(
                f"MCP server {_show(self.conn.target)} went away: {type(e).__name__}: {e}"
            ) from e
        if result.is_error:
            raise Reject(f"MCP tool {tool!r} said: {_text(result)}".rstrip(": "))
        return value_of(result)


def _cause(e: BaseException) -> str:
    """The first error inside exception groups, as text."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


def _text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def value_of(result: CallToolResult) -> Any:
    """A tool result as a reach result (see the module docstring)."""
    if result.structured_content is not None:
        return result.structured_content
    values = [
        c.text
        if isinstance(c, TextContent)
        else c.model_dump(by_alias=True, mode="json", exclude_none=True)
        for c in result.content
    ]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _chosen(
    tools: Sequence[Tool], capabilities: Sequence[str] | Mapping[str, str] | None
) -> dict[str, Tool]:
    """capability -> tool, as ``capabilities`` names them (None: every tool)."""
    by_name = {t.name: t for t in tools}
    if isinstance(capabilities, Mapping):
        out: dict[str, Tool] = {}
        for cap, name in capabilities.items():
            if name not in by_name:
                raise ConfigError(
                    f"The MCP server has no tool {name!r} (it has {', '.join(by_name) or 'none'})."
                )
            out[normalize_capability(cap)] = by_name[name]
        return out
    derived: dict[str, Tool] = {}
    for t in tools:
        derived.setdefault(capability_of(t.name), t)
    if capabilities is None:
        return derived
    wanted = [normalize_capability(c) for c in capabilities]
    missing = [c for c in wanted if c not in derived]
    if missing:
        raise ConfigError(
            f"The MCP server's tools give no capability {', '.join(map(repr, missing))} "
            f"(they give {', '.join(derived) or 'none'}); map them with "
            "capabilities={'my.capability': 'tool_name'}."
        )
    return {c: derived[c] for c in wanted}


def proxy_agent(
    target: Target,
    tools: Sequence[Tool],
    *,
    capabilities: Sequence[str] | Mapping[str, str] | None = None,
    agent_id: str | None = None,
    server_name: str = "",
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_s: float = 60.0,
) -> Agent:
    """A reach agent forwarding its capabilities to the MCP server ``target``'s
    ``tools`` (as :func:`remote` lists them), without connecting (a ``reach worker``
    factory may call it with tools it knows)."""
    chosen = _chosen(tools, capabilities)
    if not chosen:
        raise ConfigError(f"The MCP server {_show(target)} offers no tool to serve.")
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    remote_ = _Remote(_Connection(target, headers=hdrs, env=env, cwd=cwd, timeout_s=timeout_s))
    words = re.findall(r"[a-z0-9]+", (server_name or "server").lower())
    app = Agent(
        agent_id or f"mcp-{'-'.join(words)[:60] or new_id()}",
        capabilities=list(chosen),
        metadata={"mcp_server": _show(target) if _is_url(target) else _argv(target)[0]},
        card={
            "description": f"The MCP server {server_name or _show(target)}, through reach.",
            "skills": [
                {
                    "id": cap,
                    "name": t.title or t.name,
                    "description": t.description or f"The MCP tool {t.name!r}.",
                    "tags": [cap, "mcp"],
                }
                for cap, t in chosen.items()
            ],
        },
        hooks=[remote_],
    )
    for cap, tool in chosen.items():

        async def forward(payload: Any, ctx: Context, _tool: str = tool.name) -> Any:
            return await remote_.call(_tool, payload, ctx)

        app.handler(cap)(forward)
        schemas = {"input": dict(tool.input_schema)}
        if tool.output_schema:
            schemas["output"] = dict(tool.output_schema)
        app.publish_schemas(cap, schemas)
    return app


async def remote(
    target: Target,
    *,
    capabilities: Sequence[str] | Mapping[str, str] | None = None,
    agent_id: str | None = None,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_s: float = 60.0,
) -> Agent:
    """List the tools of the MCP server ``target`` (a URL, or a command to run over
    stdio) and return a reach agent (not started) serving them as capabilities (or those
    ``capabilities`` names: a list of capabilities, or ``{capability: tool_name}``): see
    the module docstring. ``token``: sent as ``Authorization: Bearer`` (HTTP); ``env``,
    ``cwd``: the child's (stdio; None: the SDK's default environment); ``timeout_s``: per
    HTTP request."""
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    conn = _Connection(target, headers=hdrs, env=env, cwd=cwd, timeout_s=timeout_s)
    name = ""
    try:
        async with conn.open() as c:
            info = c.server_info
            name = info.name if info is not None else ""
            tools: list[Tool] = []
            cursor: str | None = None
            while True:
                page = await c.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
    except Exception as e:
        raise RemoteMCPError(f"MCP server {_show(target)} could not be reached: {_cause(e)}") from e
    return proxy_agent(
        target,
        tools,
        capabilities=capabilities,
        agent_id=agent_id,
        server_name=name,
        token=token,
        headers=headers,
        env=env,
        cwd=cwd,
        timeout_s=timeout_s,
    )

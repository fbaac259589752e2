"""The MCP face: every capability of a namespace as an MCP tool, on the official SDK's
low-level server, over stdio or streamable HTTP (docs/mcp.md).

:class:`McpFace` holds one SDK :class:`~mcp.server.lowlevel.Server` and one reach
:class:`~reach.Client`:

* ``tools/list`` answers the tools of the capabilities live agents declare (or those
  named, or whose agents match ``where``), each with its schemas
  (:func:`reach.mcp.mapping.tool_of`). The list is read from the registry when the face
  starts and again whenever a registry event says something changed (an agent came,
  left, was evicted); when the tools differ, every client is told: a
  ``notifications/tools/list_changed`` on each handshake-era connection, a
  ``ToolsListChanged`` event on each 2026-era ``subscriptions/listen`` stream.
* ``tools/call`` is a reach streamed request of the tool's capability (its deadline the
  capability's advertised timeout, else the client's ``default_timeout_s``), in a reach
  session of its own per MCP connection (an HTTP session, the stdio process); each chunk
  is a progress notification; a cancelled call (``notifications/cancelled``, a client
  gone) cancels the reach message (the handler sees ``ctx.cancelled``); a reach error is
  a tool result with ``isError``.
* Over HTTP, every request needs ``Authorization: Bearer TOKEN`` when tokens are given
  (or a JWT, with a verifier), and the IP lists and the rate per caller apply
  (:class:`reach._access.Access`); the token's name (the JWT's caller claim) goes with
  each message in the ``mcp-caller`` header. The client signs what it sends when signing is configured (its own identity).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.types import ASGIApp, Scope

from .._access import Access, Authenticator, IpRules, redis_take
from .._jwt import JwtVerifier
from .._tokens import Tokens
from .._version import __version__
from ..client import Client
from ..envelope import new_id
from ..errors import ConfigError, ReachError
from ..limits import RateLimit
from ..registry import normalize_capability
from .mapping import ToolSpec, error_of, payload_of, progress_message, result_of, tool_of
from .mapping import unknown_tool as unknown_tool_result

__all__ = ["CALLER_HEADER", "TOKENS_ENV", "BearerAuth", "McpFace"]

log = logging.getLogger("reach.mcp")

CALLER_HEADER = "mcp-caller"
"""The header each message the face sends carries: the name of the token its MCP client
authenticated with (HTTP only)."""
TOKENS_ENV = "REACH_MCP_TOKENS"
"""Where ``reach mcp`` reads tokens besides ``--token-file`` (comma-separated)."""
CANCEL_WAIT_S = 5.0
"""How long a cancelled call waits for the reach cancel to be written (shielded)."""


class _Server(Server[Any]):
    """The SDK's server, saying in every handshake (stdio's and HTTP's) that its tool list
    changes (the HTTP session manager asks for the default options)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


def _connection(ctx: ServerRequestContext[Any, Any]) -> Connection:
    # The SDK hands handlers a per-request session over the per-client Connection (its
    # state, teardown and standalone channel); the connection itself is not public yet.
    conn: Connection = ctx.session._connection
    return conn


class McpFace:
    """The MCP face of one namespace (see the module docstring).

    ``client`` (not started: :meth:`running` starts and closes it) sends the calls with
    its own signing and its ``default_timeout_s`` for capabilities that advertise no
    timeout. ``capabilities``: only these become tools (None: every one); ``where``: only
    agents whose metadata match (as ``reach agents --where``), and calls go to them only.
    ``poll_s``: how often the registry's events are read for changes to the tool list.
    """

    def __init__(
        self,
        client: Client,
        *,
        capabilities: Collection[str] | None = None,
        where: Mapping[str, Any] | None = None,
        poll_s: float = 0.5,
        name: str = "reach",
    ) -> None:
        if not poll_s > 0:
            raise ConfigError(f"poll_s must be a number of seconds > 0, not {poll_s}.")
        self.client = client
        self.namespace = client.namespace
        self.capabilities = (
            {normalize_capability(c) for c in capabilities} if capabilities is not None else None
        )
        self.where = dict(where) if where else None
        self.poll_s = poll_s
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)
        self.server = _Server(
            name,
            version=__version__,
            instructions=(
                f"The capabilities of the reach namespace {self.namespace!r}: each tool is "
                "a capability, served by whichever of its agents reach routes the call to."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self.listen,
        )
        self.server.middleware.append(self._track)
        self._tools: dict[str, ToolSpec] = {}
        self._connections: set[Connection] = set()  # handshake-era ones, told of changes
        self._stdio_session: str | None = None
        self.changes = 0
        """How many times the tool list changed since the face started."""

    # -- the tool list -------------------------------------------------------------------
    async def load(self) -> dict[str, ToolSpec]:
        """The tools as the registry says now."""
        agents = [
            a
            for a in await self.client.registry.agents()
            if a.state != "evicted" and a.matches(self.where)
        ]
        caps = sorted({c for a in agents for c in a.capabilities})
        if self.capabilities is not None:
            caps = [c for c in caps if c in self.capabilities]
        default = self.client.default_timeout_s
        return {c: tool_of(c, agents, default) for c in caps}

    @property
    def tools(self) -> dict[str, ToolSpec]:
        """The tools offered now (as last read)."""
        return self._tools

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=[s.tool for s in self._tools.values()])

    async def _last_event(self) -> str:
        last = "-"
        while True:
            got = await self.client.registry.events(after=last, count=1000)
            if not got:
                return last
            last = got[-1].id

    async def _watch(self, last: str) -> None:
        """Re-read the tools whenever registry events after ``last`` come; tell the
        clients of a change."""
        while True:
            await anyio.sleep(self.poll_s)
            try:
                got = await self.client.registry.events(after=last, count=1000)
                if not got:
                    continue
                last = got[-1].id
                tools = await self.load()
            except Exception as e:  # noqa: BLE001 - Redis away: the tools stay as they were
                log.warning("mcp: could not read the registry (%s); will retry", e)
                continue
            if _fingerprint(tools) != _fingerprint(self._tools):
                self._tools = tools
                self.changes += 1
                await self._tell()

    async def _tell(self) -> None:
        await self.bus.publish(ToolsListChanged())
        for conn in list(self._connections):
            if not conn.initialized.is_set():
                continue
            try:
                await conn.outbound.notify("notifications/tools/list_changed", None)
            except Exception as e:  # noqa: BLE001 - a client gone: forget it
                log.debug("mcp: a client could not be told of the tool list (%s)", e)
                self._connections.discard(conn)

    async def _track(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Middleware: remember each handshake-era connection (its standalone channel
        carries list-changed notifications) until it closes."""
        conn = _connection(ctx)
        if conn not in self._connections and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._connections.add(conn)
            conn.exit_stack.callback(self._connections.discard, conn)
        return await call_next(ctx)

    # -- a call --------------------------------------------------------------------------
    def _session_of(self, ctx: ServerRequestContext[Any, Any]) -> str:
        """The reach session of the MCP client the call came from: over stdio, the one
        client of the process; over HTTP, its MCP session (``Mcp-Session-Id``, a
        handshake-era client's); a 2026-era HTTP call, which has no session, one of its
        own."""
        if self._stdio_session is not None:
            return self._stdio_session
        conn = _connection(ctx)
        sid = conn.state.get("reach.session_id")
        if not isinstance(sid, str):
            sid = f"mcp-{conn.session_id}" if conn.session_id else f"mcp-{new_id()}"
            conn.state["reach.session_id"] = sid
        return sid

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CallToolResult:
        spec = self._tools.get(params.name)
        if spec is None:
            return unknown_tool_result(params.name, self._tools)
        try:
            payload = payload_of(spec, params.arguments)
        except ConfigError as e:
            return error_of(e)
        caller = _caller(ctx)
        stream = self.client.stream(
            spec.tool.name,
            payload,
            where=self.where,
            session_id=self._session_of(ctx),
            headers={CALLER_HEADER: caller} if caller else None,
        )
        chunks = 0
        try:
            async with stream:
                async for chunk in stream:
                    chunks += 1
                    await ctx.session.report_progress(chunks, None, progress_message(chunk))
            return result_of(spec, stream.result)
        except ReachError as e:
            return error_of(e, stream.msg_id)
        except anyio.get_cancelled_exc_class():
            # The MCP client cancelled the call (or went away): so is the reach message,
            # whose handler then sees ctx.cancelled.
            with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT_S):
                try:
                    await self.client.cancel(stream.msg_id, by="mcp")
                except ReachError as e:
                    log.warning("mcp: could not cancel msg %s: %s", stream.msg_id, e)
            raise

    # -- serving -------------------------------------------------------------------------
    @asynccontextmanager
    async def running(self) -> AsyncIterator[McpFace]:
        """The client started, the tools read, the registry watched; all closed after."""
        async with self.client, anyio.create_task_group() as tg:
            last = await self._last_event()  # first: a change while the tools load is seen
            self._tools = await self.load()
            tg.start_soon(self._watch, last)
            try:
                yield self
            finally:
                self.listen.close()
                tg.cancel_scope.cancel()

    async def serve_stdio(self) -> None:
        """Serve one MCP client on this process's stdin and stdout until it closes them."""
        self._stdio_session = f"mcp-{new_id()}"
        async with self.running(), stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())

    def http_app(
        self,
        *,
        tokens: Tokens | None = None,
        host: str = "127.0.0.1",
        path: str = "/mcp",
        jwt: JwtVerifier | None = None,
        rate_per_caller: RateLimit | None = None,
        ips: IpRules | None = None,
    ) -> Starlette:
        """The streamable HTTP application (the MCP endpoint at ``path``); its lifespan
        runs the face. ``tokens``: required of every request (None: no authentication).
        ``host``: where it listens (on loopback, the SDK's DNS-rebinding protection is
        on: only loopback Host and Origin headers are taken). ``jwt``, ``rate_per_caller``,
        ``ips``: JWT bearer tokens beside ``tokens``, each caller's rate (429), the IP
        lists (403), as the A2A gateway has them (docs/a2a.md, *Identity*)."""
        app = self.server.streamable_http_app(streamable_http_path=path, host=host)
        sessions = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(a: Starlette) -> AsyncIterator[None]:
            async with self.running(), sessions(a):
                yield

        app.router.lifespan_context = lifespan
        auth = None
        if tokens is not None or jwt is not None:
            auth = Authenticator(tokens, jwt)
        take = None
        if rate_per_caller is not None:
            take = redis_take(
                lambda: self.client.control, self.client.namespace, "mcp", rate_per_caller
            )
        if auth is not None or take is not None or (ips is not None and ips.active):
            app.add_middleware(
                Access,
                realm="reach mcp",
                ips=ips,
                auth=auth,
                take=take,
                open_methods=(),
                mark=_mark,
            )
        return app


def _fingerprint(tools: Mapping[str, ToolSpec]) -> list[str]:
    return [s.tool.model_dump_json() for _, s in sorted(tools.items())]


def _caller(ctx: ServerRequestContext[Any, Any]) -> str:
    scope = getattr(ctx.request, "scope", None)
    name = scope.get(SCOPE_CALLER) if isinstance(scope, dict) else None
    return name if isinstance(name, str) else ""


SCOPE_CALLER = "reach.mcp.caller"


class BearerAuth(Access):
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer TOKEN`` with a
    token of ``tokens`` (the MCP endpoint's GET stream and DELETE too); the token's name
    is the caller (``mcp-caller`` on the fabric). (:meth:`McpFace.http_app` puts
    :class:`reach._access.Access` in front, which also takes JWTs, limits each caller's
    rate and holds the IP lists.)"""

    def __init__(self, app: ASGIApp, *, tokens: Tokens) -> None:
        super().__init__(
            app, realm="reach mcp", auth=Authenticator(tokens), open_methods=(), mark=_mark
        )


def _mark(scope: Scope, caller: str) -> None:
    scope[SCOPE_CALLER] = caller

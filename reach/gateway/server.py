"""The A2A gateway: every capability and every live agent of a namespace as an A2A server,
on the ``a2a-sdk`` server components (docs/a2a.md, *The gateway*).

One Starlette application holds:

* ``GET /.well-known/agent-card.json``: the gateway's own card, listing the capabilities
  (as skills) and the URLs of the capability and agent servers;
* ``/caps/<capability>``: an A2A server (JSON-RPC, SSE streaming) whose messages go to
  the capability, routed by reach's policies, with its card at
  ``/caps/<capability>/.well-known/agent-card.json``;
* ``/agents/<agent_id>``: the same for one agent (the message goes to that agent only);
* ``/``: messages naming their capability in ``metadata.capability``.

The JSON-RPC endpoints are the SDK's (``create_jsonrpc_routes``, v1.0 method names and the
v0.3 ones such as ``message/send``), with its ``DefaultRequestHandler`` (its task life
cycle, SSE streaming, history) over the Redis task store every gateway process of the
namespace shares (:mod:`reach.gateway.store`) and an :class:`AgentExecutor`
that sends each message as a reach streamed request: the A2A task id is the reach msg_id,
the context id the session_id. Cards are generated per request from the registry (the
view of the capability, which registry events keep current, or the agent's record), so
they follow agents as they come and go.

The parts: :mod:`reach.gateway.executor` (a message as a reach streamed request),
:mod:`reach.gateway.handler` (the JSON-RPC methods), :mod:`reach.gateway.cards` (the
cards); here, :class:`Gateway` puts them in one application behind its limits and
authentication (:class:`reach._access.Access`: tokens, JWTs, rate per caller, IP lists),
and routes each message to its capability or agent.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import anyio
import msgspec
from a2a.server.agent_execution import SimpleRequestContextBuilder
from a2a.server.routes import create_jsonrpc_routes
from a2a.types.a2a_pb2 import Artifact, Message, Part, Role, Task, TaskStatus
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Scope

from .._access import Access, Authenticator, IpRules, redis_take
from .._http import BodyLimit, SendTimeout
from .._jwt import JwtVerifier
from ..client import Client
from ..envelope import decode_payload, new_id
from ..errors import ReachError
from ..limits import RateLimit
from ..outcomes import Status
from ..registry import normalize_capability
from .auth import Tokens
from .cards import CARD_PATH, CardRoutes, _live, input_modes
from .executor import (
    CALLER_HEADER,
    TIMEOUT_HEADER,
    Target,
    _Executor,
    _ReachIds,
    ask_metadata,
)
from .handler import _Handler, _TargetContext
from .mapping import error_of, result_parts, task_state
from .resuming import EventIds
from .store import (
    DEFAULT_MAX_STORE_BYTES,
    DEFAULT_MAX_TASK_BYTES,
    DEFAULT_TTL_S,
    RedisTaskStore,
    install_append_hook,
)

__all__ = ["CALLER_HEADER", "CARD_PATH", "TIMEOUT_HEADER", "BearerAuth", "Gateway", "Target"]

log = logging.getLogger("reach.gateway")

DEFAULT_SEND_TIMEOUT_S = 30.0


class Gateway(CardRoutes):
    """The A2A face of one namespace: :attr:`app` is the ASGI application to serve.

    ``client`` (not started: the application's lifespan starts and closes it) sends what
    callers ask for, with its own signing (``secret=`` / ``identity_file=``, or the
    ``REACH_*`` variables). ``tokens``: the bearer tokens callers must present (None:
    no authentication). ``public_url``: the gateway's URL as callers reach it, for the
    cards (None: taken from each request's Host). ``default_timeout_s``: a message's
    deadline when the caller gives no ``Reach-Timeout-S`` header and its capability's
    agents advertise no timeout (``@app.handler(cap, timeout_s=...)``). ``max_task_bytes``,
    ``max_store_bytes``, ``task_ttl_s``: the bounds of the task store (one task; the
    finished tasks together; how long a task is kept). ``max_body_bytes``: the largest
    request body taken (None: the client's payload limit as base64, plus 64 KiB).
    ``send_timeout_s``: a response its caller does not read for this long is cut.
    ``mtls``: the server requires client certificates (the TLS layer does; the cards
    declare it). ``jwt``: JWT bearer tokens taken beside ``tokens`` (docs/a2a.md,
    *Identity*). ``rate_per_caller``: each caller's rate limit (429 past it). ``ips``: the
    IP allow and deny lists (403).
    """

    def __init__(
        self,
        client: Client,
        *,
        tokens: Tokens | None = None,
        public_url: str | None = None,
        default_timeout_s: float = 30.0,
        max_task_bytes: int = DEFAULT_MAX_TASK_BYTES,
        max_store_bytes: int = DEFAULT_MAX_STORE_BYTES,
        task_ttl_s: float = DEFAULT_TTL_S,
        max_body_bytes: int | None = None,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
        mtls: bool = False,
        jwt: JwtVerifier | None = None,
        rate_per_caller: RateLimit | None = None,
        ips: IpRules | None = None,
    ) -> None:
        install_append_hook()
        self.jwt = jwt
        self.rate_per_caller = rate_per_caller
        self.ips = ips
        self.client = client
        self.mtls = mtls
        self.namespace = client.namespace
        self.tokens = tokens
        self.public_url = public_url.rstrip("/") if public_url else None
        self.default_timeout_s = default_timeout_s
        # A message's payload is at most the client's limit; as JSON text or base64 in a
        # JSON-RPC body it takes up to 4/3 of that, plus the envelope of the request.
        self.max_body_bytes = max_body_bytes or client.max_payload_bytes * 4 // 3 + 65_536
        self.send_timeout_s = send_timeout_s
        self.tasks = RedisTaskStore(
            client, ttl_s=task_ttl_s, max_task_bytes=max_task_bytes, max_store_bytes=max_store_bytes
        )
        # tasks this process waits for: the scope of the wait, and set when it ended
        self.running: dict[str, tuple[anyio.CancelScope, anyio.Event]] = {}
        # The SDK warns that a versioned store without an event stream cannot stream a task
        # to another process: the gateway does not (a caller follows its task where it sent
        # it, or reads it from any process).
        quiet = logging.getLogger("a2a.server.request_handlers.default_request_handler_v2")
        was, quiet.disabled = quiet.disabled, True
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.handler = self._make_handler()
        finally:
            quiet.disabled = was
        self.app = self._build_app()

    def _make_handler(self) -> _Handler:
        return _Handler(
            self,
            agent_executor=_Executor(self),
            task_store=self.tasks,
            # what the SDK checks requests against (streaming on, no push notifications)
            agent_card=self._parse(self._gateway_card_dict("http://localhost", ["any"])),
            request_context_builder=SimpleRequestContextBuilder(task_id_generator=_ReachIds()),
        )

    # -- the application ----------------------------------------------------------------
    def _build_app(self) -> Starlette:
        routes: list[Route] = [
            Route(CARD_PATH, self._gateway_card, methods=["GET"]),
            Route("/caps/{name}" + CARD_PATH, self._cap_card, methods=["GET"]),
            Route("/agents/{name:path}" + CARD_PATH, self._agent_card, methods=["GET"]),
        ]
        for kind, path in (("caps", "/caps/{name}"), ("agents", "/agents/{name:path}")):
            routes += create_jsonrpc_routes(
                self.handler, path, context_builder=_TargetContext(kind), enable_v0_3_compat=True
            )
        routes += create_jsonrpc_routes(
            self.handler, "/", context_builder=_TargetContext("gateway"), enable_v0_3_compat=True
        )

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with self.client:
                try:
                    yield
                finally:
                    await self.handler.aclose()

        app = Starlette(routes=routes, lifespan=lifespan)
        app.add_middleware(EventIds)  # innermost: the SSE ids (reach.gateway.resuming)
        app.add_middleware(SendTimeout, timeout_s=self.send_timeout_s, on_cut=_log_cut)
        app.add_middleware(BodyLimit, max_bytes=self.max_body_bytes, json_rpc=True)
        auth = None
        if self.tokens is not None or self.jwt is not None:
            auth = Authenticator(self.tokens, self.jwt)
        take = None
        if self.rate_per_caller is not None:
            take = redis_take(
                lambda: self.client.control, self.namespace, "gateway", self.rate_per_caller
            )
        if auth is not None or take is not None or (self.ips is not None and self.ips.active):
            # outermost: a request refused here has none of its body read
            app.add_middleware(
                Access,
                realm="reach gateway",
                ips=self.ips,
                auth=auth,
                take=take,
                json_rpc=True,
            )
        return app

    # -- routing a message ----------------------------------------------------------------
    async def route(self, target: Target, message: Message) -> tuple[str, str | None, list[str]]:
        """The capability, agent (None: any, by policy) and input modes of a message."""
        named = MessageToDict(message.metadata).get("capability") if message.metadata else None
        if named is not None and not isinstance(named, str):
            raise InvalidParamsError(message="metadata.capability must be a capability name.")
        if target.kind == "agents":
            info = await self.client.registry.get(target.name)
            if info is None or info.state == "evicted":
                raise InvalidParamsError(
                    message=f"No live agent {target.name!r} in namespace {self.namespace!r}."
                )
            if named is None and len(info.capabilities) != 1:
                raise InvalidParamsError(
                    message=f"Agent {info.agent_id!r} has capabilities "
                    f"{', '.join(info.capabilities)}: name one in the message's "
                    "metadata.capability."
                )
            cap = named or info.capabilities[0]
            if cap not in info.capabilities:
                raise InvalidParamsError(
                    message=f"Agent {info.agent_id!r} has no capability {cap!r} (it has "
                    f"{', '.join(info.capabilities)})."
                )
            return cap, info.agent_id, input_modes(cap, [info])
        if target.kind == "caps":
            if named is not None and named != target.name:
                raise InvalidParamsError(
                    message=f"metadata.capability {named!r} differs from this server's "
                    f"capability {target.name!r}."
                )
            named = target.name
        if named is None:
            raise InvalidParamsError(
                message="Name the capability: send to /caps/<capability>, or give "
                "metadata.capability."
            )
        try:
            cap = normalize_capability(named)
        except ReachError as e:
            raise error_of(e) from e
        agents, _ = await self.client.view.candidates(cap)
        return cap, None, input_modes(cap, _live(agents))

    async def task_from_reach(self, msg_id: str) -> Task:
        """A task this process does not hold, from its reach task record."""
        st = await self.client.task(msg_id)
        if st.status == Status.UNKNOWN:
            raise TaskNotFoundError(message=f"No task {msg_id} (or its record expired).")
        reply = st.reply
        task = Task(
            id=msg_id, status=TaskStatus(state=task_state(st.status, reply.reason if reply else ""))
        )
        if st.updated_ms:
            task.status.timestamp.FromDatetime(datetime.fromtimestamp(st.updated_ms / 1000, UTC))
        signer = self.client.signer
        if (
            st.status == Status.SUCCEEDED
            and reply is not None
            and (signer is None or signer.check_reply(reply) is None)
        ):
            try:
                result = decode_payload(reply.result)
            except (msgspec.DecodeError, msgspec.ValidationError):
                result = None
            if result is not None:
                task.artifacts.append(
                    Artifact(
                        artifact_id=f"{msg_id}-result", name="result", parts=result_parts(result)
                    )
                )
        if st.status == Status.INPUT_REQUIRED and st.question:
            task.status.message.CopyFrom(
                Message(
                    message_id=new_id(),
                    role=Role.ROLE_AGENT,
                    task_id=msg_id,
                    parts=[Part(text=st.question)],
                    metadata=ask_metadata(st.asking),
                )
            )
        elif st.error:
            task.status.message.CopyFrom(
                Message(
                    message_id=new_id(),
                    role=Role.ROLE_AGENT,
                    task_id=msg_id,
                    parts=[Part(text=st.error)],
                )
            )
        return task


def _log_cut(scope: Scope) -> None:
    user = scope.get("user")
    log.warning(
        "cut a response its caller did not read (caller %s, %s %s)",
        getattr(user, "display_name", "") or "-",
        scope.get("method", ""),
        scope.get("path", ""),
    )


class BearerAuth(Access):
    """ASGI middleware: every request but a card's (``GET``) needs ``Authorization: Bearer
    TOKEN`` with a token of :class:`~reach.gateway.auth.Tokens`; the caller is then the
    token's name (``request.user``), which the SDK scopes tasks by. (:class:`Gateway` puts
    :class:`reach._access.Access` in front, which also takes JWTs, limits each caller's
    rate and holds the IP lists.)"""

    def __init__(self, app: ASGIApp, *, tokens: Tokens) -> None:
        super().__init__(app, realm="reach gateway", auth=Authenticator(tokens))

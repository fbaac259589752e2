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
"""

from __future__ import annotations

import difflib
import logging
import math
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple

import anyio
import msgspec
from a2a.server.agent_execution import AgentExecutor, RequestContext, SimpleRequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.id_generator import IDGenerator, IDGeneratorContext
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes
from a2a.server.tasks import TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import (
    A2AError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from a2a.utils.task import apply_history_length
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, SimpleUser
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._cancel import CancelOutcome
from .._http import BodyLimit, SendTimeout
from .._streaming import Stream
from .._version import __version__
from ..card import A2A_PROTOCOL_VERSION, DEFAULT_MODES, agent_card, capability_skill
from ..client import Client
from ..envelope import MAX_ID_CHARS, decode_payload, new_id
from ..errors import Cancelled, ReachError, Rejected, StreamTooLarge
from ..outcomes import Status
from ..registry import AgentInfo, normalize_capability
from .auth import Tokens
from .logs import client_error
from .mapping import TEXT_MODE, error_of, payload_of, result_parts, takes_json_text, task_state
from .store import (
    DEFAULT_MAX_STORE_BYTES,
    DEFAULT_MAX_TASK_BYTES,
    DEFAULT_TTL_S,
    STREAMED,
    RedisTaskStore,
    install_append_hook,
)

log = logging.getLogger("reach.gateway")

CARD_PATH = "/.well-known/agent-card.json"
GATEWAY_EXTENSION_URI = "urn:reach:gateway:v1"
TIMEOUT_HEADER = "reach-timeout-s"  # the request's deadline, seconds from now
CALLER_HEADER = "a2a-caller"  # on the fabric: the token name the caller authenticated with
MAX_TIMEOUT_S = 86_400.0
DEFAULT_SEND_TIMEOUT_S = 30.0
OUTPUT_MODES = ["application/json", TEXT_MODE]
_TARGET = "reach.target"
_TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


class Target(NamedTuple):
    """Where a request came in: ``kind`` is ``caps``, ``agents`` or ``gateway`` (``/``)."""

    kind: str
    name: str


class _ReachIds(IDGenerator):
    """A2A task ids are reach msg_ids (time-ordered, 128 bits, hex)."""

    def generate(self, context: IDGeneratorContext) -> str:
        return new_id()


class _Executor(AgentExecutor):
    """Runs one A2A message as a reach streamed request."""

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        gw = self.gw
        message = context.message
        if message is None or not context.task_id or not context.context_id:
            raise InvalidParamsError(message="A message is needed.")
        task_id, context_id = context.task_id, context.context_id
        state = context.call_context.state
        target: Target = state.get(_TARGET, Target("gateway", ""))
        capability, agent_id, modes = await gw.route(target, message)
        payload = payload_of(message.parts, json_text=takes_json_text(modes))
        timeout_s = _timeout_of(state.get("headers") or {}, gw.default_timeout_s)
        user = context.call_context.user
        headers = {CALLER_HEADER: user.user_name} if user.is_authenticated else {}
        try:
            env = gw.client.build(
                capability,
                payload,
                session_id=session_of(context.call_context, context_id),
                timeout_s=timeout_s,
                target=agent_id,
                headers=headers,
            )
        except ReachError as e:
            raise error_of(e) from e
        env = msgspec.structs.replace(env, msg_id=task_id, trace_id=task_id)
        # The task holds the stream's chunks (for tasks/get and a waiting send): bounded by
        # the store's bytes per task, past which the stream ends (StreamTooLarge).
        stream = Stream(gw.client, env, None, max_bytes=gw.tasks.max_task_bytes)
        try:
            await stream.start()  # refused before it is sent: an error, and no task
        except ReachError as e:
            raise error_of(e) from e
        # The task is shown once there is something to show: at once when the caller does
        # not wait (return_immediately), else with the first chunk, or whole at the end (a
        # handler that does not stream answers in one event). tasks/get meanwhile reads
        # the reach task record (pending: submitted, running: working).
        task = Task(
            id=task_id,
            context_id=context_id,
            status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
            history=[message],
        )
        shown = False
        config = context.configuration
        if config is not None and config.return_immediately:
            await event_queue.enqueue_event(task)
            shown = True
        updater = TaskUpdater(event_queue, task_id, context_id)
        scope, done = anyio.CancelScope(), anyio.Event()
        gw.running[task_id] = (scope, done)  # tasks/cancel stops the wait (_Handler)
        try:
            await self._follow(stream, task, shown, updater, event_queue, scope)
        finally:
            gw.running.pop(task_id, None)
            done.set()

    async def _follow(
        self,
        stream: Stream,
        task: Task,
        shown: bool,
        updater: TaskUpdater,
        event_queue: EventQueue,
        scope: anyio.CancelScope,
    ) -> None:
        """Turn the stream's chunks and outcome into the task's events."""
        task_id = task.id
        chunks = 0
        result: Any = None
        with scope:
            async with stream:
                try:
                    async for chunk in stream:
                        if not shown:
                            task.status.state = TaskState.TASK_STATE_WORKING
                            await event_queue.enqueue_event(task)
                            shown = True
                        elif not chunks:
                            await updater.start_work()
                        await updater.add_artifact(
                            result_parts(chunk),
                            artifact_id=f"{task_id}-stream",
                            name="stream",
                            append=chunks > 0,
                            metadata={STREAMED: True},  # appended in Redis, not in memory
                        )
                        chunks += 1
                    result = stream.result
                except ReachError as e:
                    if isinstance(e, StreamTooLarge):  # the handler would go on: stop it
                        with anyio.move_on_after(10):
                            await self.gw.client.cancel(
                                task_id, by="the A2A gateway (the task's bytes bound)"
                            )
                        e = StreamTooLarge(
                            f"The task's output passed {self.gw.tasks.max_task_bytes} bytes, "
                            "the gateway's limit per task (reach gateway --max-task-bytes): "
                            "the stream was ended and the message cancelled."
                        )
                    await _finish_failed(updater, e, task if not shown else None, event_queue)
                    return
        if scope.cancelled_caught:  # tasks/cancel cancelled the message in reach
            why = Cancelled("cancelled (A2A tasks/cancel)")
            await _finish_failed(updater, why, task if not shown else None, event_queue)
            return
        artifact = Artifact(artifact_id=f"{task_id}-result", name="result")
        if result is not None:
            artifact.parts.extend(result_parts(result))
        if not shown:  # one event: the finished task
            if result is not None:
                task.artifacts.append(artifact)
            task.status.state = TaskState.TASK_STATE_COMPLETED
            task.status.timestamp.FromDatetime(datetime.now(UTC))
            await event_queue.enqueue_event(task)
            return
        if result is not None:
            await updater.add_artifact(
                list(artifact.parts),
                artifact_id=artifact.artifact_id,
                name="result",
                last_chunk=True,
            )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise TaskNotCancelableError(message=NOT_CANCELABLE)


NOT_CANCELABLE = "tasks/cancel goes to the gateway's request handler (reach cancellation)."


async def _finish_failed(
    updater: TaskUpdater, e: ReachError, unshown: Task | None, event_queue: EventQueue
) -> None:
    """End the task with the state of a reach error, its text as the status message: one
    event, the finished task, when nothing was shown yet (``unshown``)."""
    why = updater.new_agent_message([Part(text=str(e))], metadata={"reachError": type(e).__name__})
    if isinstance(e, Cancelled):
        state = TaskState.TASK_STATE_CANCELED
    elif isinstance(e, Rejected):
        state = TaskState.TASK_STATE_REJECTED
    else:
        state = TaskState.TASK_STATE_FAILED
    if unshown is not None:
        unshown.status.state = state
        unshown.status.message.CopyFrom(why)
        unshown.status.timestamp.FromDatetime(datetime.now(UTC))
        await event_queue.enqueue_event(unshown)
    else:
        await updater.update_status(state, message=why)


SESSION_PREFIX = "a2a"


def session_of(context: ServerCallContext, context_id: str) -> str:
    """The reach session of an A2A context: scoped by the caller (the token's name, or
    ``-`` without authentication), so a caller naming another's contextId gets a session
    of its own. Caller names have no ``:``, so the scoped id is unambiguous."""
    caller = resolve_user_scope(context) or "-"
    session = f"{SESSION_PREFIX}:{caller}:{context_id}"
    if len(session) > MAX_ID_CHARS:
        raise InvalidParamsError(
            message=f"contextId is {len(context_id)} characters: use at most "
            f"{MAX_ID_CHARS - len(session) + len(context_id)}."
        )
    return session


def _timeout_of(headers: Mapping[str, str], default_s: float) -> float:
    raw = headers.get(TIMEOUT_HEADER)
    if raw is None:
        return default_s
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value <= MAX_TIMEOUT_S):
        raise InvalidParamsError(
            message=f"Header {TIMEOUT_HEADER}: {raw!r} is not a number of seconds in "
            f"(0, {MAX_TIMEOUT_S:g}]."
        )
    return value


class _Handler(DefaultRequestHandler):
    """The SDK's request handler; ``tasks/get`` also answers for tasks this process does
    not hold (from the reach task record), and shows a task a worker has started as
    ``working``; ``tasks/cancel`` is reach's cancellation."""

    def __init__(self, gateway: Gateway, **kw: Any) -> None:
        super().__init__(**kw)
        self.gw = gateway

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        try:
            return await self._get_task(params, context)
        except A2AError as e:
            client_error(e, context)
            raise

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        try:
            page: ListTasksResponse = await super().on_list_tasks(params, context)
        except A2AError as e:
            client_error(e, context)
            raise
        return page

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        try:
            async for event in super().on_message_send_stream(params, context):
                yield event
        except A2AError as e:
            client_error(e, context)
            raise

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        try:
            async for event in super().on_subscribe_to_task(params, context):
                yield event
        except A2AError as e:
            client_error(e, context)
            raise

    async def _get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        try:
            task: Task | None = await super().on_get_task(params, context)
        except TaskNotFoundError:
            owner = await self.gw.tasks.owner_of(params.id)
            if owner is not None and owner != resolve_user_scope(context):
                raise  # another caller's, whichever gateway process holds it
            return await self.gw.task_from_reach(params.id)
        if task is not None and task.status.state == TaskState.TASK_STATE_SUBMITTED:
            st = await self.gw.client.task(params.id)
            if st.status in (Status.RUNNING, Status.RETRYING):
                task.status.state = TaskState.TASK_STATE_WORKING
        return task

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Message | Task:
        """The SDK's, answered with the task as the store has it: whole, the chunks of its
        stream included (the task the SDK holds in memory leaves them out)."""
        try:
            result: Message | Task = await super().on_message_send(params, context)
        except A2AError as e:
            client_error(e, context)
            raise
        if isinstance(result, Task):
            stored = await self.gw.tasks.get(result.id, context)
            if stored is not None:
                whole: Task = apply_history_length(stored.task, params.configuration)
                return whole
        return result

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        """reach's cancellation (``Client.cancel``): a message not started never runs, a
        running handler is told to stop; answered with the task, ``canceled``. A task that
        finished already is not cancelable (-32002)."""
        try:
            return await self._cancel_task(params, context)
        except A2AError as e:
            client_error(e, context)
            raise

    async def _cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        task_id = params.id
        owner = await self.gw.tasks.owner_of(task_id)
        if owner is not None and owner != resolve_user_scope(context):
            raise TaskNotFoundError  # another caller's, whichever gateway process holds it
        user = context.user.user_name if context.user.is_authenticated else "an A2A caller"
        try:
            res = await self.gw.client.cancel(task_id, by=f"{user} (A2A tasks/cancel)")
        except ReachError as e:
            raise error_of(e) from e
        if res.outcome == CancelOutcome.UNKNOWN:
            raise TaskNotFoundError(message=f"No task {task_id} (or its record expired).")
        running = self.gw.running.get(task_id)
        if res.outcome == CancelOutcome.ALREADY_DONE or (
            res.outcome == CancelOutcome.ALREADY_CANCELLED and running is None
        ):  # finished, cancelled included (as A2A has it: a terminal task is not cancelable)
            status = res.status or "cancelled"
            raise TaskNotCancelableError(
                message=f"Task {task_id} has finished ({status}): it cannot be cancelled."
            )
        if running is not None:  # this process waits for it: stop waiting, end it canceled
            scope, done = running
            scope.cancel()
            with anyio.move_on_after(10):
                await done.wait()
        stored = await self.gw.tasks.get(task_id, context)
        if stored is not None and stored.task.status.state in _TERMINAL:
            return stored.task
        return await self.gw.task_from_reach(task_id)


class _TargetContext(DefaultServerCallContextBuilder):
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def build(self, request: Request) -> ServerCallContext:
        ctx = super().build(request)
        ctx.state[_TARGET] = Target(self.kind, str(request.path_params.get("name", "")))
        return ctx


def input_modes(capability: str, agents: Sequence[AgentInfo]) -> list[str]:
    """The input modes the agents of ``capability`` declare for it (the skill's, else
    their card's default), all of them; reach's default (JSON) when none does."""
    modes: set[str] = set()
    for a in agents:
        card = a.card or {}
        skills = card.get("skills")
        skill = next(
            (
                s
                for s in (skills if isinstance(skills, list) else [])
                if isinstance(s, Mapping) and s.get("id") == capability
            ),
            {},
        )
        given = skill.get("inputModes") or card.get("defaultInputModes")
        for m in given if isinstance(given, list) else DEFAULT_MODES:
            if isinstance(m, str):
                modes.add(m)
    return sorted(modes) or list(DEFAULT_MODES)


def _live(agents: Sequence[AgentInfo]) -> list[AgentInfo]:
    return [a for a in agents if a.state != "evicted"]


class Gateway:
    """The A2A face of one namespace: :attr:`app` is the ASGI application to serve.

    ``client`` (not started: the application's lifespan starts and closes it) sends what
    callers ask for, with its own signing (``secret=`` / ``identity_file=``, or the
    ``REACH_*`` variables). ``tokens``: the bearer tokens callers must present (None:
    no authentication). ``public_url``: the gateway's URL as callers reach it, for the
    cards (None: taken from each request's Host). ``default_timeout_s``: a message's
    deadline when the caller gives no ``Reach-Timeout-S`` header. ``max_task_bytes``,
    ``max_store_bytes``, ``task_ttl_s``: the bounds of the task store (one task; the
    finished tasks together; how long a task is kept). ``max_body_bytes``: the largest
    request body taken (None: the client's payload limit as base64, plus 64 KiB).
    ``send_timeout_s``: a response its caller does not read for this long is cut.
    ``mtls``: the server requires client certificates (the TLS layer does; the cards
    declare it).
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
    ) -> None:
        install_append_hook()
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
        if self.tokens is not None:
            app.add_middleware(BearerAuth, tokens=self.tokens)
        app.add_middleware(SendTimeout, timeout_s=self.send_timeout_s, on_cut=_log_cut)
        app.add_middleware(BodyLimit, max_bytes=self.max_body_bytes, json_rpc=True)
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
        if st.error:
            task.status.message.CopyFrom(
                Message(
                    message_id=new_id(),
                    role=Role.ROLE_AGENT,
                    task_id=msg_id,
                    parts=[Part(text=st.error)],
                )
            )
        return task

    # -- cards --------------------------------------------------------------------------
    def _base(self, request: Request) -> str:
        return self.public_url or str(request.base_url).rstrip("/")

    def _security(self) -> dict[str, Any]:
        """The cards' security: a bearer token when tokens are set, a client certificate
        when mutual TLS is on; both when both are (one requirement naming each)."""
        schemes: dict[str, Any] = {}
        if self.tokens is not None:
            schemes["bearer"] = {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "description": "A token the gateway's operator gave you "
                    "(reach gateway --token-file / REACH_GATEWAY_TOKENS).",
                }
            }
        if self.mtls:
            schemes["mtls"] = {
                "mtlsSecurityScheme": {
                    "description": "A client certificate signed by the CA the gateway's "
                    "operator names (reach gateway --tls-client-ca)."
                }
            }
        if not schemes:
            return {}
        return {
            "securitySchemes": schemes,
            "securityRequirements": [{"schemes": {name: {"list": []} for name in schemes}}],
        }

    def _interface(self, url: str) -> dict[str, Any]:
        return {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": A2A_PROTOCOL_VERSION}

    def _extension(self, **params: Any) -> dict[str, Any]:
        return {
            "uri": GATEWAY_EXTENSION_URI,
            "description": "Served by a reach A2A gateway (docs/a2a.md).",
            "required": False,
            "params": {"namespace": self.namespace, **params},
        }

    def _gateway_card_dict(self, base: str, caps: Sequence[str], **params: Any) -> dict[str, Any]:
        return {
            "name": f"reach gateway ({self.namespace})",
            "description": f"The capabilities of reach namespace {self.namespace!r} as A2A "
            "servers: each at /caps/<capability>, each agent at /agents/<agent_id>. Here, "
            "a message names its capability in metadata.capability.",
            "supportedInterfaces": [self._interface(base + "/")],
            "version": __version__,
            "capabilities": {
                "streaming": True,
                "pushNotifications": False,
                "extensions": [self._extension(**params)],
            },
            "defaultInputModes": ["application/json", TEXT_MODE],
            "defaultOutputModes": OUTPUT_MODES,
            "skills": [capability_skill(c) for c in caps],
            **self._security(),
        }

    @staticmethod
    def _parse(card: Mapping[str, Any]) -> AgentCard:
        parsed: AgentCard = ParseDict(card, AgentCard(), ignore_unknown_fields=True)
        return parsed

    def _respond(self, card: Mapping[str, Any]) -> Response:
        return JSONResponse(agent_card_to_dict(self._parse(card)))

    async def _gateway_card(self, request: Request) -> Response:
        base = self._base(request)
        registry = self.client.registry
        caps = [c for c, _ in await registry.capabilities()]
        agents = [a for a in await registry.agents() if a.state != "evicted"]
        return self._respond(
            self._gateway_card_dict(
                base,
                sorted(caps),
                capabilities={c: f"{base}/caps/{c}" for c in sorted(caps)},
                agents={a.agent_id: f"{base}/agents/{a.agent_id}" for a in agents},
            )
        )

    async def _cap_card(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            cap = normalize_capability(name)
        except ReachError:
            return _not_found(f"{name!r} is not a capability name.")
        agents = _live((await self.client.view.candidates(cap))[0])
        if not agents:
            known = [c for c, _ in await self.client.registry.capabilities()]
            close = difflib.get_close_matches(cap, known, n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            return _not_found(f"No live agent of capability {cap!r} in {self.namespace!r}.{hint}")
        base = self._base(request)
        skill = capability_skill(cap)
        for a in sorted(agents, key=lambda a: a.agent_id):  # the first that describes it
            given = next((s for s in agent_card(a, namespace=self.namespace)["skills"]), None)
            if given and given.get("id") == cap:
                skill = {**skill, **given}
                break
        ids = sorted(a.agent_id for a in agents)
        card = {
            "name": cap,
            "description": skill.get("description")
            or f"reach capability {cap!r} in namespace {self.namespace!r}.",
            "supportedInterfaces": [self._interface(f"{base}/caps/{cap}")],
            "version": __version__,
            "capabilities": {
                "streaming": True,
                "pushNotifications": False,
                "extensions": [
                    self._extension(capability=cap, agents={i: f"{base}/agents/{i}" for i in ids})
                ],
            },
            "defaultInputModes": input_modes(cap, agents),
            "defaultOutputModes": OUTPUT_MODES,
            "skills": [skill],
            **self._security(),
        }
        return self._respond(card)

    async def _agent_card(self, request: Request) -> Response:
        name = request.path_params["name"]
        info = await self.client.registry.get(name)
        if info is None or info.state == "evicted":
            return _not_found(f"No live agent {name!r} in {self.namespace!r}.")
        card = agent_card(info, namespace=self.namespace)
        card["supportedInterfaces"] = [
            self._interface(f"{self._base(request)}/agents/{info.agent_id}"),
            *card["supportedInterfaces"],
        ]
        card["capabilities"]["streaming"] = True
        card.update(self._security())
        try:
            return self._respond(card)
        except ParseError:  # a card the agent registered with that A2A cannot read
            bare = agent_card(msgspec.structs.replace(info, card=None), namespace=self.namespace)
            bare["supportedInterfaces"].insert(0, card["supportedInterfaces"][0])
            bare["capabilities"]["streaming"] = True
            return self._respond({**bare, **self._security()})


def _log_cut(scope: Scope) -> None:
    user = scope.get("user")
    log.warning(
        "cut a response its caller did not read (caller %s, %s %s)",
        getattr(user, "display_name", "") or "-",
        scope.get("method", ""),
        scope.get("path", ""),
    )


def _not_found(why: str) -> Response:
    return JSONResponse({"error": why}, status_code=404)


class BearerAuth:
    """ASGI middleware: every request but a card's (``GET``) needs ``Authorization: Bearer
    TOKEN`` with a token of :class:`~reach.gateway.auth.Tokens`; the caller is then the
    token's name (``request.user``), which the SDK scopes tasks by."""

    def __init__(self, app: ASGIApp, *, tokens: Tokens) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        name = self.tokens.check(Headers(scope=scope).get("authorization"))
        if name is None:
            response = JSONResponse(
                {"error": "Authentication required: send Authorization: Bearer <token>."},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="reach gateway"'},
            )
            await response(scope, receive, send)
            return
        scope["user"] = SimpleUser(name)
        scope["auth"] = AuthCredentials(["authenticated"])
        await self.app(scope, receive, send)

"""One A2A message run as a reach streamed request: the SDK's :class:`AgentExecutor` for the
gateway, and what it reads from the request (the target, the deadline header, the session).

The A2A task id is the reach msg_id, the context id (scoped by the caller) the session_id;
the stream's chunks and its outcome become the task's events. Cancellation does not come
here: ``tasks/cancel`` is the request handler's (:mod:`reach.gateway.handler`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import msgspec
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.id_generator import IDGenerator, IDGeneratorContext
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.tasks import TaskUpdater
from a2a.types.a2a_pb2 import Artifact, Message, Part, Task, TaskState, TaskStatus
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError
from google.protobuf import struct_pb2

from .._streaming import Stream
from ..envelope import MAX_ID_CHARS, new_id
from ..errors import Cancelled, ReachError, Rejected, StreamTooLarge
from ..outcomes import Status
from ..untrusted import safe_text
from ..watch import TaskChange
from .mapping import error_of, payload_of, result_parts, takes_json_text
from .resuming import CHUNK_NO
from .store import STREAMED

if TYPE_CHECKING:
    from .server import Gateway

TIMEOUT_HEADER = "reach-timeout-s"  # the request's deadline, seconds from now
CALLER_HEADER = "a2a-caller"  # on the fabric: the caller (a token's name, a JWT's claim)
MAX_TIMEOUT_S = 86_400.0
_TARGET = "reach.target"


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
        if context.current_task is not None:  # a message on a task: the answer it asked for
            await self._resume(context.current_task, message, event_queue)
            return
        state = context.call_context.state
        target: Target = state.get(_TARGET, Target("gateway", ""))
        capability, agent_id, modes = await gw.route(target, message)
        payload = payload_of(message.parts, json_text=takes_json_text(modes))
        # The caller's header, else the capability's advertised timeout, else the gateway's.
        advertised = await gw.client.advertised_timeout(capability)
        timeout_s = _timeout_of(
            state.get("headers") or {}, gw.default_timeout_s if advertised is None else advertised
        )
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
        asked: list[TaskChange] = []
        try:
            with anyio.CancelScope() as following:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_watch_for_question, gw, task_id, asked, following)
                    await self._follow(stream, task, shown, updater, event_queue, scope)
                    tg.cancel_scope.cancel()
            if asked and following.cancelled_caught:  # the caller's turn: it answers with a
                # message on the task, which _resume takes
                await _ask_caller(updater, asked[0], task, event_queue, shown=shown)
        finally:
            gw.running.pop(task_id, None)
            done.set()

    async def _resume(self, task: Task, message: Message, event_queue: EventQueue) -> None:
        """A message on a task waiting for input (``input-required``): its text or data is
        the answer (``Client.answer``); the task is then followed (``Client.watch``) to its
        end, or to its next question."""
        gw, task_id = self.gw, task.id
        if task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
            raise InvalidParamsError(
                message=f"Task {task_id} is {TaskState.Name(task.status.state)}: a message on "
                "a task answers its question, and it asks none now."
            )
        asked = task.status.message.metadata.fields.get(ASK_KEY)
        ask = int(asked.number_value) if asked is not None and asked.number_value >= 1 else None
        try:
            await gw.client.answer(task_id, payload_of(message.parts, json_text=False), ask=ask)
        except ReachError as e:
            raise InvalidParamsError(message=str(e)) from e
        updater = TaskUpdater(event_queue, task_id, task.context_id)
        await updater.start_work()
        scope, done = anyio.CancelScope(), anyio.Event()
        gw.running[task_id] = (scope, done)
        try:
            with scope:
                async for change in gw.client.watch(task_id):
                    asks_again = change.task is not None and change.task.asking != ask
                    if change.status == Status.INPUT_REQUIRED and asks_again:  # its next one
                        await _ask_caller(updater, change, task, event_queue, shown=True)
                        return
                    if change.final:
                        await _finish_from_reach(gw, updater, task_id)
                        return
            if scope.cancelled_caught:
                why = Cancelled("cancelled (A2A tasks/cancel)")
                await _finish_failed(updater, why, None, event_queue)
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
                            # appended in Redis, not in memory; its number (SSE ids, resuming)
                            metadata={STREAMED: True, CHUNK_NO: stream.seq},
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

ASK_KEY = "reachAsk"
"""The metadata key of an ``input-required`` status message: the number of the ask
(``ctx.ask``) it shows, so the answer lands on that question and no later one."""

QUESTION_POLLS_S = (0.5, 1.0, 2.0)
"""While a task the gateway runs has no outcome, its record is read for a question
(``ctx.ask``) after 0.5 s, 1 s later, then every 2 s: one ``HMGET`` each, on the gateway's
pooled connections (a watch per task would hold a connection of its own for as long as the
task runs: a thousand slow tasks, a thousand connections). A quick task is never read;
a question shows at most 2 s after it is asked (docs/a2a.md, *Human input*)."""


async def _watch_for_question(
    gw: Gateway, task_id: str, asked: list[TaskChange], following: anyio.CancelScope
) -> None:
    """Read the task's record now and then (:data:`QUESTION_POLLS_S`); when its handler
    asks a question, note it in ``asked`` and stop following the task's stream."""
    record = gw.client.keys.idem(task_id)  # the gateway sends with no key of its own
    n = 0
    while True:
        await anyio.sleep(QUESTION_POLLS_S[min(n, len(QUESTION_POLLS_S) - 1)])
        n += 1
        question, status = await gw.client.commands.hmget(record, ["question", "status"])
        if status is None:
            continue
        # A record's bytes may be anyone's: read leniently, never raising on bad UTF-8.
        if safe_text(status) == Status.INPUT_REQUIRED and question:
            task = await gw.client.task(task_id)
            if task.status == Status.INPUT_REQUIRED:
                asked.append(
                    TaskChange(
                        msg_id=task_id,
                        kind="status",
                        status=task.status,
                        task=task,
                        question=task.question,
                    )
                )
                following.cancel()
                return


def ask_metadata(n: int) -> struct_pb2.Struct:
    """The metadata of a status message showing ask ``n``: ``{"reachAsk": n}``."""
    meta = struct_pb2.Struct()
    meta.update({ASK_KEY: n})
    return meta


def question_message(updater: TaskUpdater, change: TaskChange) -> Message:
    """The status message of an ``input-required`` task: the question, and its number."""
    n = change.task.asking if change.task is not None else 0
    return updater.new_agent_message([Part(text=change.question)], metadata={ASK_KEY: n})


async def _ask_caller(
    updater: TaskUpdater, change: TaskChange, task: Task, event_queue: EventQueue, *, shown: bool
) -> None:
    """End this call with the task ``input-required``, the question its status message."""
    why = question_message(updater, change)
    if shown:
        await updater.requires_input(message=why)
        return
    task.status.state = TaskState.TASK_STATE_INPUT_REQUIRED
    task.status.message.CopyFrom(why)
    task.status.timestamp.FromDatetime(datetime.now(UTC))
    await event_queue.enqueue_event(task)


async def _finish_from_reach(gw: Gateway, updater: TaskUpdater, task_id: str) -> None:
    """End a resumed task as its reach task record says: its result, or its error."""
    final = await gw.task_from_reach(task_id)
    if final.status.state == TaskState.TASK_STATE_COMPLETED:
        for artifact in final.artifacts:
            await updater.add_artifact(
                list(artifact.parts),
                artifact_id=artifact.artifact_id,
                name=artifact.name,
                last_chunk=True,
            )
        await updater.complete()
        return
    message = final.status.message if final.status.HasField("message") else None
    await updater.update_status(final.status.state, message=message)


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
    """The reach session of an A2A context: scoped by the caller (the token's name, the
    JWT's caller claim, or ``-`` without authentication), so a caller naming another's
    contextId gets a session of its own. Caller names have no ``:`` (a JWT claim's is
    percent-encoded: reach._jwt.caller_of), so the scoped id is unambiguous."""
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

"""The gateway's JSON-RPC methods: the SDK's request handler, with ``tasks/get`` answering
for tasks this process does not hold (from the reach task record), ``tasks/cancel`` as
reach's cancellation, ``SubscribeToTask`` (``tasks/resubscribe``) following a task another
gateway process runs (``Client.watch``), the streams' SSE ids and ``Last-Event-ID``
(:mod:`reach.gateway.resuming`), and each client error logged as one.

Also the context builder that tells the executor which server a request came in on
(``/caps/<capability>``, ``/agents/<agent_id>`` or ``/``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import anyio
from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.types.a2a_pb2 import (
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
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length
from starlette.requests import Request

from .._cancel import CancelOutcome
from ..envelope import new_id
from ..errors import ReachError
from ..outcomes import Status
from .executor import _TARGET, Target, ask_metadata
from .logs import client_error
from .mapping import error_of, task_state
from .resuming import SSE_IDS, continue_after, last_event, tag

if TYPE_CHECKING:
    from .server import Gateway

_TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


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
        """The SDK's, each event with its SSE id; a request sent again with
        ``Last-Event-ID`` continues its task after that event instead (the message is not
        sent again): :mod:`reach.gateway.resuming`."""
        try:
            last = last_event(context)
            if last is not None:
                events = tag(continue_after(self.gw, *last, context), context, chunks=last[1])
            else:
                events = tag(super().on_message_send_stream(params, context), context)
            async for event in events:
                yield event
        except A2AError as e:
            client_error(e, context)
            raise

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        """The SDK's for a task this process runs (its event queue has every chunk); for
        one another gateway process runs, the task from the shared store, then each change
        of its reach task as ``Client.watch`` sees it, then the finished task."""
        try:
            last = last_event(context)
            if last is not None and last[0] == params.id:  # a reconnect: after that event
                events = tag(continue_after(self.gw, *last, context), context, chunks=last[1])
            elif params.id in self.gw.running:
                events = tag(super().on_subscribe_to_task(params, context), context)
            else:
                events = tag(self._follow(params.id, context), context)
            async for event in events:
                yield event
        except A2AError as e:
            client_error(e, context)
            raise

    async def _follow(self, task_id: str, context: ServerCallContext) -> AsyncGenerator[Any, None]:
        stored = await self.gw.tasks.get(task_id, context)  # None for another caller's
        if stored is None:
            raise TaskNotFoundError
        task = stored.task
        if task.status.state in _TERMINAL:  # as the SDK answers it
            raise UnsupportedOperationError(
                message=f"Task {task_id} is in terminal state: {TaskState.Name(task.status.state)}"
            )
        shown: TaskState | None = None
        # The task is yielded once the watch has read the record: every change after it
        # reaches this subscriber.
        async for change in self.gw.client.watch(task_id):
            if change.final:
                final = await self.gw.task_from_reach(task_id)
                final.context_id = task.context_id
                yield final
                return
            state = task_state(change.status)
            if shown is None:
                if state != TaskState.TASK_STATE_SUBMITTED:
                    task.status.state = state
                shown = task.status.state
                yield task
                continue
            if change.kind != "progress" and state == shown:
                continue
            shown = state
            status = TaskStatus(state=state)
            if change.status == Status.INPUT_REQUIRED and change.question:
                n = change.task.asking if change.task is not None else 0
                status.message.CopyFrom(
                    Message(
                        message_id=new_id(),
                        role=Role.ROLE_AGENT,
                        task_id=task_id,
                        parts=[Part(text=change.question)],
                        metadata=ask_metadata(n),
                    )
                )
            elif change.kind == "progress":
                text = f"{100 * (change.progress or 0):.0f}%" + (
                    f" {change.note}" if change.note else ""
                )
                status.message.CopyFrom(
                    Message(
                        message_id=new_id(),
                        role=Role.ROLE_AGENT,
                        task_id=task_id,
                        parts=[Part(text=text)],
                    )
                )
            yield TaskStatusUpdateEvent(task_id=task_id, context_id=task.context_id, status=status)

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
        elif task is not None and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            # Nobody follows a task between its question and its answer: what became of it
            # meanwhile (cancelled, its question timed out and it finished) is in reach.
            st = await self.gw.client.task(params.id)
            if st.status not in (Status.INPUT_REQUIRED, Status.UNKNOWN):
                now = await self.gw.task_from_reach(params.id)
                now.context_id = task.context_id
                now.history.extend(task.history)
                return now
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
        ctx.state[SSE_IDS] = request.scope.get(SSE_IDS)  # resuming.EventIds's queue
        return ctx

"""SSE event ids and ``Last-Event-ID`` on the gateway's A2A streams (docs/a2a.md,
*Reconnecting a stream*).

Every event of a streaming response (``message/stream`` / ``SendStreamingMessage``,
``tasks/resubscribe`` / ``SubscribeToTask``) carries the SSE id ``<task_id>/<n>``: ``n`` is
the number of the task's last stream chunk (artifact update of its ``<task_id>-stream``
artifact) sent up to and including that event, as reach numbers them (chunk ``n`` of the
message, :meth:`reach.Client.resume`; each chunk's update has it in its metadata,
:data:`CHUNK_NO`, so a subscriber that joined a running task late gets true numbers). A caller that lost the connection sends the same
request again with ``Last-Event-ID: <task_id>/<n>``: the gateway answers, from whichever
process gets the request, with the chunks after ``n`` (read from the chunks reach kept,
``Client.resume``), then the task's end: the result artifact and the final status. The
message is not sent again.

The ids are written by :class:`EventIds`, an ASGI middleware: the request handler
computes each event's id as it yields the event (:func:`tag`) into a queue the middleware
put in the request's scope (the context builder hands it to the handler), and the
middleware writes it before the event's ``data`` as the SDK's SSE response goes out: each
event the handler yields is one SSE event, in order; events the handler did not yield
(pings, an error event after an exception) get no id.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from ..envelope import new_id
from ..errors import Cancelled, ChunksNotKept, ReachError, Rejected
from .mapping import result_parts

if TYPE_CHECKING:
    from .server import Gateway

CHUNK_NO = "reachChunk"
"""In a stream chunk's artifact update's metadata: its number (the first chunk is 1), which
its SSE id carries, whichever path the event took (the SDK's queue for a subscriber that
joined late, a resume)."""
SSE_IDS = "reach.sse_ids"
"""The key, in the ASGI scope and in the call context's state, of a streaming request's
queue of event ids (:class:`EventIds`)."""
LAST_EVENT_ID = "last-event-id"


class EventIds:
    """ASGI middleware: writes the id the handler gave each SSE event (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        ids: deque[str] = deque()
        scope[SSE_IDS] = ids
        sse = False
        pending = b""

        async def with_ids(message: AsgiMessage) -> None:
            nonlocal sse, pending
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", ()):
                    if name.lower() == b"content-type":
                        sse = value.startswith(b"text/event-stream")
                await send(message)
                return
            if message["type"] != "http.response.body" or not sse:
                await send(message)
                return
            data = pending + message.get("body", b"")
            out, pending = _split(data, ids)
            if not message.get("more_body", False):
                out, pending = out + pending, b""
            await send({**message, "body": out})

        await self.app(scope, receive, with_ids)


def _split(data: bytes, ids: deque[str]) -> tuple[bytes, bytes]:
    """The complete events of ``data``, each data event with the next id of ``ids``, and
    what is left of an event not complete yet."""
    out = bytearray()
    start = 0
    while True:
        ends = [(i, sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := data.find(sep, start)) >= 0]
        if not ends:
            return bytes(out), data[start:]
        i, sep = min(ends)
        block = data[start : i + len(sep)]
        if not block.startswith(b":") and ids:  # a comment (a ping) has no id
            event_id = ids.popleft()
            if event_id:
                out += b"id: " + event_id.encode() + sep[: len(sep) // 2]
        out += block
        start = i + len(sep)


def last_event(context: ServerCallContext) -> tuple[str, int] | None:
    """The ``(task_id, n)`` of a request's ``Last-Event-ID`` header, None without one;
    InvalidParamsError for one the gateway did not write."""
    headers = context.state.get("headers") or {}
    raw = headers.get(LAST_EVENT_ID)
    if raw is None or raw == "":
        return None
    task_id, _, n = raw.rpartition("/")
    if not task_id or not n.isdigit() or len(n) > 16:
        raise InvalidParamsError(
            message=f"Last-Event-ID {raw[:80]!r} is not an event id of this gateway "
            "(<task_id>/<chunks>): send it back as the stream's last event gave it."
        )
    return task_id, int(n)


def stream_artifact_id(task_id: str) -> str:
    return f"{task_id}-stream"


async def tag(
    events: AsyncIterator[Any], context: ServerCallContext, *, chunks: int = 0
) -> AsyncGenerator[Any, None]:
    """``events`` as they are, each one's SSE id put in the request's queue (``chunks``:
    the task's chunks the caller had before the first)."""
    ids: deque[str] | None = context.state.get(SSE_IDS)
    async for event in events:
        if ids is not None:
            task_id = ""
            if isinstance(event, Task):
                task_id = event.id
            elif isinstance(event, TaskArtifactUpdateEvent):
                task_id = event.task_id
                if event.artifact.artifact_id == stream_artifact_id(task_id):
                    number = event.artifact.metadata.fields.get(CHUNK_NO)
                    chunks = int(number.number_value) if number is not None else chunks + 1
            elif isinstance(event, TaskStatusUpdateEvent):
                task_id = event.task_id
            ids.append(f"{task_id}/{chunks}" if task_id else "")
        yield event


async def continue_after(
    gw: Gateway, task_id: str, after: int, context: ServerCallContext
) -> AsyncGenerator[Any, None]:
    """The events of task ``task_id`` after its chunk ``after`` (a reconnect with
    ``Last-Event-ID``): its later chunks from what reach kept, then its end."""
    stored = await gw.tasks.get(task_id, context)  # None for another caller's
    if stored is None:
        raise TaskNotFoundError
    context_id = stored.task.context_id
    resumed = gw.client.resume(task_id, after=after)
    try:
        async for chunk in resumed:
            artifact = Artifact(
                artifact_id=stream_artifact_id(task_id), name="stream", parts=result_parts(chunk)
            )
            artifact.metadata.update({CHUNK_NO: resumed.seq})
            yield TaskArtifactUpdateEvent(
                task_id=task_id, context_id=context_id, artifact=artifact, append=resumed.seq > 1
            )
        result = resumed.result
    except ChunksNotKept as e:
        raise InvalidParamsError(
            message=f"Cannot continue task {task_id} after Last-Event-ID chunk {after}: {e} "
            "Get the task with tasks/get instead."
        ) from e
    except ReachError as e:
        yield _failed(task_id, context_id, e)
        return
    finally:
        await resumed.aclose()
    if result is not None:
        yield TaskArtifactUpdateEvent(
            task_id=task_id,
            context_id=context_id,
            artifact=Artifact(
                artifact_id=f"{task_id}-result", name="result", parts=result_parts(result)
            ),
            last_chunk=True,
        )
    yield TaskStatusUpdateEvent(
        task_id=task_id,
        context_id=context_id,
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
    )


def _failed(task_id: str, context_id: str, e: ReachError) -> TaskStatusUpdateEvent:
    if isinstance(e, Cancelled):
        state = TaskState.TASK_STATE_CANCELED
    elif isinstance(e, Rejected):
        state = TaskState.TASK_STATE_REJECTED
    else:
        state = TaskState.TASK_STATE_FAILED
    why = Message(
        message_id=new_id(),
        role=Role.ROLE_AGENT,
        task_id=task_id,
        context_id=context_id,
        parts=[Part(text=str(e))],
    )
    why.metadata.update({"reachError": type(e).__name__})
    return TaskStatusUpdateEvent(
        task_id=task_id, context_id=context_id, status=TaskStatus(state=state, message=why)
    )

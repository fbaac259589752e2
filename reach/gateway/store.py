"""The gateway's A2A task store, in Redis: every gateway process of a namespace sees every
task, with its owner (docs/a2a.md, *Tasks: where they are kept*).

A task is a hash ``reach:{ns}:gw:task:<id>`` (owner, context id, the task as protobuf
bytes, its size, its state) and a list ``reach:{ns}:gw:parts:<id>`` of the parts streamed
into its artifacts since its last whole save: a streamed chunk (an artifact update with
``append``) is one ``RPUSH`` of that chunk, not a copy of the whole task, so a long stream
costs the store what it streams. Both live ``ttl_s`` (24 h, as reach's task records).

Bounds, in bytes: a task larger than ``max_task_bytes`` is not stored (:class:`StreamTooLarge`;
the executor ends a stream before it gets there); the finished tasks together hold at most
``max_store_bytes``, the oldest finished first dropped past it. A dropped task keeps its
owner (a few dozen bytes, until its TTL), so it stays its caller's: ``tasks/get`` then
answers from the reach task record for that caller only.

The owner is the caller's name (the token's, :func:`resolve_user_scope`): a task of another
caller is not there for ``get``, ``list``, ``cancel`` or ``subscribe``, in any process.
"""

from __future__ import annotations

import time
from typing import Any

import redis.exceptions as rexc
from a2a.server.cluster.task_store import StoredTask, VersionedTaskStore
from a2a.server.cluster.version import TaskVersion
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.owner_resolver import resolve_user_scope
from a2a.types.a2a_pb2 import (
    Artifact,
    ListTasksRequest,
    ListTasksResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError
from google.protobuf.message import DecodeError

from ..client import Client
from ..errors import StreamTooLarge
from ..keys import Keys
from ..untrusted import safe_int, safe_text

DEFAULT_TTL_S = 86_400.0
DEFAULT_MAX_TASK_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_STORE_BYTES = 256 * 1024 * 1024
TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
_TRIM_BATCH = 64
LIST_SCAN = 1000  # ListTasks with a filter looks through the caller's newest this many
STREAMED = "reachStreamed"  # in a streamed artifact's metadata: chunks kept in Redis only


def is_streamed(event: object) -> bool:
    """An artifact update the gateway's executor made of a streamed chunk: the store appends
    it in Redis, and the SDK's in-memory task does not take it (:func:`install_append_hook`)."""
    return isinstance(event, TaskArtifactUpdateEvent) and STREAMED in event.artifact.metadata


def install_append_hook() -> None:
    """The SDK's task manager appends every artifact update to the task it holds, and its
    active task copies that whole task into every event it hands a subscriber: a stream of
    n chunks cost O(n^2) time and held up to a queue's length of growing copies (GBs for a
    stream never read). Chunks marked :data:`STREAMED` are left out of the task held in
    memory (the store has them, and answers the task whole); every other update is the
    SDK's as before."""
    from a2a.server.tasks import task_manager

    original = task_manager.append_artifact_to_task
    if getattr(original, "_reach_hook", False):
        return

    def append(task: Task, event: TaskArtifactUpdateEvent) -> None:
        if is_streamed(event):
            return
        original(task, event)

    append._reach_hook = True  # type: ignore[attr-defined]
    task_manager.append_artifact_to_task = append


def _text(value: Any) -> str:
    # Read leniently: the caller role may write these keys (docs/security.md).
    return "" if value is None else safe_text(value)


class RedisTaskStore(VersionedTaskStore):
    """The SDK's task store interface over Redis (see the module docstring). Unversioned:
    one process runs a task and writes it (its executor), others only read it, so the
    versions the interface allows for are not used (``TaskVersion.MISSING``)."""

    def __init__(
        self,
        client: Client,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_task_bytes: int = DEFAULT_MAX_TASK_BYTES,
        max_store_bytes: int = DEFAULT_MAX_STORE_BYTES,
    ) -> None:
        self.client = client
        self.ttl_ms = int(ttl_s * 1000)
        self.max_task_bytes = max_task_bytes
        self.max_store_bytes = max_store_bytes
        self._keys: Keys | None = None

    @property
    def keys(self) -> Keys:
        if self._keys is None:
            self._keys = Keys(self.client.namespace)
        return self._keys

    # -- reading ------------------------------------------------------------------------
    async def owner_of(self, task_id: str) -> str | None:
        """The caller a task belongs to; None when no gateway process stored it (or its
        TTL passed)."""
        owner = await self.client.commands.hget(self.keys.gateway_task(task_id), "owner")
        return None if owner is None else _text(owner)

    async def _load(self, task_id: str) -> tuple[dict[str, Any], list[bytes]]:
        pipe = self.client.commands.pipeline(transaction=False)
        pipe.hgetall(self.keys.gateway_task(task_id))
        pipe.lrange(self.keys.gateway_task_parts(task_id), 0, -1)
        fields, parts = await pipe.execute()
        return {_text(k): v for k, v in (fields or {}).items()}, list(parts or [])

    @staticmethod
    def _task_of(fields: dict[str, Any], parts: list[bytes]) -> Task | None:
        blob = fields.get("task")
        if blob is None:
            return None
        task = Task()
        try:
            task.ParseFromString(blob)
        except DecodeError:  # garbled in Redis: as if not there, not an error for everyone
            return None
        for raw in parts:
            more = Artifact()
            try:
                more.ParseFromString(raw)
            except DecodeError:
                continue
            for artifact in task.artifacts:
                if artifact.artifact_id == more.artifact_id:
                    artifact.parts.extend(more.parts)
                    break
            else:
                task.artifacts.append(more)
        return task

    async def get(self, task_id: str, context: ServerCallContext) -> StoredTask | None:
        fields, parts = await self._load(task_id)
        if not fields or _text(fields.get("owner")) != resolve_user_scope(context):
            return None
        task = self._task_of(fields, parts)
        return None if task is None else StoredTask(task, TaskVersion.MISSING)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        owner = resolve_user_scope(context)
        owned = self.keys.gateway_owned(owner)
        cmd = self.client.commands
        await cmd.zremrangebyscore(owned, "-inf", _now_ms() - self.ttl_ms)
        size = params.page_size or 50
        start = int(params.page_token) if params.page_token.isdigit() else 0
        filtered = bool(params.context_id or params.status)
        # Unfiltered, a page is read as it is (the caller's tasks newest first); filtered,
        # the newest LIST_SCAN tasks are looked through.
        first, last = (0, LIST_SCAN - 1) if filtered else (start, start + size - 1)
        ids = [_text(i) for i in await cmd.zrevrange(owned, first, last)]
        tasks: list[Task] = []
        for task_id in ids:
            fields, parts = await self._load(task_id)
            if _text(fields.get("owner")) != owner:
                continue
            t = self._task_of(fields, parts)
            if t is None:
                continue
            if params.context_id and t.context_id != params.context_id:
                continue
            if params.status and t.status.state != params.status:
                continue
            tasks.append(t)
        if filtered:
            total = len(tasks)
            page = tasks[start : start + size]
        else:
            total = int(await cmd.zcard(owned))
            page = tasks
        more = start + size < total
        return ListTasksResponse(
            tasks=page,
            next_page_token=str(start + size) if more else "",
            page_size=size,
            total_size=total,
        )

    # -- writing ------------------------------------------------------------------------
    async def save(
        self,
        task: Task,
        *,
        event: Event | None,
        prev: Task | None,
        prev_version: TaskVersion,
        context: ServerCallContext,
    ) -> TaskVersion:
        owner = resolve_user_scope(context)
        k = self.keys
        key, parts_key = k.gateway_task(task.id), k.gateway_task_parts(task.id)
        if is_streamed(event):
            assert isinstance(event, TaskArtifactUpdateEvent)
            # A chunk of a stream: the chunk only, appended (the task held in memory does
            # not have it: see install_append_hook).
            blob = Artifact(
                artifact_id=event.artifact.artifact_id,
                name=event.artifact.name,
                parts=event.artifact.parts,
            ).SerializeToString()
            # Not a transaction: the auto-pipeline's batch, with whatever else is in flight
            # (one chunk is one round trip at most, shared).
            pipe = self.client.commands.pipeline(transaction=False)
            pipe.hincrby(key, "parts_bytes", len(blob))
            pipe.hincrby(key, "size", len(blob))
            pipe.rpush(parts_key, blob)
            pipe.pexpire(parts_key, self.ttl_ms)
            _, size, *_ = await pipe.execute()
            if safe_int(size) > self.max_task_bytes:
                raise StreamTooLarge(self._too_large(task.id, safe_int(size)))
            return TaskVersion.MISSING
        blob = task.SerializeToString()
        if len(blob) > self.max_task_bytes:
            raise StreamTooLarge(self._too_large(task.id, len(blob)))
        was_owner, was_state, was_size, parts_bytes = await self.client.commands.hmget(
            key, ["owner", "state", "size", "parts_bytes"]
        )
        size = len(blob) + safe_int(parts_bytes, lo=0)
        if was_owner is not None and _text(was_owner) != owner:
            raise TaskNotFoundError  # another caller's: the SDK looked it up as ours first
        finished_before = was_state is not None and safe_int(was_state, -1) in TERMINAL
        finished = task.status.state in TERMINAL
        now = _now_ms()
        pipe = self.client.redis.pipeline(transaction=True)
        pipe.hset(
            key,
            mapping={
                "owner": owner,
                "ctx": task.context_id,
                "task": blob,
                "size": size,
                "state": int(task.status.state),
            },
        )
        pipe.hdel(key, "dropped")
        pipe.pexpire(key, self.ttl_ms)
        owned = k.gateway_owned(owner)
        pipe.zadd(owned, {task.id: now})
        pipe.pexpire(owned, self.ttl_ms)
        if finished_before:
            pipe.zrem(k.gateway_finished, f"{task.id} {_text(was_size) or 0}")
            pipe.decrby(k.gateway_bytes, safe_int(was_size, lo=0))
        if finished:
            pipe.zadd(k.gateway_finished, {f"{task.id} {size}": now})
            pipe.incrby(k.gateway_bytes, size)
        # A counter that is no integer (written by another hand) fails only its own command
        # in the transaction: it is counted again, and the task is saved either way.
        results = await pipe.execute(raise_on_error=False)
        for r in results:
            if isinstance(r, Exception) and not _not_an_integer(r):
                raise r
        held = results[-1] if (finished or finished_before) else 0
        if isinstance(held, Exception):
            held = await self.recount()
        if finished and safe_int(held) > self.max_store_bytes:
            await self.trim()
        return TaskVersion.MISSING

    async def recount(self) -> int:
        """Set the held-bytes counter from the finished tasks' list (their sizes are in
        its members): what it should hold. For a counter found not to be an integer."""
        members = await self.client.commands.zrange(self.keys.gateway_finished, 0, -1)
        held = sum(_size_of(m) for m in members)
        await self.client.commands.set(self.keys.gateway_bytes, held)
        return held

    def _too_large(self, task_id: str, size: int) -> str:
        return (
            f"Task {task_id} holds {size} bytes, over the gateway's limit of "
            f"{self.max_task_bytes} per task (reach gateway --max-task-bytes)."
        )

    async def trim(self) -> int:
        """Forget finished tasks whose TTL passed, then drop the oldest finished ones
        until the store holds at most ``max_store_bytes``; the number dropped."""
        k, cmd = self.keys, self.client.commands
        finished, held = k.gateway_finished, k.gateway_bytes
        dropped = 0
        expired = await cmd.zrangebyscore(finished, "-inf", _now_ms() - self.ttl_ms)
        if expired:
            pipe = self.client.redis.pipeline(transaction=True)
            for member in expired:
                pipe.zrem(finished, member)
                pipe.decrby(held, _size_of(member))
            await pipe.execute(raise_on_error=False)
        now_held = await cmd.get(held)
        if now_held is not None and safe_int(now_held, -1) < 0:
            now_held = await self.recount()
        over = safe_int(now_held) - self.max_store_bytes
        while over > 0:
            oldest = await cmd.zrange(finished, 0, _TRIM_BATCH - 1)
            if not oldest:
                break
            pipe = self.client.redis.pipeline(transaction=True)
            for member in oldest:
                if over <= 0:
                    break
                task_id = _text(member).split(" ", 1)[0]
                pipe.zrem(finished, member)
                pipe.decrby(held, _size_of(member))
                pipe.hdel(k.gateway_task(task_id), "task", "ctx", "parts_bytes")
                pipe.hset(k.gateway_task(task_id), "dropped", 1)
                pipe.delete(k.gateway_task_parts(task_id))
                over -= _size_of(member)
                dropped += 1
            await pipe.execute(raise_on_error=False)
        return dropped

    async def held_bytes(self) -> int:
        """The bytes the finished tasks hold now."""
        return safe_int(await self.client.commands.get(self.keys.gateway_bytes), lo=0)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        if await self.owner_of(task_id) == resolve_user_scope(context):
            await self.client.commands.delete(
                self.keys.gateway_task(task_id), self.keys.gateway_task_parts(task_id)
            )


def _not_an_integer(e: Exception) -> bool:
    return isinstance(e, rexc.ResponseError) and "not an integer" in str(e)


def _size_of(member: Any) -> int:
    _, _, size = _text(member).partition(" ")
    return int(size) if size.isdigit() else 0


def _now_ms() -> int:
    return int(time.time() * 1000)

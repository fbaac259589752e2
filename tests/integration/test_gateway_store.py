"""reach.gateway.store.RedisTaskStore on a real Redis: per caller, paged, bounded in bytes,
chunks appended (docs/a2a.md, *Tasks: where they are kept*)."""

from __future__ import annotations

import pytest
from a2a.auth.user import User
from a2a.server.cluster.version import TaskVersion
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import (
    Artifact,
    ListTasksRequest,
    Part,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
)

from reach.client import Client
from reach.gateway.store import STREAMED, RedisTaskStore

pytestmark = pytest.mark.anyio


class Named(User):
    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.name


def task(i: int, state: TaskState.ValueType, pad: int = 0) -> Task:
    t = Task(id=f"t{i}", context_id=f"c{i % 2}", status=TaskStatus(state=state))
    if pad:
        t.artifacts.append(Artifact(artifact_id=f"t{i}-result", parts=[Part(text="x" * pad)]))
    return t


async def save(
    store: RedisTaskStore, t: Task, ctx: ServerCallContext, event: object = None
) -> None:
    await store.save(t, event=event, prev=None, prev_version=TaskVersion.MISSING, context=ctx)  # type: ignore[arg-type]


async def test_per_caller_paged_and_bounded(redis_url: str, ns: str) -> None:
    a, b = ServerCallContext(user=Named("a")), ServerCallContext(user=Named("b"))
    async with Client(redis_url=redis_url, namespace=ns) as c:
        store = RedisTaskStore(c, max_store_bytes=30_000)
        await save(store, task(0, TaskState.TASK_STATE_WORKING, 20_000), a)  # not finished
        for i in range(1, 5):
            await save(store, task(i, TaskState.TASK_STATE_COMPLETED, 10_000), a)
        assert await store.get("t0", a) is not None  # running: never dropped
        assert await store.get("t1", a) is None and await store.get("t2", a) is None
        assert await store.get("t4", a) is not None and await store.get("t4", b) is None
        assert await store.owner_of("t1") == "a"  # dropped, still a's
        assert 0 < await store.held_bytes() <= 30_000
        page = await store.list(ListTasksRequest(page_size=2), a)
        assert [t.id for t in page.tasks] == ["t4", "t3"] and page.next_page_token == "2"
        assert page.total_size == 5
        odd = await store.list(ListTasksRequest(context_id="c1"), a)
        assert [t.id for t in odd.tasks] == ["t3"]  # t1 dropped
        assert (await store.list(ListTasksRequest(), b)).tasks == []


async def test_streamed_chunks_are_appended_and_answered_whole(redis_url: str, ns: str) -> None:
    a = ServerCallContext(user=Named("a"))
    async with Client(redis_url=redis_url, namespace=ns) as c:
        store = RedisTaskStore(c, max_task_bytes=50_000)
        t = task(9, TaskState.TASK_STATE_WORKING)
        await save(store, t, a)
        for k in range(3):
            event = TaskArtifactUpdateEvent(
                task_id="t9",
                context_id="c1",
                append=k > 0,
                artifact=Artifact(
                    artifact_id="t9-stream", name="stream", parts=[Part(text=str(k))]
                ),
            )
            event.artifact.metadata.update({STREAMED: True})
            await save(store, t, a, event)
        t.status.state = TaskState.TASK_STATE_COMPLETED  # the task in memory: no chunks
        await save(store, t, a)
        stored = await store.get("t9", a)
        assert stored is not None
        [stream] = [x for x in stored.task.artifacts if x.name == "stream"]
        assert [p.text for p in stream.parts] == ["0", "1", "2"]


async def test_garbled_values_in_redis_break_no_save(redis_url: str, ns: str) -> None:
    """The store's keys are writable by the caller role (docs/security.md): a counter that
    is no integer, a task hash with garbage in it, must not stop every caller's saves."""
    a = ServerCallContext(user=Named("a"))
    async with Client(redis_url=redis_url, namespace=ns) as c:
        store = RedisTaskStore(c, max_store_bytes=30_000)
        k = store.keys
        await c.redis.set(k.gateway_bytes, b"\xff not a number")
        await save(store, task(1, TaskState.TASK_STATE_COMPLETED, 10_000), a)
        # counted again from the finished tasks: the one just saved
        assert 10_000 < await store.held_bytes() < 11_000
        await c.redis.set(k.gateway_bytes, "abc")
        for i in range(2, 5):  # over the bound: trimmed although the counter was garbage
            await save(store, task(i, TaskState.TASK_STATE_COMPLETED, 10_000), a)
        assert await store.get("t1", a) is None and await store.get("t4", a) is not None
        assert 0 < await store.held_bytes() <= 30_000
        # a task hash with garbage in every field: read as missing, saved over
        await c.redis.hset(
            k.gateway_task("t9"),
            mapping={
                "owner": "a",
                "task": b"\xff\x00garbage",
                "state": "x",
                "size": "y",
                "parts_bytes": b"\xfe",
            },
        )
        assert await store.get("t9", a) is None
        await save(store, task(9, TaskState.TASK_STATE_COMPLETED), a)
        assert (await store.get("t9", a)) is not None
        page = await store.list(ListTasksRequest(), a)
        assert "t9" in [t.id for t in page.tasks]

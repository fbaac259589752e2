"""Two ``reach gateway`` processes on one Redis, callers with the official ``a2a-sdk``
client: a task belongs to its caller in every process (get, cancel, subscribe), and task
state lives in Redis where every process reads it (docs/a2a.md, *Tasks*)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from a2a.client.client import Client as A2AClient
from a2a.helpers.proto_helpers import get_data_parts, new_data_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError

from reach.client import Client
from reach.embedded import free_port
from reach.envelope import new_id
from reach.keys import Keys
from tests.support.agents_messaging import wait_eligible
from tests.support.gateway import a2a_client, start_gateway_process, stop_process, wait_card
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio
ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdefgh"
TOKENS = f"alice:{ALICE},bob:{BOB}"


def message(payload: object) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=new_id(), parts=[new_data_part(payload)])
    )


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_gateway")
    try:
        yield w
    finally:
        w.stop_all()


@pytest.fixture
async def two_gateways(
    redis_url: str, ns: str, tmp_path: Path, workers: Workers
) -> AsyncIterator[tuple[str, str]]:
    """Two gateway processes on the namespace, with a slow and an echo agent (processes)."""
    workers.start("slow_agent")
    workers.start("echo_agent")
    procs, urls = [], []
    for i in range(2):
        port = free_port()
        log = tmp_path / f"gateway{i}.log"
        proc = start_gateway_process(
            redis_url, ns, port, "--timeout-s", "120", log=log,
            env={"REACH_GATEWAY_TOKENS": TOKENS},
        )  # fmt: skip
        procs.append((proc, log))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        async with httpx.AsyncClient(timeout=30) as h:
            for (proc, log), url in zip(procs, urls, strict=True):
                await wait_card(h, url, proc, log)
        async with Client(redis_url=redis_url, namespace=ns) as c:

            async def served() -> bool:
                return bool((await c.view.candidates("gw.slow"))[0]) and bool(
                    (await c.view.candidates("gw.echo"))[0]
                )

            await wait_until(served, timeout_s=60, what="the agents to register")
        yield urls[0], urls[1]
    finally:
        for proc, log in procs:
            assert stop_process(proc) == 0, log.read_text()


async def test_another_caller_cannot_get_cancel_or_subscribe_in_another_process(
    two_gateways: tuple[str, str], redis_url: str, ns: str
) -> None:
    one, two = two_gateways
    auth = {"Authorization": f"Bearer {ALICE}"}
    async with (
        httpx.AsyncClient(headers=auth, timeout=60) as ha,
        httpx.AsyncClient(headers={"Authorization": f"Bearer {BOB}"}, timeout=60) as hb,
        Client(redis_url=redis_url, namespace=ns) as reach_client,
    ):
        alice1, _ = await a2a_client(ha, f"{one}/caps/gw.slow", streaming=False)
        alice2, _ = await a2a_client(ha, f"{two}/caps/gw.slow", streaming=False)
        bob2, _ = await a2a_client(hb, f"{two}/caps/gw.slow")
        req = message(60)
        req.configuration.return_immediately = True
        [first] = [e async for e in alice1.send_message(req)]
        task_id = first.task.id

        async def running() -> bool:
            return (await reach_client.task(task_id)).status == "running"

        await wait_until(running, timeout_s=60, what="the slow handler to start")
        # bob, through the other process: the task is not there for him
        with pytest.raises(TaskNotFoundError):
            await bob2.get_task(GetTaskRequest(id=task_id))
        with pytest.raises(TaskNotFoundError):
            await bob2.cancel_task(CancelTaskRequest(id=task_id))
        with pytest.raises(TaskNotFoundError):
            async for _ in bob2.subscribe(SubscribeToTaskRequest(id=task_id)):
                pass
        assert (await reach_client.task(task_id)).status == "running"  # untouched
        # alice, through the other process: her task, from the store every process reads
        got = await alice2.get_task(GetTaskRequest(id=task_id))
        assert got.id == task_id and got.status.state == TaskState.TASK_STATE_WORKING
        done = await alice2.cancel_task(CancelTaskRequest(id=task_id))
        assert done.status.state == TaskState.TASK_STATE_CANCELED
        assert (await reach_client.task(task_id)).status == "cancelled"

        async def canceled_in_one() -> bool:
            t = await alice1.get_task(GetTaskRequest(id=task_id))
            return bool(t.status.state == TaskState.TASK_STATE_CANCELED)

        await wait_until(canceled_in_one, timeout_s=60, what="the first process to end it")
        with pytest.raises(TaskNotFoundError):  # finished: still not bob's
            await bob2.get_task(GetTaskRequest(id=task_id))


async def test_a_finished_task_is_read_from_every_process(
    two_gateways: tuple[str, str],
) -> None:
    one, two = two_gateways
    auth = {"Authorization": f"Bearer {ALICE}"}
    async with httpx.AsyncClient(headers=auth, timeout=60) as ha:
        a1, _ = await a2a_client(ha, f"{one}/caps/gw.echo", streaming=False)
        a2, _ = await a2a_client(ha, f"{two}/caps/gw.echo", streaming=False)
        [resp] = [e async for e in a1.send_message(message({"k": "v"}))]
        assert resp.task.status.state == TaskState.TASK_STATE_COMPLETED
        t = await a2.get_task(GetTaskRequest(id=resp.task.id))
        assert t.status.state == TaskState.TASK_STATE_COMPLETED
        assert len(t.history) == 1  # the gateway's own task (its history), not the record's


async def test_a_task_run_by_another_process_is_followed_by_subscribe(
    two_gateways: tuple[str, str], redis_url: str, ns: str
) -> None:
    """SubscribeToTask through the process that does not run the task: the task, then each
    change of its reach task (``Client.watch``) as status updates, progress as a working
    status with its note, then the finished task with its result."""
    one, two = two_gateways
    agent = Workers(redis_url, ns, "tests.support.agents_watch")
    agent.start("app", "--concurrency", "1", "--prefetch", "0")
    auth = {"Authorization": f"Bearer {ALICE}"}
    try:
        async with (
            httpx.AsyncClient(headers=auth, timeout=60) as ha,
            Client(redis_url=redis_url, namespace=ns) as reach_client,
        ):
            await wait_eligible(reach_client, "watch.steps", ["watch-1"], timeout=60)
            held = await reach_client.send("watch.hold", "gw")  # the agent's only slot
            a1, _ = await a2a_client(ha, f"{one}/caps/watch.steps", streaming=False)
            a2, _ = await a2a_client(ha, f"{two}/caps/watch.steps")
            req = message([[0.5, "halfway"], [1.0, "done"]])
            req.configuration.return_immediately = True
            [first] = [e async for e in a1.send_message(req)]
            task_id = first.task.id
            events = a2.subscribe(SubscribeToTaskRequest(id=task_id))
            head = await anext(events)  # the watch has read the record: nothing is missed
            assert head.task.id == task_id
            assert head.task.status.state == TaskState.TASK_STATE_SUBMITTED
            await reach_client.commands.hset(Keys(ns).effects("gate"), "gw", 1)
            seen = []
            async for e in events:
                kind = e.WhichOneof("payload")
                if kind == "status_update":
                    u = e.status_update
                    note = u.status.message.parts[0].text if u.status.message.parts else ""
                    seen.append((TaskState.Name(u.status.state), note))
                else:
                    assert kind == "task"
                    seen.append((TaskState.Name(e.task.status.state), "final"))
                    assert [a.name for a in e.task.artifacts] == ["result"]
            assert seen == [
                ("TASK_STATE_WORKING", ""),
                ("TASK_STATE_WORKING", "50% halfway"),
                ("TASK_STATE_WORKING", "100% done"),
                ("TASK_STATE_COMPLETED", "final"),
            ]
            assert (await reach_client.task(held)).status == "succeeded"
    finally:
        agent.stop_all()


async def test_another_callers_context_id_opens_a_session_of_ones_own(
    two_gateways: tuple[str, str], redis_url: str, ns: str
) -> None:
    """bob sends under alice's contextId through the other gateway process, to a worker
    process keeping a session history: he gets a session of his own under that id,
    never alice's history."""
    one, two = two_gateways
    notes = Workers(redis_url, ns, "tests.support.agents_gateway")
    notes.start("notes_agent")
    try:
        async with (
            httpx.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"}, timeout=60) as ha,
            httpx.AsyncClient(headers={"Authorization": f"Bearer {BOB}"}, timeout=60) as hb,
            Client(redis_url=redis_url, namespace=ns) as reach_client,
        ):
            await wait_eligible(reach_client, "gw.notes", ["gw-notes-1"], timeout=60)
            alice, _ = await a2a_client(ha, f"{one}/caps/gw.notes", streaming=False)
            bob, _ = await a2a_client(hb, f"{two}/caps/gw.notes", streaming=False)

            async def note(a2a: A2AClient, text: str) -> dict[str, object]:
                req = message(text)
                req.message.context_id = "ctx-shared"
                [resp] = [e async for e in a2a.send_message(req)]
                assert resp.task.status.state == TaskState.TASK_STATE_COMPLETED
                assert resp.task.context_id == "ctx-shared"
                [art] = [a for a in resp.task.artifacts if a.name == "result"]
                got: dict[str, object] = get_data_parts(art.parts)[0]
                return got

            await note(alice, "alice's secret")
            mine = await note(alice, "alice's second")
            assert mine["history"] == ["alice's secret", "alice's second"]
            theirs = await note(bob, "bob's note")
            assert theirs == {"history": ["bob's note"], "session": "a2a:bob:ctx-shared"}
    finally:
        notes.stop_all()


def rss_bytes(pid: int) -> int:
    """The resident set of process ``pid`` now (Linux: /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.timeout(600)
async def test_finished_tasks_are_held_in_redis_bounded_in_bytes(
    redis_url: str, ns: str, tmp_path: Path, workers: Workers
) -> None:
    """40 finished tasks of ~900 kB each: the gateway processes do not hold them (their RSS
    stays within 30 MB of where it was after the first five; 63 MB more
    for the 35 after them when the store was in memory), the store in Redis holds at
    most --max-store-bytes of them, and the other process reads them; the oldest, dropped,
    stay their caller's."""
    workers.start("echo_agent")
    procs, urls = [], []
    bound = 8 * 1024 * 1024
    for i in range(2):
        port = free_port()
        log = tmp_path / f"gateway{i}.log"
        extra = ("--max-store-bytes", str(bound)) if i == 0 else ()
        proc = start_gateway_process(
            redis_url, ns, port, "--timeout-s", "120", *extra, log=log,
            env={"REACH_GATEWAY_TOKENS": TOKENS},
        )  # fmt: skip
        procs.append((proc, log))
        urls.append(f"http://127.0.0.1:{port}")
    big = "x" * 900_000
    try:
        async with (
            httpx.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"}, timeout=120) as ha,
            httpx.AsyncClient(headers={"Authorization": f"Bearer {BOB}"}, timeout=120) as hb,
        ):
            for (proc, log), url in zip(procs, urls, strict=True):
                await wait_card(ha, url, proc, log)
            a1, _ = await a2a_client(ha, f"{urls[0]}/caps/gw.echo", streaming=False)
            a2, _ = await a2a_client(ha, f"{urls[1]}/caps/gw.echo", streaming=False)
            b2, _ = await a2a_client(hb, f"{urls[1]}/caps/gw.echo", streaming=False)
            ids = []
            base = 0
            for i in range(40):
                [resp] = [e async for e in a1.send_message(message({"i": i, "pad": big}))]
                assert resp.task.status.state == TaskState.TASK_STATE_COMPLETED
                ids.append(resp.task.id)
                if i == 4:
                    base = rss_bytes(procs[0][0].pid)
            grown = rss_bytes(procs[0][0].pid) - base
            assert grown < 30 * 1024 * 1024, f"the gateway grew {grown} bytes for 35 tasks"
            async with Client(redis_url=redis_url, namespace=ns) as c:
                k = Keys(ns)
                held = int(await c.commands.get(k.gateway_bytes) or 0)
                # every task's state lives in Redis for a day at most, the dropped ones too
                ttls = [await c.commands.pttl(k.gateway_task(t)) for t in (ids[0], ids[-1])]
                ttls.append(await c.commands.pttl(k.gateway_owned("alice")))
            assert 0 < held <= bound, held
            assert all(0 < t <= 86_400_000 for t in ttls), ttls
            last = await a2.get_task(GetTaskRequest(id=ids[-1]))  # the other process
            assert len(last.history) == 1 and last.artifacts  # from the gateway's store
            first = await a2.get_task(GetTaskRequest(id=ids[0]))  # dropped: the record
            assert first.status.state == TaskState.TASK_STATE_COMPLETED and not first.history
            for task_id in (ids[0], ids[-1]):
                with pytest.raises(TaskNotFoundError):
                    await b2.get_task(GetTaskRequest(id=task_id))
    finally:
        for proc, log in procs:
            assert stop_process(proc) == 0, log.read_text()

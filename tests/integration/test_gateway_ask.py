"""A2A human input through the gateway, with the official ``a2a-sdk`` client and a real
`reach worker` process: a task whose handler asks (``ctx.ask``) ends the call
``input-required`` with the question as its status message (``tasks/get`` says the same);
a ``message/send`` on that task answers it with its text or data part and the handler
finishes with the answer; two asks are two turns."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from a2a.helpers.proto_helpers import (
    get_data_parts,
    get_text_parts,
    new_data_part,
    new_text_part,
)
from a2a.types.a2a_pb2 import GetTaskRequest, Part, SendMessageRequest, Task, TaskState

from reach.client import Client
from reach.gateway import Gateway, Tokens
from tests.integration.test_gateway import TOKEN, final_task, message, result_of
from tests.support.agents_ask import REFUND, TWICE
from tests.support.agents_messaging import wait_eligible
from tests.support.gateway import a2a_client, gateway_served, http
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_ask")
    yield w
    w.stop_all()


@pytest.fixture
async def gateway(workers: Workers, redis_url: str, ns: str) -> AsyncIterator[tuple[str, Client]]:
    workers.start("ask_a")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, REFUND, ["ask-a"])
        gw = Gateway(Client(redis_url=redis_url, namespace=ns), tokens=Tokens([("tests", TOKEN)]))
        async with gateway_served(gw) as url:
            yield url, client


def on_task(task: Task, *parts: Part) -> SendMessageRequest:
    req = message(*parts)
    req.message.task_id, req.message.context_id = task.id, task.context_id
    return req


async def test_input_required_then_answered_by_a_message_on_the_task(
    gateway: tuple[str, Client],
) -> None:
    url, client = gateway
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/{REFUND}", streaming=False)
        task, _ = await final_task(a2a.send_message(message(new_data_part({"order": "G-1"}))))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert get_text_parts(task.status.message.parts) == ["Refund order G-1?"]
        assert (await client.task(task.id)).status == "input_required"
        got = await a2a.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert get_text_parts(got.status.message.parts) == ["Refund order G-1?"]

        done, _ = await final_task(a2a.send_message(on_task(task, new_text_part("yes"))))
        assert done.id == task.id
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        assert result_of(done) == {"answer": "yes", "agent": "ask-a"}
        assert (await client.task(task.id)).status == "succeeded"
        # a finished task takes no more messages
        with pytest.raises(Exception, match="terminal state"):
            await final_task(a2a.send_message(on_task(task, new_text_part("again"))))


async def test_two_questions_two_turns_with_a_data_answer(gateway: tuple[str, Client]) -> None:
    url, _ = gateway
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/{TWICE}", streaming=False)
        first, _ = await final_task(a2a.send_message(message(new_data_part({}))))
        assert first.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert get_text_parts(first.status.message.parts) == ["First: which colour?"]
        second, _ = await final_task(a2a.send_message(on_task(first, new_text_part("red"))))
        assert second.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert get_text_parts(second.status.message.parts) == ["Second: how many red ones?"]
        done, _ = await final_task(a2a.send_message(on_task(first, new_data_part({"n": 4}))))
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        assert result_of(done) == ["red", {"n": 4}]


async def test_a_streaming_caller_sees_input_required(gateway: tuple[str, Client]) -> None:
    url, _ = gateway
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/{REFUND}")
        events = [e async for e in a2a.send_message(message(new_data_part({"order": "S-5"})))]
        last = events[-1]
        status = last.task.status if last.HasField("task") else last.status_update.status
        assert status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert get_text_parts(status.message.parts) == ["Refund order S-5?"]
        task_id = last.task.id if last.HasField("task") else last.status_update.task_id
        plain, _ = await a2a_client(h, f"{url}/caps/{REFUND}", streaming=False)
        task = await plain.get_task(GetTaskRequest(id=task_id))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        events = [e async for e in a2a.send_message(on_task(task, new_data_part(True)))]
        final = events[-1]
        assert final.HasField("status_update"), final
        assert final.status_update.status.state == TaskState.TASK_STATE_COMPLETED
        [result] = [
            e.artifact_update.artifact
            for e in events
            if e.HasField("artifact_update") and e.artifact_update.artifact.name == "result"
        ]
        assert get_data_parts(result.parts) == [{"answer": True, "agent": "ask-a"}]


async def test_a_task_cancelled_while_it_waits_reads_canceled(gateway: tuple[str, Client]) -> None:
    """Between the question and an answer nobody follows the task: cancelled meanwhile
    (reach cancel), tasks/get reads it from reach, canceled; a message on it is refused."""
    url, client = gateway
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/{REFUND}", streaming=False)
        task, _ = await final_task(a2a.send_message(message(new_data_part({"order": "C-1"}))))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert (await client.cancel(task.id)).cancelled
        got = await a2a.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == TaskState.TASK_STATE_CANCELED
        assert got.context_id == task.context_id
        with pytest.raises(Exception, match="waits for no answer"):
            await final_task(a2a.send_message(on_task(task, new_text_part("late"))))

"""reach gateway: the official ``a2a-sdk`` client, knowing nothing of reach, resolves the
cards of capabilities and agents and calls them (send, stream, get, cancel), against
real agents on a real Redis, through a gateway served by uvicorn (docs/a2a.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from a2a.helpers.proto_helpers import get_data_parts, get_text_parts, new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError

from reach import Agent, Context
from reach.client import Client
from reach.envelope import new_id
from reach.gateway import Gateway, Tokens
from tests.support.agents_gateway import echo_agent, notes_agent, slow_agent, words_agent
from tests.support.agents_messaging import serving
from tests.support.gateway import a2a_client, gateway_served, http, resolve
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio
TOKEN = "t0ken-of-the-tests-0123456789"


def agents() -> list[Agent]:
    return [echo_agent(), words_agent(), slow_agent()]


def message(*parts: Part, **metadata: Any) -> SendMessageRequest:
    msg = Message(role=Role.ROLE_USER, message_id=new_id(), parts=list(parts))
    if metadata:
        msg.metadata.update(metadata)
    return SendMessageRequest(message=msg)


async def final_task(events: AsyncIterator[StreamResponse]) -> tuple[Task, list[StreamResponse]]:
    seen = [e async for e in events]
    last = seen[-1]
    assert last.HasField("task") or last.HasField("status_update"), last
    return last.task, seen


def result_of(task: Task) -> Any:
    [art] = [a for a in task.artifacts if a.name == "result"]
    data = get_data_parts(art.parts)
    return data[0] if data else get_text_parts(art.parts)[0]


@pytest.fixture
async def fabric(redis_url: str, ns: str) -> AsyncIterator[tuple[str, Client]]:
    async with serving(redis_url, ns, *agents()) as client:
        gw = Gateway(Client(redis_url=redis_url, namespace=ns), tokens=Tokens([("tests", TOKEN)]))
        async with gateway_served(gw) as url:
            yield url, client


async def test_cards_are_resolved_and_follow_agents(
    fabric: tuple[str, Client], redis_url: str, ns: str
) -> None:
    url, _ = fabric
    async with http() as h:
        card = await resolve(h, f"{url}/caps/gw.echo")
        assert card.name == "gw.echo"
        assert card.supported_interfaces[0].url == f"{url}/caps/gw.echo"
        assert card.supported_interfaces[0].protocol_binding == "JSONRPC"
        assert card.capabilities.streaming
        assert card.skills[0].id == "gw.echo" and card.skills[0].name == "Echo"
        assert "bearer" in card.security_schemes
        agent = await resolve(h, f"{url}/agents/gw-echo-1")
        assert agent.name == "gw-echo-1" and agent.description == "Echoes what it is given."
        assert agent.supported_interfaces[0].url == f"{url}/agents/gw-echo-1"
        assert {s.id for s in agent.skills} == {"gw.echo", "gw.fail"}
        top = await resolve(h, url)
        assert {"gw.echo", "gw.fail", "gw.words", "gw.slow"} <= {s.id for s in top.skills}
        # an agent that comes: its capability's card appears, and its own
        assert (await h.get(f"{url}/caps/gw.late/.well-known/agent-card.json")).status_code == 404
        late = Agent("gw-late-1", capabilities=["gw.late"])

        @late.handler("gw.late")
        async def h_(payload: Any, ctx: Context) -> Any:
            return "here"

        async with serving(redis_url, ns, late):
            assert (await resolve(h, f"{url}/caps/gw.late")).name == "gw.late"
            assert (await resolve(h, f"{url}/agents/gw-late-1")).name == "gw-late-1"
        # ... and goes: gone from the capability's card once deregistered

        async def gone() -> bool:
            r = await h.get(f"{url}/caps/gw.late/.well-known/agent-card.json")
            return r.status_code == 404

        await wait_until(gone, what="the card of a capability without agents to go")
        r = await h.get(f"{url}/agents/gw-late-1/.well-known/agent-card.json")
        assert r.status_code == 404


async def test_send_a_data_part_and_get_the_task(fabric: tuple[str, Client]) -> None:
    url, client = fabric
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/gw.echo", streaming=False)
        req = message(new_data_part({"text": "hi", "n": 2}))
        req.message.context_id = "ctx-1"
        task, _ = await final_task(a2a.send_message(req))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        res = result_of(task)
        assert res["echo"] == {"text": "hi", "n": 2}
        # the session is the caller's: scoped by its name (the A2A contextId is kept)
        assert res["session"] == "a2a:tests:ctx-1" and task.context_id == "ctx-1"
        assert res["msg_id"] == task.id  # the A2A task id is the reach msg_id
        assert res["caller"] == "tests"
        assert (await client.task(task.id)).status == "succeeded"
        got = await a2a.get_task(GetTaskRequest(id=task.id))
        assert got.status.state == TaskState.TASK_STATE_COMPLETED
        assert result_of(got)["echo"] == {"text": "hi", "n": 2}


async def test_text_parts_json_or_text_by_the_declared_modes(fabric: tuple[str, Client]) -> None:
    url, _ = fabric
    async with http(TOKEN) as h:
        a2a, card = await a2a_client(h, f"{url}/caps/gw.echo", streaming=False)
        assert list(card.default_input_modes) == ["application/json"]
        task, _ = await final_task(a2a.send_message(message(new_text_part('{"a": [1, 2]}'))))
        assert result_of(task)["echo"] == {"a": [1, 2]}
        with pytest.raises(InvalidParamsError, match="takes JSON input"):
            await final_task(a2a.send_message(message(new_text_part("not json"))))
        words, card = await a2a_client(h, f"{url}/caps/gw.words", streaming=False)
        assert list(card.default_input_modes) == ["text/plain"]
        task, _ = await final_task(words.send_message(message(new_text_part('{"a": 1}'))))
        assert result_of(task) == "done"  # a string result: a text part
        stream = [a for a in task.artifacts if a.name == "stream"]
        assert [p.text for p in stream[0].parts] == ['{"a":', "1}"]  # text kept as text


async def test_stream_chunks_as_artifact_updates(fabric: tuple[str, Client]) -> None:
    url, _ = fabric
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/gw.words")
        events = [e async for e in a2a.send_message(message(new_text_part("one two three")))]
        chunks = [
            p.text
            for e in events
            if e.HasField("artifact_update") and e.artifact_update.artifact.name == "stream"
            for p in e.artifact_update.artifact.parts
        ]
        assert chunks == ["one", "two", "three"]
        appends = [
            e.artifact_update.append
            for e in events
            if e.HasField("artifact_update") and e.artifact_update.artifact.name == "stream"
        ]
        assert appends == [False, True, True]
        assert events[0].task.status.state == TaskState.TASK_STATE_WORKING  # with the 1st chunk
        states = [e.status_update.status.state for e in events if e.HasField("status_update")]
        assert states == [TaskState.TASK_STATE_COMPLETED]
        # a handler that does not stream: one final event, the completed task with its result
        echo, _ = await a2a_client(h, f"{url}/caps/gw.echo")
        [only] = [e async for e in echo.send_message(message(new_data_part([1])))]
        assert only.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert result_of(only.task)["echo"] == [1]


async def test_the_keys_of_the_task_store_are_in_the_key_layout(
    fabric: tuple[str, Client], ns: str
) -> None:
    """Every key the gateway's task store leaves after a streamed and a plain task has a
    form in reach.keys.LAYOUT (so ``reach doctor`` does not call them unknown)."""
    from reach.keys import form_of

    url, client = fabric
    async with http(TOKEN) as h:
        words, _ = await a2a_client(h, f"{url}/caps/gw.words")
        [e async for e in words.send_message(message(new_text_part("one two")))]
        echo, _ = await a2a_client(h, f"{url}/caps/gw.echo", streaming=False)
        [e async for e in echo.send_message(message(new_data_part([1])))]
    found = [
        k.decode() if isinstance(k, bytes) else str(k)
        async for k in client.commands.scan_iter(match=f"reach:{{{ns}}}:gw:*")
    ]
    assert not [k for k in found if form_of(k, ns) is None], found
    builders = {f.builder for k in found if (f := form_of(k, ns)) is not None}
    assert builders >= {"gateway_task", "gateway_finished", "gateway_bytes", "gateway_owned"}


async def test_return_immediately_then_get(fabric: tuple[str, Client]) -> None:
    """A caller that does not wait gets the task submitted, and follows it with tasks/get:
    working while the handler runs (from the reach task record), then completed."""
    url, _ = fabric
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/gw.slow", streaming=False)
        req = message(new_data_part(1.0))
        req.configuration.return_immediately = True
        [first] = [e async for e in a2a.send_message(req)]
        assert first.task.status.state == TaskState.TASK_STATE_SUBMITTED
        task_id = first.task.id

        async def state() -> int:
            return (await a2a.get_task(GetTaskRequest(id=task_id))).status.state

        await wait_until(
            lambda: _is(state, TaskState.TASK_STATE_WORKING), what="the task to be working"
        )
        await wait_until(
            lambda: _is(state, TaskState.TASK_STATE_COMPLETED), what="the task to complete"
        )
        got = await a2a.get_task(GetTaskRequest(id=task_id))
        assert result_of(got) == "late"


async def _is(probe: Any, want: int) -> bool:
    return bool(await probe() == want)


async def test_agents_route_to_that_agent(fabric: tuple[str, Client]) -> None:
    url, _ = fabric
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/agents/gw-echo-1", streaming=False)
        with pytest.raises(InvalidParamsError, match="name one in the message's metadata"):
            await final_task(a2a.send_message(message(new_data_part(1))))
        task, _ = await final_task(
            a2a.send_message(message(new_data_part(1), capability="gw.echo"))
        )
        assert result_of(task)["echo"] == 1
        # the gateway's own endpoint: the capability named in metadata
        top, _ = await a2a_client(h, url, streaming=False)
        task, _ = await final_task(
            top.send_message(message(new_data_part(2), capability="gw.echo"))
        )
        assert result_of(task)["echo"] == 2


async def test_failures_map_to_task_states_and_errors(fabric: tuple[str, Client]) -> None:
    url, _ = fabric
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/gw.fail", streaming=False)
        task, _ = await final_task(a2a.send_message(message(new_data_part("reject"))))
        assert task.status.state == TaskState.TASK_STATE_REJECTED
        assert "not for me" in task.status.message.parts[0].text
        task, _ = await final_task(a2a.send_message(message(new_data_part("boom"))))
        assert task.status.state == TaskState.TASK_STATE_FAILED
        assert "it broke" in task.status.message.parts[0].text
        # the deadline from the header: expired is failed
        slow, _ = await a2a_client(h, f"{url}/caps/gw.slow", streaming=False)
        h.headers["Reach-Timeout-S"] = "0.3"
        task, _ = await final_task(slow.send_message(message(new_data_part(3))))
        assert task.status.state == TaskState.TASK_STATE_FAILED
        del h.headers["Reach-Timeout-S"]
        # no agent: a JSON-RPC error naming the reach error, and no task left running
        body = {
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"messageId": "m1", "role": "ROLE_USER",
                                   "parts": [{"data": 1}]}},
        }  # fmt: skip
        r = await h.post(f"{url}/caps/gw.nobody", json=body, headers={"A2A-Version": "1.0"})
        err = r.json()["error"]
        assert err["code"] == -32603 and "gw.nobody" in err["message"], err
        r = await h.post(f"{url}/caps/Not%20A%20Cap", json=body, headers={"A2A-Version": "1.0"})
        assert r.json()["error"]["code"] == -32602
        # unknown task; a finished task is not cancelable
        with pytest.raises(TaskNotFoundError):
            await a2a.get_task(GetTaskRequest(id=new_id()))
        with pytest.raises(TaskNotFoundError):
            await a2a.cancel_task(CancelTaskRequest(id=new_id()))
        with pytest.raises(TaskNotCancelableError, match="has finished"):
            await a2a.cancel_task(CancelTaskRequest(id=task.id))


async def test_cancel_a_running_task(fabric: tuple[str, Client]) -> None:
    """tasks/cancel is reach's cancellation: the handler is told, the task ends canceled
    for the A2A caller (its waiting send and tasks/get) and cancelled in reach."""
    url, client = fabric
    async with http(TOKEN) as h:
        a2a, _ = await a2a_client(h, f"{url}/caps/gw.slow", streaming=False)
        req = message(new_data_part(60))
        req.configuration.return_immediately = True
        [first] = [e async for e in a2a.send_message(req)]
        task_id = first.task.id

        async def running() -> bool:
            return (await client.task(task_id)).status == "running"

        await wait_until(running, what="the slow handler to start")
        got = await a2a.cancel_task(CancelTaskRequest(id=task_id))
        assert got.status.state == TaskState.TASK_STATE_CANCELED
        assert (await a2a.get_task(GetTaskRequest(id=task_id))).status.state == (
            TaskState.TASK_STATE_CANCELED
        )
        assert (await client.task(task_id)).status == "cancelled"
        with pytest.raises(TaskNotCancelableError):  # cancelled is finished too
            await a2a.cancel_task(CancelTaskRequest(id=task_id))


async def test_cancel_ends_a_waiting_stream(redis_url: str, ns: str) -> None:
    """A caller streaming a task that another request cancels gets its end: canceled."""
    async with serving(redis_url, ns, slow_agent()):
        gw = Gateway(Client(redis_url=redis_url, namespace=ns))
        async with gateway_served(gw) as url, http() as h:
            a2a, _ = await a2a_client(h, f"{url}/caps/gw.slow")
            events: list[StreamResponse] = []

            async def send() -> None:
                async for e in a2a.send_message(message(new_data_part(60))):
                    events.append(e)

            async with anyio.create_task_group() as tg:
                tg.start_soon(send)

                async def waiting() -> str:
                    return next(iter(gw.running), "")  # the gateway waits for its outcome

                task_id = await wait_until(waiting, what="the gateway to wait for the run")
                got = await a2a.cancel_task(CancelTaskRequest(id=task_id))
                assert got.status.state == TaskState.TASK_STATE_CANCELED
        [end] = events  # nothing was shown before: the task, canceled
        assert end.task.status.state == TaskState.TASK_STATE_CANCELED, end
        assert "tasks/cancel" in end.task.status.message.parts[0].text


async def test_v03_method_names(fabric: tuple[str, Client]) -> None:
    url, _ = fabric
    body = {
        "jsonrpc": "2.0", "id": 7, "method": "message/send",
        "params": {"message": {"messageId": "m2", "role": "user", "kind": "message",
                               "parts": [{"kind": "data", "data": {"x": 1}}]}},
    }  # fmt: skip
    async with http(TOKEN) as h:
        r = await h.post(f"{url}/caps/gw.echo", json=body)
        res = r.json()["result"]
        assert res["status"]["state"] == "completed", res
        got = await h.post(
            f"{url}/caps/gw.echo",
            json={"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"id": res["id"]}},
        )
        assert got.json()["result"]["status"]["state"] == "completed"


async def test_authentication(fabric: tuple[str, Client]) -> None:
    url, _ = fabric
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    async with http(headers={"A2A-Version": "1.0"}) as h:
        r = await h.post(f"{url}/caps/gw.echo", json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        r = await h.post(
            f"{url}/caps/gw.echo", json=body, headers={"Authorization": "Bearer wrong-token-x"}
        )
        assert r.status_code == 401
        r = await h.post(
            f"{url}/caps/gw.echo", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert r.status_code == 200 and r.json()["error"]["code"] == -32001  # task not found


async def test_tasks_are_their_caller_s(redis_url: str, ns: str) -> None:
    other = "another-caller-token-0123"
    async with serving(redis_url, ns, *agents()):
        gw = Gateway(
            Client(redis_url=redis_url, namespace=ns),
            tokens=Tokens([("a", TOKEN), ("b", other)]),
        )
        async with gateway_served(gw) as url, http(TOKEN) as ha, http(other) as hb:
            a, _ = await a2a_client(ha, f"{url}/caps/gw.echo", streaming=False)
            b, _ = await a2a_client(hb, f"{url}/caps/gw.echo", streaming=False)
            task, _ = await final_task(a.send_message(message(new_data_part(1))))
            assert (await a.get_task(GetTaskRequest(id=task.id))).id == task.id
            with pytest.raises(TaskNotFoundError):
                await b.get_task(GetTaskRequest(id=task.id))


async def test_a_context_id_is_scoped_by_its_caller(redis_url: str, ns: str) -> None:
    """A caller that sends with another caller's contextId does not get that caller's
    session (its history): it gets one of its own, under the same contextId."""
    other = "another-caller-token-0123"
    async with serving(redis_url, ns, notes_agent()):
        gw = Gateway(
            Client(redis_url=redis_url, namespace=ns),
            tokens=Tokens([("a", TOKEN), ("b", other)]),
        )
        async with gateway_served(gw) as url, http(TOKEN) as ha, http(other) as hb:
            a, _ = await a2a_client(ha, f"{url}/caps/gw.notes", streaming=False)
            b, _ = await a2a_client(hb, f"{url}/caps/gw.notes", streaming=False)
            for note in ("a's secret", "a's second"):
                req = message(new_data_part(note))
                req.message.context_id = "ctx-shared"
                task, _ = await final_task(a.send_message(req))
            assert result_of(task)["history"] == ["a's secret", "a's second"]
            req = message(new_data_part("b's note"))
            req.message.context_id = "ctx-shared"
            task, _ = await final_task(b.send_message(req))
            assert task.context_id == "ctx-shared"
            assert result_of(task)["history"] == ["b's note"]  # not a's
            assert result_of(task)["session"] == "a2a:b:ctx-shared"


async def test_get_answers_from_the_reach_record(redis_url: str, ns: str) -> None:
    """A task the gateway does not hold (another gateway's, or sent by reach itself) is
    read from its reach task record."""
    async with serving(redis_url, ns, *agents()) as client:
        gw = Gateway(Client(redis_url=redis_url, namespace=ns))  # no tokens: open (loopback)
        msg_id = await client.send("gw.echo", {"from": "reach"})
        await wait_until(
            lambda: _succeeded(client, msg_id), what="the message sent by reach to succeed"
        )
        async with gateway_served(gw) as url, http() as h:
            a2a, card = await a2a_client(h, f"{url}/caps/gw.echo", streaming=False)
            assert not card.security_schemes
            got = await a2a.get_task(GetTaskRequest(id=msg_id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert result_of(got)["echo"] == {"from": "reach"}


async def _succeeded(client: Client, msg_id: str) -> bool:
    return (await client.task(msg_id)).status == "succeeded"


def test_import_reach_does_not_import_the_gateway() -> None:
    import subprocess
    import sys

    code = (
        "import sys, reach, reach.card, reach.client; "
        "print(json.dumps([m for m in ('starlette', 'a2a', 'uvicorn', 'reach.gateway') "
        "if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


async def test_cards_declare_mutual_tls_and_tokens(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, echo_agent()):
        gw = Gateway(
            Client(redis_url=redis_url, namespace=ns), tokens=Tokens([("a", TOKEN)]), mtls=True,
            public_url="https://gw.example.org/",
        )  # fmt: skip
        async with gateway_served(gw) as url, http() as h:
            card = await resolve(h, f"{url}/caps/gw.echo")
            assert set(card.security_schemes) == {"bearer", "mtls"}
            assert card.security_schemes["mtls"].HasField("mtls_security_scheme")
            [req] = card.security_requirements
            assert set(req.schemes) == {"bearer", "mtls"}  # both required
            assert card.supported_interfaces[0].url == "https://gw.example.org/caps/gw.echo"


async def test_the_gateway_signs_what_it_sends(
    redis_url: str, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With signing on, an agent that requires signed messages takes the gateway's (signed
    with the gateway's key), and refuses an unsigned gateway's."""
    monkeypatch.delenv("REACH_SECRET", raising=False)
    secret = "gateway-signing-secret-0123456789"
    async with serving(redis_url, ns, echo_agent(), secret=secret, require_signed=True):
        signed = Gateway(Client(redis_url=redis_url, namespace=ns, secret=secret))
        unsigned = Gateway(Client(redis_url=redis_url, namespace=ns))
        async with gateway_served(signed) as url, gateway_served(unsigned) as bare, http() as h:
            a2a, _ = await a2a_client(h, f"{url}/caps/gw.echo", streaming=False)
            task, _ = await final_task(a2a.send_message(message(new_data_part({"x": 1}))))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert result_of(task)["echo"] == {"x": 1}
            a2a, _ = await a2a_client(h, f"{bare}/caps/gw.echo", streaming=False)
            h.headers["Reach-Timeout-S"] = "5"
            task, _ = await final_task(a2a.send_message(message(new_data_part({"x": 2}))))
            assert task.status.state == TaskState.TASK_STATE_REJECTED  # refused, never run
            assert "unsigned" in task.status.message.parts[0].text


async def test_a_capabilitys_advertised_timeout_is_shown_and_used(redis_url: str, ns: str) -> None:
    adv = Agent("gw-adv-1", capabilities=["gw.adv"])

    @adv.handler("gw.adv", timeout_s=7)
    async def budget(payload: Any, ctx: Context) -> dict[str, int]:
        return {"budget_ms": ctx.deadline_ms - ctx.envelope.sent_ms}

    async with serving(redis_url, ns, adv):
        gw = Gateway(Client(redis_url=redis_url, namespace=ns), default_timeout_s=30)
        async with gateway_served(gw) as url, http() as h:
            raw = (await h.get(f"{url}/caps/gw.adv/.well-known/agent-card.json")).json()
            [ext] = raw["capabilities"]["extensions"]
            assert ext["params"]["timeoutS"] == 7
            card = await resolve(h, f"{url}/agents/gw-adv-1")
            assert "gets 7 s" in card.skills[0].description
            a2a, _ = await a2a_client(h, f"{url}/caps/gw.adv", streaming=False)
            # no Reach-Timeout-S header: the advertised 7 s, not the gateway's 30 s
            task, _ = await final_task(a2a.send_message(message(new_data_part({}))))
            assert result_of(task) == {"budget_ms": 7000}
            h.headers["Reach-Timeout-S"] = "2"  # the caller's own wins
            task, _ = await final_task(a2a.send_message(message(new_data_part({}))))
            assert result_of(task) == {"budget_ms": 2000}

"""reach.a2a.remote: an outside A2A agent (an ``a2a-sdk`` server built here, served by
uvicorn, knowing nothing of reach) becomes a reach capability provider; reach callers
reach it by capability with ``request`` and ``stream``, and its refusals and failures come
back as reach errors (docs/a2a.md, *Calling outside A2A agents*)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from a2a.helpers.proto_helpers import get_data_parts, get_text_parts
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import AgentCard, Part, Task, TaskState, TaskStatus
from google.protobuf import struct_pb2
from google.protobuf.json_format import ParseDict
from starlette.applications import Starlette

import reach
from reach.a2a import capabilities_of, remote
from reach.errors import Rejected, RemoteError
from tests.support.agents_messaging import serving
from tests.support.gateway import gateway_served_app

pytestmark = pytest.mark.anyio


class Outside(AgentExecutor):
    """An A2A agent of its own: ``shout`` upper-cases text (a data part ``{"text"}`` too),
    ``count`` streams 1..n as artifact updates, ``nope`` rejects, ``boom`` fails; it says
    which contextId it saw."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        task_id, ctx_id = context.task_id, context.context_id
        part = context.message.parts[0]
        skill = dict(context.message.metadata).get("capability", "")
        await event_queue.enqueue_event(
            Task(
                id=task_id, context_id=ctx_id, status=TaskStatus(state=TaskState.TASK_STATE_WORKING)
            )
        )
        up = TaskUpdater(event_queue, task_id, ctx_id)
        if skill == "outside.count":
            n = int(get_data_parts([part])[0])
            for i in range(1, n + 1):
                value = struct_pb2.Value(number_value=i)
                await up.add_artifact([Part(data=value)], artifact_id="c", append=i > 1)
            await up.complete()
            return
        text = (
            get_text_parts([part])[0]
            if part.HasField("text")
            else get_data_parts([part])[0]["text"]
        )
        if text == "nope":
            await up.reject(up.new_agent_message([Part(text="not doing that")]))
            return
        if text == "boom":
            await up.failed(up.new_agent_message([Part(text="exploded")]))
            return
        out = ParseDict({"shout": text.upper(), "context": ctx_id}, struct_pb2.Value())
        await up.add_artifact([Part(data=out)], name="result")
        await up.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def outside_app(base: str, *, streaming: bool) -> Starlette:
    card = ParseDict(
        {
            "name": "Outside Shouter",
            "description": "An A2A agent that knows nothing of reach.",
            "version": "1.0",
            "supportedInterfaces": [
                {"url": base, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": streaming},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["application/json"],
            "skills": [
                {
                    "id": "outside.shout",
                    "name": "Shout",
                    "description": "Upper-cases.",
                    "tags": ["text"],
                },
                {"id": "Outside Count", "name": "Count", "description": "1..n", "tags": ["count"]},
            ],
        },
        AgentCard(),
    )
    handler = DefaultRequestHandler(
        agent_executor=Outside(), task_store=InMemoryTaskStore(), agent_card=card
    )
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])


@pytest.fixture(params=[False, True], ids=["send", "streaming"])
async def outside(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, bool]]:
    async with gateway_served_app(lambda base: outside_app(base, streaming=request.param)) as url:
        yield url, request.param


async def test_reach_callers_reach_an_outside_a2a_agent_by_capability(
    outside: tuple[str, bool], redis_url: str, ns: str
) -> None:
    outside, streaming = outside
    proxy = await remote(outside)
    assert proxy.agent_id == "a2a-outside-shouter"
    assert proxy.capabilities == ["outside.shout", "outside.count"]
    async with serving(redis_url, ns, proxy) as client:
        res = await client.request("outside.shout", "hello", session_id="s-1")
        assert res == {"shout": "HELLO", "context": "s-1"}  # session_id -> contextId
        assert (await client.request("outside.shout", {"text": "dict"}))["shout"] == "DICT"
        chunks = []
        s = client.stream("outside.count", 3)
        async for c in s:
            chunks.append(c)
        assert s.result == [1.0, 2.0, 3.0]  # the artifacts, streamed or not
        # the card says it streams: each artifact update is also a chunk, as it comes
        assert chunks == ([1.0, 2.0, 3.0] if streaming else [])
        with pytest.raises(Rejected, match="not doing that"):
            await client.request("outside.shout", "nope")
        with pytest.raises(RemoteError, match="exploded"):
            await client.request("outside.shout", "boom", max_attempts=1)
        # the proxy's registered card is the outside agent's, its interface first
        info = await client.registry.get(proxy.agent_id)
        assert info is not None and info.card is not None
        assert info.card["supportedInterfaces"][0]["url"] == outside
        assert info.card["name"] == "Outside Shouter"


def test_capabilities_of_a_card() -> None:
    card = ParseDict(
        {"skills": [{"id": "a.b"}, {"id": "Text Summarize!"}, {"id": "a.b"}, {"id": "--"}]},
        AgentCard(),
    )
    assert capabilities_of(card) == ["a.b", "text.summarize"]


_ = (reach, Any)

"""Capability schemas through a real registration: an agent's handler annotations are in
its registry record (``metadata["schemas"]``), and a caller's registry view reads them."""

from __future__ import annotations

import msgspec
import pytest

from reach import Agent, Context
from reach.schemas import capability_schemas
from tests.support.agents_messaging import serving

pytestmark = pytest.mark.anyio


class Question(msgspec.Struct):
    text: str
    lang: str = "en"


class Answer(msgspec.Struct):
    answer: str


def qa_agent() -> Agent:
    app = Agent("qa-1", capabilities=["qa.ask", "qa.free"])

    @app.handler("qa.ask")
    async def ask(payload: Question, ctx: Context) -> Answer:
        return Answer(payload.text.upper())

    @app.handler("qa.free")
    async def free(payload, ctx):  # type: ignore[no-untyped-def]
        return payload

    return app


async def test_the_registry_record_publishes_the_schemas(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, qa_agent()) as client:
        agents = await client.registry.agents("qa.ask")
        assert capability_schemas(agents, "qa.ask") == {
            "input": msgspec.json.schema(Question),
            "output": msgspec.json.schema(Answer),
        }
        assert capability_schemas(agents, "qa.free") == {}
        # the schema says what the handler validates: a payload that fits it is served
        assert await client.request("qa.ask", {"text": "hi"}) == {"answer": "HI"}

"""Capability schemas (reach.schemas): a handler's payload and result annotations become
JSON Schemas (msgspec's), published in its registration metadata and its card's skills."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any, TypedDict

import msgspec
import pytest

from reach import Agent, Context
from reach.card import agent_card
from reach.registry import MAX_METADATA_BYTES, AgentInfo
from reach.schemas import (
    OPEN_OBJECT,
    SCHEMAS_KEY,
    as_object_schema,
    capability_schemas,
    published,
)


class Order(msgspec.Struct):
    item: str
    qty: int = 1


class Receipt(TypedDict):
    total: float


@dataclasses.dataclass
class Point:
    x: int
    y: int


def _agent() -> Agent:
    app = Agent("a-1", capabilities=["shop.order", "geo.point", "any.thing", "num.list", "s.gen"])

    @app.handler("shop.order")
    async def order(payload: Order, ctx: Context) -> Receipt:
        return {"total": 1.0}

    @app.handler("geo.point")
    def point(payload: Point, ctx: Context) -> None:
        return None

    @app.handler("any.thing")
    async def anything(payload, ctx):  # type: ignore[no-untyped-def]
        return payload

    @app.handler("num.list")
    async def nums(payload: list[int], ctx: Context) -> str:
        return ""

    @app.handler("s.gen")
    async def gen(payload: str, ctx: Context) -> AsyncIterator[int]:
        yield 1

    return app


def test_annotations_become_published_schemas() -> None:
    meta = _agent().metadata
    assert published(meta, "shop.order") == {
        "input": msgspec.json.schema(Order),
        "output": msgspec.json.schema(Receipt),
    }
    assert published(meta, "shop.order")["input"]["$defs"]["Order"]["required"] == ["item"]
    # a dataclass payload; a result annotated None publishes no output schema
    assert published(meta, "geo.point") == {"input": msgspec.json.schema(Point)}
    assert published(meta, "any.thing") == {}  # unannotated: nothing published
    assert published(meta, "num.list") == {
        "input": {"type": "array", "items": {"type": "integer"}},
        "output": {"type": "string"},
    }
    # a streaming handler: its yields are chunks, no output schema
    assert published(meta, "s.gen") == {"input": {"type": "string"}}
    assert set(meta[SCHEMAS_KEY]) == {"shop.order", "geo.point", "num.list", "s.gen"}


def test_a_handler_registered_again_replaces_its_schemas() -> None:
    app = _agent()

    @app.handler("shop.order")
    async def untyped(payload, ctx):  # type: ignore[no-untyped-def]
        return payload

    assert published(app.metadata, "shop.order") == {}
    assert "shop.order" not in app.metadata[SCHEMAS_KEY]


def test_schemas_too_large_for_a_registration_are_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Agent(
        "big-1", capabilities=["big.one"], metadata={"pad": "x" * (MAX_METADATA_BYTES - 50)}
    )
    with caplog.at_level(logging.WARNING, "reach.agent"):

        @app.handler("big.one")
        async def h(payload: Order, ctx: Context) -> None: ...

    assert SCHEMAS_KEY not in app.metadata
    assert "not published" in caplog.text


def _info(agent_id: str, registered_ms: int, metadata: dict[str, Any], **kw: Any) -> AgentInfo:
    return AgentInfo(
        agent_id=agent_id,
        capabilities=["shop.order"],
        metadata=metadata,
        registered_ms=registered_ms,
        **kw,
    )


def test_capability_schemas_are_the_newest_registrations() -> None:
    old = {SCHEMAS_KEY: {"shop.order": {"input": {"type": "string"}}}}
    new = {SCHEMAS_KEY: {"shop.order": {"input": {"type": "integer"}}}}
    agents = [_info("a", 2, new), _info("b", 1, old), _info("c", 3, {})]
    assert capability_schemas(agents, "shop.order") == {"input": {"type": "integer"}}
    gone = [_info("a", 2, new, state="evicted"), _info("b", 1, old)]
    assert capability_schemas(gone, "shop.order") == {"input": {"type": "string"}}
    # a record written by something else is read, never trusted
    hostile = {SCHEMAS_KEY: {"shop.order": {"input": "not a schema", "output": [1]}}}
    assert capability_schemas([_info("h", 1, hostile)], "shop.order") == {}
    assert capability_schemas([_info("h", 1, {SCHEMAS_KEY: ["x"]})], "shop.order") == {}


def test_card_skills_carry_the_schemas() -> None:
    app = _agent()
    info = AgentInfo(agent_id="a-1", capabilities=app.capabilities, metadata=app.metadata)
    skills = {s["id"]: s for s in agent_card(info, namespace="ns")["skills"]}
    assert skills["shop.order"]["inputSchema"] == msgspec.json.schema(Order)
    assert skills["shop.order"]["outputSchema"] == msgspec.json.schema(Receipt)
    assert "inputSchema" not in skills["any.thing"]
    assert "outputSchema" not in skills["geo.point"]


def test_object_schemas_for_mcp() -> None:
    # a Struct: its object inlined, $defs kept for nested references
    schema, wrap = as_object_schema(msgspec.json.schema(Order))
    assert wrap is None and schema["type"] == "object"
    assert schema["required"] == ["item"] and "Order" in schema["$defs"]
    # a non-object is wrapped as {"value": ...}
    schema, wrap = as_object_schema({"type": "array", "items": {"type": "integer"}})
    assert wrap == "value"
    assert schema == {
        "type": "object",
        "properties": {"value": {"type": "array", "items": {"type": "integer"}}},
        "required": ["value"],
    }
    assert as_object_schema(None) == (OPEN_OBJECT, None)
    assert as_object_schema({"type": "object", "properties": {}}) == (
        {"type": "object", "properties": {}},
        None,
    )

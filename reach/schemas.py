"""Capability schemas: the JSON Schema of what a handler takes and returns, from its
annotations (msgspec's :func:`msgspec.json.schema`), published with the agent's
registration (``metadata["schemas"]``) so that callers, ``reach caps show``, the A2A
cards and the MCP face (:mod:`reach.mcp`) can say what a capability expects.

``@app.handler(cap)`` on ``async def f(payload: Order, ctx) -> Receipt`` publishes
``{"schemas": {cap: {"input": <Order's schema>, "output": <Receipt's schema>}}}``. An
unannotated payload (or ``Any``) publishes no input schema (any payload is taken); a
handler that streams (an async generator) or returns ``None``/``Any`` publishes no output
schema. A schema msgspec cannot write, or one too large for a registration
(:data:`MAX_SCHEMA_BYTES`), is left out, with a warning: the handler still serves.
"""

from __future__ import annotations

import inspect
import json
import logging
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

if typing.TYPE_CHECKING:
    from .registry import AgentInfo

log = logging.getLogger("reach.schemas")

SCHEMAS_KEY = "schemas"
"""The metadata key under which an agent publishes its capabilities' schemas:
``{"schemas": {"text.summarize": {"input": {...}, "output": {...}}}}``."""

MAX_SCHEMA_BYTES = 16_384
"""The largest schema (as compact JSON) published for one capability's input or output:
every registration holds it, and the registry's whole metadata is bounded (64 KiB)."""

OPEN_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
"""The input schema of a capability that publishes none: any JSON object."""


def _schema_of(t: Any, what: str, name: str) -> dict[str, Any] | None:
    if t in (Any, object, None, type(None), inspect.Parameter.empty):
        return None
    try:
        schema = msgspec.json.schema(t)
    except (TypeError, ValueError) as e:
        log.warning("%s of %s: no schema published (%s)", what, name, e)
        return None
    if len(json.dumps(schema, separators=(",", ":"))) > MAX_SCHEMA_BYTES:
        log.warning(
            "%s of %s: its schema is over %d bytes as JSON, not published",
            what,
            name,
            MAX_SCHEMA_BYTES,
        )
        return None
    return schema


def handler_schemas(fn: Any, payload_type: Any) -> dict[str, Any]:
    """``{"input": ..., "output": ...}`` (each only when known) of handler ``fn`` whose
    payload is validated into ``payload_type``."""
    name = getattr(fn, "__qualname__", repr(fn))
    out: dict[str, Any] = {}
    schema = _schema_of(payload_type, "the payload", name)
    if schema is not None:
        out["input"] = schema
    if inspect.isasyncgenfunction(fn):
        return out  # its yields are chunks; its result is ctx.result, not annotated
    try:
        ret = typing.get_type_hints(fn).get("return", Any)
    except Exception:  # noqa: BLE001 - unresolvable hints: no output schema
        ret = Any
    schema = _schema_of(ret, "the result", name)
    if schema is not None:
        out["output"] = schema
    return out


def published(metadata: Mapping[str, Any], capability: str) -> dict[str, Any]:
    """The schemas an agent's metadata publishes for ``capability`` (``input``,
    ``output``: JSON objects, each only when present and an object; a record written by
    anything else is read, never trusted)."""
    every = metadata.get(SCHEMAS_KEY)
    mine = every.get(capability) if isinstance(every, dict) else None
    if not isinstance(mine, dict):
        return {}
    return {k: v for k in ("input", "output") if isinstance(v := mine.get(k), dict)}


def capability_schemas(agents: Iterable[AgentInfo], capability: str) -> dict[str, Any]:
    """The schemas of ``capability`` as its live agents publish them: the most recently
    registered agent's that publishes any (the newest code's), else ``{}``."""
    best: tuple[int, dict[str, Any]] | None = None
    for a in agents:
        if a.state == "evicted" or capability not in a.capabilities:
            continue
        s = published(a.metadata, capability)
        if s and (best is None or a.registered_ms > best[0]):
            best = (a.registered_ms, s)
    return best[1] if best else {}


def as_object_schema(schema: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """``schema`` as the schema of a JSON object, and the name of the property that holds
    the value when it had to be wrapped (None: the object is the value itself).

    MCP wants a tool's arguments (and its structured result) to be an object: a
    Struct's schema (a ``$ref`` to an object in ``$defs``) is inlined; a schema of
    anything else (a string, a list) is wrapped as ``{"value": ...}``. None: any object.
    """
    if not schema:
        return dict(OPEN_OBJECT), None
    target: Mapping[str, Any] = schema
    defs = schema.get("$defs") if isinstance(schema.get("$defs"), dict) else None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and defs is not None:
        found = defs.get(ref.removeprefix("#/$defs/"))
        if isinstance(found, dict):
            target = found
    if target.get("type") == "object":
        out = dict(target)
        if defs is not None:
            out["$defs"] = defs  # nested references still point into it
        return out, None
    inner = {k: v for k, v in schema.items() if k != "$defs"}
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {"value": inner},
        "required": ["value"],
    }
    if defs is not None:
        wrapped["$defs"] = defs
    return wrapped, "value"

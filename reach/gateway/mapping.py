"""What an A2A message, task and error are in reach terms, and back (docs/a2a.md, *The
gateway*): pure functions over the ``a2a-sdk`` types, no I/O.

* A message's parts become the reach payload: a data part is the payload as it is, a text
  part the text (parsed as JSON when the capability takes JSON input and not text), a raw
  (file bytes) part the bytes; several parts make a list of those values.
* A result (or chunk) becomes parts: a string a text part, bytes a raw part, any other
  value (``None`` included) a data part (JSON: bytes nested in it as base64, as msgspec writes them).
* A reach task status becomes an A2A task state through :func:`reach.card.a2a_task_state`.
* reach errors become A2A errors, which the SDK answers with their JSON-RPC codes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import msgspec
from a2a.types.a2a_pb2 import Part, TaskState
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
)
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

from ..card import a2a_state_wire, a2a_task_state
from ..errors import (
    ConfigError,
    NoAgentAvailable,
    Overloaded,
    RateLimited,
    ReachError,
    RedisUnavailable,
    Rejected,
)

JSON_MODE = "application/json"
TEXT_MODE = "text/plain"


def takes_json_text(input_modes: Sequence[str]) -> bool:
    """A text part is parsed as JSON when the capability's input modes name JSON and not
    plain text (a reach card's default modes are ``["application/json"]``)."""
    return JSON_MODE in input_modes and TEXT_MODE not in input_modes


def _part_value(part: Part, *, json_text: bool) -> Any:
    if part.HasField("data"):
        return MessageToDict(part.data)
    if part.HasField("text"):
        if json_text or part.media_type == JSON_MODE:
            try:
                return json.loads(part.text)
            except ValueError:
                raise InvalidParamsError(
                    message="This capability takes JSON input: send a data part, or a text "
                    "part holding JSON text (this one is not JSON)."
                ) from None
        return part.text
    if part.HasField("raw"):
        return bytes(part.raw)
    raise ContentTypeNotSupportedError(
        message="A part given by URL is not fetched by the gateway: send the content as a "
        "data, text or raw part."
    )


def payload_of(parts: Sequence[Part], *, json_text: bool) -> Any:
    """The reach payload of a message's parts (see the module docstring)."""
    if not parts:
        raise InvalidParamsError(message="The message has no parts: send a data or text part.")
    values = [_part_value(p, json_text=json_text) for p in parts]
    return values[0] if len(values) == 1 else values


def _jsonable(value: Any) -> Any:
    """``value`` as JSON values only (bytes as base64 text, what msgspec makes of them)."""
    return msgspec.json.decode(msgspec.json.encode(value))


def result_parts(value: Any) -> list[Part]:
    """The parts of a result or a chunk (see the module docstring)."""
    if isinstance(value, str):
        return [Part(text=value, media_type=TEXT_MODE)]
    if isinstance(value, bytes | bytearray | memoryview):
        return [Part(raw=bytes(value), media_type="application/octet-stream")]
    return [Part(data=ParseDict(_jsonable(value), struct_pb2.Value()), media_type=JSON_MODE)]


def task_state(status: str, reason: str = "") -> TaskState:
    """The A2A task state of a reach task status (docs/a2a.md, *Task states*)."""
    return cast(TaskState, TaskState.Value(a2a_state_wire(a2a_task_state(status, reason))))


def error_of(exc: ReachError) -> A2AError:
    """The A2A error answering a request that reach refused before it was sent (no agent,
    a bound, a bad argument, Redis away). ``data.reachError`` names the reach error and
    ``data.retryAfterS`` says when to retry, where reach knows it."""
    data: dict[str, Any] = {"reachError": type(exc).__name__}
    if isinstance(exc, Overloaded | RateLimited) and exc.retry_after_s:
        data["retryAfterS"] = exc.retry_after_s
    if isinstance(exc, NoAgentAvailable) and exc.reason:
        data["reason"] = exc.reason
    if isinstance(exc, ConfigError | Rejected):
        return InvalidParamsError(message=str(exc), data=data)
    if isinstance(exc, NoAgentAvailable | RateLimited | RedisUnavailable):
        return InternalError(message=str(exc), data=data)
    return InternalError(message=str(exc), data=data)

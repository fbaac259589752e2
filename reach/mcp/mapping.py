"""What a reach capability, request, chunk and error are in MCP terms, and back
(docs/mcp.md, *Mapping*): pure functions over the official SDK's types, no I/O.

* A capability is a tool of the same name; its description says who serves it and the
  timeout a call gets; its ``inputSchema`` is the schema its handlers' payload annotation
  publishes (:mod:`reach.schemas`), as an object (a Struct's inlined; a list, a string...
  wrapped as ``{"value": ...}``); an unannotated capability takes any object.
  ``outputSchema`` likewise from the result annotation.
* A call's ``arguments`` are the payload (the ``value`` argument when it was wrapped).
* A result is one text content (a string as it is, anything else as JSON), and, when the
  capability publishes an output schema, ``structuredContent`` (the result, or
  ``{"value": result}`` when that schema was wrapped).
* A chunk of a streaming handler is a progress notification: ``progress`` counts the
  chunks, ``message`` holds the chunk (as the result's text).
* A reach error is a tool result with ``isError`` whose text names the reach error, its
  reason and what to do.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from mcp_types import CallToolResult, ContentBlock, TextContent, Tool

from ..errors import (
    Cancelled,
    ConfigError,
    DeadlineExceeded,
    NoAgentAvailable,
    Overloaded,
    RateLimited,
    ReachError,
    RedisUnavailable,
    Rejected,
    RemoteError,
)
from ..registry import AgentInfo, advertised_timeout
from ..schemas import as_object_schema, capability_schemas

MAX_PROGRESS_MESSAGE_CHARS = 16_384
"""A chunk longer than this as text is cut in its progress notification (the chunk is
still counted)."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A capability as the MCP face offers it: the tool, and how its arguments and
    result are wrapped (``input_wrap``/``output_wrap``: the property holding the value;
    None: the object is the value)."""

    tool: Tool
    input_wrap: str | None
    output_wrap: str | None
    has_output: bool


def tool_of(capability: str, agents: Iterable[AgentInfo], default_timeout_s: float) -> ToolSpec:
    """The tool of ``capability`` served by ``agents`` (its live ones)."""
    live = [a for a in agents if a.state != "evicted" and capability in a.capabilities]
    schemas = capability_schemas(live, capability)
    input_schema, input_wrap = as_object_schema(schemas.get("input"))
    output = schemas.get("output")
    output_schema, output_wrap = as_object_schema(output) if output else (None, None)
    timeout = advertised_timeout(live, capability)
    who = ", ".join(sorted(a.agent_id for a in live)[:5]) + (" ..." if len(live) > 5 else "")
    description = (
        f"reach capability '{capability}', served by {len(live)} agent(s) ({who}). "
        f"A call gets {timeout if timeout is not None else default_timeout_s:g} s."
    )
    given = _given_description(live, capability)
    if given:
        description = f"{given} ({description})"
    if input_wrap:
        description += f" Give the payload as the argument '{input_wrap}'."
    return ToolSpec(
        Tool(
            name=capability,
            description=description,
            input_schema=input_schema,
            output_schema=output_schema,
        ),
        input_wrap,
        output_wrap,
        output is not None,
    )


def _given_description(agents: list[AgentInfo], capability: str) -> str:
    """The description an agent's own card gives the capability's skill, if any."""
    for a in agents:
        skills = (a.card or {}).get("skills")
        for s in skills if isinstance(skills, list) else []:
            if isinstance(s, Mapping) and s.get("id") == capability:
                text = s.get("description")
                if isinstance(text, str) and text:
                    return text
    return ""


def payload_of(spec: ToolSpec, arguments: Mapping[str, Any] | None) -> Any:
    """The reach payload of a call's ``arguments``."""
    args = dict(arguments or {})
    if spec.input_wrap is None:
        return args
    if spec.input_wrap not in args:
        raise ConfigError(
            f"Tool {spec.tool.name!r} takes its payload as the argument {spec.input_wrap!r}: "
            f"call it with {{{spec.input_wrap!r}: ...}}."
        )
    return args[spec.input_wrap]


def _jsonable(value: Any) -> Any:
    """``value`` as JSON values only (bytes as base64 text, what msgspec makes of them)."""
    return msgspec.json.decode(msgspec.json.encode(value))


def as_text(value: Any) -> str:
    """A result or chunk as the text of a content item: a string as it is, else JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(_jsonable(value), ensure_ascii=False)


def progress_message(chunk: Any) -> str:
    text = as_text(chunk)
    if len(text) > MAX_PROGRESS_MESSAGE_CHARS:
        return text[:MAX_PROGRESS_MESSAGE_CHARS] + "..."
    return text


def result_of(spec: ToolSpec, value: Any) -> CallToolResult:
    """The tool result of a reach result."""
    content: list[ContentBlock] = [TextContent(type="text", text=as_text(value))]
    if not spec.has_output:
        return CallToolResult(content=content)
    plain = _jsonable(value)
    structured = {spec.output_wrap: plain} if spec.output_wrap else plain
    if not isinstance(structured, dict):  # the agent broke its own schema: text only
        return CallToolResult(content=content)
    return CallToolResult(content=content, structured_content=structured)


def _advice(exc: BaseException) -> str:
    if isinstance(exc, Rejected):
        return "The agent refused this call as it is: change the arguments; do not retry as is."
    if isinstance(exc, Cancelled):
        return "The call was cancelled: call again to have it run."
    if isinstance(exc, DeadlineExceeded):
        return "No answer before the deadline: retry later, or ask its operator (reach task)."
    if isinstance(exc, Overloaded | RateLimited):
        after = getattr(exc, "retry_after_s", 0.0)
        return f"Busy: retry in {after:g} s." if after else "Busy: retry shortly."
    if isinstance(exc, NoAgentAvailable):
        return "No agent serves this tool now: retry later, or list the tools again."
    if isinstance(exc, RemoteError):
        return (
            "The handler failed (reach retried it where it could): retrying may help."
            if exc.retryable
            else "The handler failed: check the arguments, or retry later."
        )
    if isinstance(exc, RedisUnavailable):
        return "The fabric is unreachable: retry later."
    if isinstance(exc, ConfigError):
        return "Fix the arguments and call again."
    return "Retry later."


def error_of(exc: ReachError, msg_id: str = "") -> CallToolResult:
    """The tool result (``isError``) of a reach error: which error, its reason, what to
    do. ``structuredContent`` is left out (an error result need not fit the output
    schema); the text says everything."""
    reason = getattr(exc, "reason", "")
    head = type(exc).__name__ + (f" ({reason})" if reason else "")
    where = f" [reach msg {msg_id}]" if msg_id else ""
    text = f"{head}: {exc}{where} {_advice(exc)}"
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def unknown_tool(name: str, known: Iterable[str]) -> CallToolResult:
    names = sorted(known)
    listed = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
    return CallToolResult(
        content=[
            TextContent(
                type="text",
                text=f"No tool {name!r} here (no live agent offers it now): list the tools "
                f"again. Tools: {listed or 'none'}.",
            )
        ],
        is_error=True,
    )

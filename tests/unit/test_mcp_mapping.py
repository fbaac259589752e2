"""reach.mcp.mapping: a capability as a tool, arguments as a payload, a result as a tool
result, a reach error as a tool error (docs/mcp.md, *Mapping*)."""

from __future__ import annotations

import msgspec
import pytest

from reach.errors import (
    ConfigError,
    DeadlineExceeded,
    NoAgentAvailable,
    Overloaded,
    Rejected,
    RemoteError,
)
from reach.mcp.mapping import error_of, payload_of, progress_message, result_of, tool_of
from reach.registry import AgentInfo
from reach.schemas import OPEN_OBJECT, SCHEMAS_KEY


class Doc(msgspec.Struct):
    text: str


def _agent(agent_id: str, schemas: dict[str, object], **kw: object) -> AgentInfo:
    return AgentInfo(
        agent_id=agent_id,
        capabilities=["doc.count"],
        metadata={SCHEMAS_KEY: {"doc.count": schemas}, **kw.pop("metadata", {})},  # type: ignore[dict-item]
        **kw,  # type: ignore[arg-type]
    )


def test_a_struct_capability_as_a_tool() -> None:
    schemas = {"input": msgspec.json.schema(Doc), "output": {"type": "integer"}}
    spec = tool_of(
        "doc.count",
        [
            _agent("a-1", schemas, metadata={"timeouts": {"doc.count": 12}}),
            _agent("b", {}, state="evicted"),
        ],
        30.0,
    )
    tool = spec.tool
    assert tool.name == "doc.count"
    assert tool.input_schema["type"] == "object" and tool.input_schema["required"] == ["text"]
    # an integer result: wrapped as {"value": ...} (MCP wants an object)
    assert tool.output_schema == {
        "type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"],
    }  # fmt: skip
    assert "1 agent(s) (a-1)" in (tool.description or "") and "12 s" in (tool.description or "")
    assert payload_of(spec, {"text": "x"}) == {"text": "x"}
    res = result_of(spec, 7)
    assert res.structured_content == {"value": 7} and res.content[0].text == "7"  # type: ignore[union-attr]


def test_an_unannotated_capability_takes_any_object() -> None:
    spec = tool_of("doc.count", [_agent("a-1", {})], 30.0)
    assert spec.tool.input_schema == OPEN_OBJECT and spec.tool.output_schema is None
    assert "30 s" in (spec.tool.description or "")
    assert payload_of(spec, None) == {}
    res = result_of(spec, {"n": 1})
    assert res.structured_content is None and res.content[0].text == '{"n": 1}'  # type: ignore[union-attr]
    assert result_of(spec, "plain").content[0].text == "plain"  # type: ignore[union-attr]


def test_a_wrapped_payload() -> None:
    spec = tool_of("doc.count", [_agent("a-1", {"input": {"type": "string"}})], 30.0)
    assert payload_of(spec, {"value": "hi"}) == "hi"
    assert "argument 'value'" in (spec.tool.description or "")
    with pytest.raises(ConfigError, match="takes its payload as the argument 'value'"):
        payload_of(spec, {"text": "hi"})


@pytest.mark.parametrize(
    "exc,head,advice",
    [
        (
            Rejected("no", reason="invalid_payload"),
            "Rejected (invalid_payload): no",
            "do not retry",
        ),
        (DeadlineExceeded("late"), "DeadlineExceeded: late", "retry later"),
        (Overloaded("full", retry_after_s=2.0), "Overloaded: full", "retry in 2 s"),
        (
            NoAgentAvailable("none", reason="no_agent"),
            "NoAgentAvailable (no_agent)",
            "list the tools",
        ),
        (
            RemoteError("boom", type="ValueError"),
            "RemoteError: ValueError: boom",
            "check the arguments",
        ),
    ],
)
def test_reach_errors_are_tool_errors(exc: Exception, head: str, advice: str) -> None:
    res = error_of(exc, "m-1")  # type: ignore[arg-type]
    assert res.is_error
    text = res.content[0].text  # type: ignore[union-attr]
    assert text.startswith(head) and "[reach msg m-1]" in text and advice in text


def test_progress_messages_are_bounded() -> None:
    assert progress_message({"a": 1}) == '{"a": 1}'
    assert len(progress_message("x" * 100_000)) == 16_384 + 3

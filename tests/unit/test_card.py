"""A2A Agent Cards: what `reach agents card` renders validates against the fields the A2A
specification (1.0, `AgentCard` in a2a.proto) marks REQUIRED, with their JSON types; a card
an agent registered with keeps its fields; reach task states map onto A2A task states."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from reach_cli.app import app
from typer.testing import CliRunner

from reach.card import (
    A2A_TASK_STATES,
    REACH_EXTENSION_URI,
    a2a_state_wire,
    a2a_task_state,
    agent_card,
    card_problems,
    reach_url,
)
from reach.connection import connect
from reach.registry import AgentInfo, Registry
from reach.tasks import STATUSES

# -- the specification, written out independently of reach/card.py --------------------------
# A2A 1.0 (a2a.proto, `[(google.api.field_behavior) = REQUIRED]`), JSON names.
STR, STRS, OBJ, ARR = "string", "string[]", "object", "array"
AGENT_CARD_REQUIRED = {
    "name": STR,
    "description": STR,
    "supportedInterfaces": ARR,  # of AgentInterface, ordered, first preferred
    "version": STR,
    "capabilities": OBJ,  # AgentCapabilities
    "defaultInputModes": STRS,  # media types
    "defaultOutputModes": STRS,
    "skills": ARR,  # of AgentSkill
}
AGENT_INTERFACE_REQUIRED = {"url": STR, "protocolBinding": STR, "protocolVersion": STR}
AGENT_SKILL_REQUIRED = {"id": STR, "name": STR, "description": STR, "tags": STRS}
AGENT_PROVIDER_REQUIRED = {"url": STR, "organization": STR}
# Optional fields that, when present, have a fixed type.
AGENT_CARD_OPTIONAL = {
    "provider": OBJ,
    "documentationUrl": STR,
    "iconUrl": STR,
    "securitySchemes": OBJ,
    "securityRequirements": ARR,
    "signatures": ARR,
}
AGENT_INTERFACE_OPTIONAL = {"tenant": STR}
AGENT_CAPABILITIES_OPTIONAL = {
    "streaming": bool,
    "pushNotifications": bool,
    "extendedAgentCard": bool,
    "extensions": ARR,
}
AGENT_SKILL_OPTIONAL = {"examples": STRS, "inputModes": STRS, "outputModes": STRS}
A2A_TASK_STATE_NAMES = {
    "unspecified",
    "submitted",
    "working",
    "completed",
    "failed",
    "canceled",
    "input-required",
    "rejected",
    "auth-required",
}


def _is(value: Any, t: Any) -> bool:
    if t == STR:
        return isinstance(value, str)
    if t == STRS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if t == OBJ:
        return isinstance(value, dict)
    if t == ARR:
        return isinstance(value, list)
    return isinstance(value, t)


def _fields(obj: Any, required: dict[str, Any], optional: dict[str, Any], where: str) -> None:
    assert isinstance(obj, dict), where
    for name, t in required.items():
        assert name in obj, f"{where}.{name} is required"
        assert _is(obj[name], t), f"{where}.{name} must be {t}: {obj[name]!r}"
        if t in (STR,):
            assert obj[name], f"{where}.{name} must not be empty"
    for name, t in optional.items():
        if name in obj:
            assert _is(obj[name], t), f"{where}.{name} must be {t}: {obj[name]!r}"


def validate_a2a_card(card: Any) -> None:
    """Assert ``card`` has every field A2A requires, with the right JSON types."""
    json.dumps(card)  # JSON-serialisable as it is
    _fields(card, AGENT_CARD_REQUIRED, AGENT_CARD_OPTIONAL, "card")
    assert card["supportedInterfaces"], "at least one interface"
    for i, iface in enumerate(card["supportedInterfaces"]):
        _fields(iface, AGENT_INTERFACE_REQUIRED, AGENT_INTERFACE_OPTIONAL, f"interface[{i}]")
        assert "://" in iface["url"], "an absolute URL"
    _fields(card["capabilities"], {}, AGENT_CAPABILITIES_OPTIONAL, "capabilities")
    for i, skill in enumerate(card["skills"]):
        _fields(skill, AGENT_SKILL_REQUIRED, AGENT_SKILL_OPTIONAL, f"skills[{i}]")
    if "provider" in card:
        _fields(card["provider"], AGENT_PROVIDER_REQUIRED, {}, "provider")


# -- rendering ---------------------------------------------------------------------------------
def _info(**kw: Any) -> AgentInfo:
    base: dict[str, Any] = {
        "agent_id": "summarizer-1",
        "instance_id": "i1",
        "version": 1717,
        "capabilities": ["text.summarize", "text.translate"],
        "metadata": {"region": "eu"},
        "ready": True,
    }
    return AgentInfo(**{**base, **kw})


def test_card_of_an_agent_without_a_card_validates() -> None:
    card = agent_card(_info(), namespace="prod")
    validate_a2a_card(card)
    assert card_problems(card) == []
    assert card["name"] == "summarizer-1"
    assert card["version"] == "1717"  # no version given: the registration stamp
    assert [s["id"] for s in card["skills"]] == ["text.summarize", "text.translate"]
    assert "summarize" in card["skills"][0]["tags"]
    assert card["supportedInterfaces"] == [
        {
            "url": "reach://prod/summarizer-1",
            "protocolBinding": "REACH",
            "tenant": "prod",
            "protocolVersion": "1.0",
        },
    ]
    assert card["defaultInputModes"] == card["defaultOutputModes"] == ["application/json"]
    assert card["capabilities"]["streaming"] is False
    (ext,) = card["capabilities"]["extensions"]
    assert ext["uri"] == REACH_EXTENSION_URI and ext["required"] is False
    assert ext["params"]["metadata"] == {"region": "eu"}
    assert ext["params"]["state"] == "active" and ext["params"]["ready"] is True


def test_given_card_fields_are_kept_and_merged() -> None:
    given = {
        "name": "Summarizer",
        "description": "Summarises English text.",
        "version": "2.1.0",
        "provider": {"organization": "Example Org", "url": "https://example.org"},
        "documentationUrl": "https://example.org/docs",
        "supportedInterfaces": [
            {
                "url": "https://example.org/a2a",
                "protocolBinding": "JSONRPC",
                "protocolVersion": "1.0",
            }
        ],
        "capabilities": {"streaming": True},
        "defaultOutputModes": ["application/json", "text/plain"],
        "skills": [
            {
                "id": "text.summarize",
                "name": "Summarize",
                "description": "Short summaries.",
                "tags": ["nlp"],
                "examples": ["Summarise this article"],
            },
            {"id": "extra", "name": "Extra", "description": "Not a reach capability.", "tags": []},
        ],
    }
    card = agent_card(_info(card=given, metadata={"version": "9.9"}), namespace="prod")
    validate_a2a_card(card)
    for key in ("name", "description", "version", "provider", "documentationUrl"):
        assert card[key] == given[key], key
    assert card["capabilities"]["streaming"] is True  # given wins over reach's default
    assert card["defaultOutputModes"] == ["application/json", "text/plain"]
    assert card["defaultInputModes"] == ["application/json"]  # not given: reach's
    # the given interface stays first (preferred), reach's is added after it
    assert [i["url"] for i in card["supportedInterfaces"]] == [
        "https://example.org/a2a",
        "reach://prod/summarizer-1",
    ]
    skills = {s["id"]: s for s in card["skills"]}
    assert list(skills) == ["text.summarize", "text.translate", "extra"]
    assert skills["text.summarize"]["description"] == "Short summaries."
    assert skills["text.summarize"]["examples"] == ["Summarise this article"]
    assert skills["text.translate"]["description"]  # derived from the capability


def test_version_from_metadata_and_url_escaping() -> None:
    card = agent_card(_info(metadata={"version": "1.2.3"}), namespace="team a")
    assert card["version"] == "1.2.3"
    assert reach_url("team a", "x/y") == "reach://team%20a/x%2Fy"


def test_card_problems_reports_missing_and_mistyped_fields() -> None:
    assert card_problems({}) != []
    card = agent_card(_info(card={"provider": {"organization": "no url"}}), namespace="n")
    assert card_problems(card) == ["card.provider.url: required field missing"]
    with pytest.raises(AssertionError):
        validate_a2a_card(card)
    bad = agent_card(
        _info(card={"skills": [{"id": "text.summarize", "tags": "nlp"}]}), namespace="n"
    )
    assert card_problems(bad) == ["card.skills[0].tags: must be list[str]"]


def test_every_reach_status_maps_to_an_a2a_task_state() -> None:
    assert set(STATUSES) | {"unknown"} == set(A2A_TASK_STATES)
    assert set(A2A_TASK_STATES.values()) <= A2A_TASK_STATE_NAMES
    assert a2a_task_state("pending") == "submitted"
    assert a2a_task_state("running") == "working"
    assert a2a_task_state("succeeded") == "completed"
    assert a2a_task_state("expired") == "failed"
    assert a2a_task_state("dead", "max_attempts") == "failed"
    assert a2a_task_state("dead", "rejected") == "rejected"
    assert a2a_task_state("dead", "invalid_payload") == "rejected"
    assert a2a_task_state("something-new") == "unspecified"
    assert a2a_state_wire("input-required") == "TASK_STATE_INPUT_REQUIRED"
    assert a2a_state_wire(a2a_task_state("succeeded")) == "TASK_STATE_COMPLETED"


def test_card_parses_as_the_official_a2a_type() -> None:
    """The A2A SDK (a test dependency, not a runtime one) parses the card into its protobuf
    AgentCard, so every field name and type is one the specification defines."""
    from a2a import types as a2a_types
    from google.protobuf import json_format

    card = agent_card(
        _info(card={"provider": {"organization": "O", "url": "https://o"}}), namespace="prod"
    )
    parsed = json_format.ParseDict(card, a2a_types.AgentCard())
    assert parsed.name == "summarizer-1"
    assert [s.id for s in parsed.skills] == ["text.summarize", "text.translate"]
    assert parsed.supported_interfaces[0].protocol_binding == "REACH"


# -- through the registry and the CLI --------------------------------------------------------
runner = CliRunner()


def _register(url: str, ns: str, agent_id: str, card: dict[str, Any] | None) -> None:
    async def go() -> None:
        r = await connect(url)
        try:
            await Registry(r, ns).register(
                agent_id,
                instance_id="i1",
                version=5,
                capabilities=["code.review"],
                metadata={"region": "us"},
                lease_ms=60_000,
                evict_after_ms=120_000,
                card=card,
                ready=True,
            )
        finally:
            await r.aclose()

    anyio.run(go)


def test_cli_agents_card_json_and_table(redis_url: str, ns: str) -> None:
    given = {
        "description": "Reviews code.",
        "version": "0.4.0",
        "skills": [
            {
                "id": "code.review",
                "name": "Code review",
                "description": "Finds bugs.",
                "tags": ["code"],
            }
        ],
    }
    _register(redis_url, ns, "reviewer-1", given)
    res = runner.invoke(
        app, ["agents", "card", "reviewer-1", "--json", "--redis-url", redis_url, "--namespace", ns]
    )
    assert res.exit_code == 0, res.output
    card = json.loads(res.stdout)
    validate_a2a_card(card)
    assert card["description"] == "Reviews code." and card["version"] == "0.4.0"
    assert card["skills"] == given["skills"]
    assert card["supportedInterfaces"][-1]["url"] == f"reach://{ns}/reviewer-1"
    assert card["capabilities"]["extensions"][-1]["params"]["metadata"] == {"region": "us"}

    res = runner.invoke(
        app, ["agents", "card", "reviewer-1", "--redis-url", redis_url, "--namespace", ns]
    )
    assert res.exit_code == 0, res.output
    assert "Reviews code." in res.stdout and "code.review" in res.stdout

    res = runner.invoke(
        app, ["agents", "card", "nobody", "--redis-url", redis_url, "--namespace", ns]
    )
    assert res.exit_code == 2 and "No agent 'nobody'" in res.stderr


def test_cli_agents_card_warns_about_an_incomplete_given_card(redis_url: str, ns: str) -> None:
    _register(redis_url, ns, "odd-1", {"provider": {"organization": "no url"}})
    res = runner.invoke(
        app, ["agents", "card", "odd-1", "--json", "--redis-url", redis_url, "--namespace", ns]
    )
    assert res.exit_code == 0
    assert "card.provider.url" in res.stderr
    assert json.loads(res.stdout)["provider"] == {"organization": "no url"}

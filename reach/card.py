"""A2A Agent Cards: a registered reach agent described in the Agent2Agent format.

The card follows the A2A specification 1.0 (``AgentCard`` in the spec's ``a2a.proto``,
JSON field names in lowerCamelCase). Its required fields are ``name``, ``description``,
``supportedInterfaces``, ``version``, ``capabilities``, ``defaultInputModes``,
``defaultOutputModes`` and ``skills``; see docs/a2a.md for how reach fills each one.

* An agent may register with a card of its own (``reach.Agent(..., card={...})``); the
  registry stores it as JSON in the agent's hash. :func:`agent_card` keeps every field
  given there and completes the card with what the registry knows: one skill per
  capability, a ``reach://<namespace>/<agent_id>`` interface, the reach registration as
  a (non-required) extension.
* The interface it adds names reach's own binding (``REACH``: the envelope on Redis
  Streams of docs/protocol.md). A client that only speaks ``JSONRPC``, ``GRPC`` or
  ``HTTP+JSON`` finds no interface it can use here, unless the card lists one: the A2A
  gateway (:mod:`reach.gateway`) serves the card with its own ``JSONRPC`` interface first.
* :data:`A2A_TASK_STATES` maps reach task statuses to A2A task states; a ``dead`` message
  is ``rejected`` when its reason is a refusal (:func:`reach.outcomes.is_refusal`: the agent
  refused it for what it is), else ``failed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from .authz import declared_rules
from .outcomes import DeadReason, Status, is_refusal
from .registry import AgentInfo
from .schemas import published

A2A_PROTOCOL_VERSION = "1.0"
PROTOCOL_BINDING = "REACH"
REACH_EXTENSION_URI = "urn:reach:registration:v1"
DEFAULT_MODES = ["application/json"]


class A2ATaskState(StrEnum):
    """The A2A ``TaskState`` values, in the short form (A2A 0.3 wrote them so; the 1.0 JSON
    wire form is ``TASK_STATE_`` + upper case, see :func:`a2a_state_wire`)."""

    UNSPECIFIED = "unspecified"
    SUBMITTED = "submitted"
    WORKING = "working"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    INPUT_REQUIRED = "input-required"
    REJECTED = "rejected"
    AUTH_REQUIRED = "auth-required"


# reach task status (every reach.outcomes.Status) -> A2A TaskState.
# AUTH_REQUIRED has no reach counterpart.
A2A_TASK_STATES: dict[str, str] = {
    Status.SCHEDULED: A2ATaskState.SUBMITTED,  # kept until its due time, then sent
    Status.PENDING: A2ATaskState.SUBMITTED,  # in an inbox (or re-sent), no handler has it yet
    Status.RUNNING: A2ATaskState.WORKING,  # claimed by a worker, the handler runs
    Status.INPUT_REQUIRED: A2ATaskState.INPUT_REQUIRED,  # its handler waits (ctx.ask)
    # an attempt failed; it waits for its backoff, then runs again
    Status.RETRYING: A2ATaskState.WORKING,
    Status.SUCCEEDED: A2ATaskState.COMPLETED,
    Status.FAILED: A2ATaskState.FAILED,
    Status.EXPIRED: A2ATaskState.FAILED,  # the deadline passed (before start, or while running)
    Status.DEAD: A2ATaskState.FAILED,  # dead-lettered; REJECTED when the reason is a refusal
    Status.CANCELLED: A2ATaskState.CANCELED,  # client.cancel / reach cancel (tasks/cancel)
    Status.UNKNOWN: A2ATaskState.UNSPECIFIED,  # no record (never sent, or its record expired)
}


def a2a_task_state(status: str, reason: str = "") -> str:
    """The A2A task state (short form) of a reach task ``status`` and dead-letter ``reason``.

    >>> print(a2a_task_state("dead", "rejected"), a2a_task_state("dead", "max_attempts"))
    rejected failed
    """
    if status == Status.DEAD and is_refusal(reason):
        return A2ATaskState.REJECTED
    if status == Status.DEAD and reason == DeadReason.CANCELLED:
        return A2ATaskState.CANCELED
    return A2A_TASK_STATES.get(status, A2ATaskState.UNSPECIFIED)


def a2a_state_wire(state: str) -> str:
    """The A2A 1.0 JSON form of a short task state: ``input-required`` ->
    ``TASK_STATE_INPUT_REQUIRED``."""
    return "TASK_STATE_" + state.replace("-", "_").upper()


def reach_url(namespace: str, agent_id: str) -> str:
    """The interface URL of an agent: ``reach://<namespace>/<agent_id>`` (percent-encoded)."""
    return f"reach://{quote(namespace, safe='')}/{quote(agent_id, safe='')}"


def capability_skill(capability: str) -> dict[str, Any]:
    """The skill reach derives from a capability name (``text.summarize``)."""
    parts = capability.split(".")
    return {
        "id": capability,
        "name": " ".join(parts).replace("_", " ").capitalize(),
        "description": f"Answers reach messages of capability '{capability}'.",
        "tags": list(dict.fromkeys([capability, *parts])),
    }


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def timeout_note(timeout_s: float) -> str:
    """How a card's skill says the timeout its capability advertises."""
    return f" A call that names no timeout gets {timeout_s:g} s."


def _merge_skills(
    capabilities: list[str],
    given: Any,
    timeouts: Mapping[str, float],
    schemas: Mapping[str, Mapping[str, Any]],
    security: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One skill per capability (given fields win), then given skills of other ids. A
    capability that says who may call it (reach.authz) is tagged ``security:<level>``."""
    given_list = [s for s in _list(given) if isinstance(s, Mapping)]
    by_id = {str(s.get("id")): dict(s) for s in given_list if s.get("id")}
    skills = []
    for c in capabilities:
        skill = capability_skill(c)
        if c in timeouts:  # A2A skills have no field for it: the description says it
            skill["description"] += timeout_note(timeouts[c])
        for kind in ("input", "output"):  # reach's own fields (A2A has none for a schema)
            if kind in schemas.get(c, {}):
                skill[f"{kind}Schema"] = schemas[c][kind]
        merged = {**skill, **by_id.pop(c, {})}
        if security and c in security:  # the agent's rule, whatever a given skill says
            tags = [t for t in _list(merged.get("tags")) if not str(t).startswith("security:")]
            merged["tags"] = [*tags, f"security:{security[c]}"]
        skills.append(merged)
    skills += [dict(s) for s in given_list if str(s.get("id")) in by_id]
    return skills


def agent_card(info: AgentInfo, *, namespace: str) -> dict[str, Any]:
    """The A2A Agent Card of a registered agent, as a JSON-ready dict.

    Every field of the card the agent registered with is kept as given; reach fills what
    is missing (name = agent id, version = ``metadata["version"]`` or the registration
    stamp, ...), adds a skill per capability it lacks, its ``reach://`` interface after
    the given ones, and its registration as an extension in ``capabilities`` (with the
    timeouts it advertises, ``timeouts``: capability -> seconds, when it advertises any).
    A skill whose capability publishes schemas (:mod:`reach.schemas`) carries them as
    ``inputSchema`` / ``outputSchema`` (reach's fields: A2A skills have none for it; the
    registration extension's ``metadata.schemas`` holds them too, which an A2A SDK keeps).
    """
    given: dict[str, Any] = dict(info.card or {})
    meta = info.metadata
    url = reach_url(namespace, info.agent_id)
    caps = ", ".join(info.capabilities)
    timeouts = {c: t for c in info.capabilities if (t := info.timeout_s(c)) is not None}
    schemas = {c: s for c in info.capabilities if (s := published(meta, c))}
    security = {c: d.security for c, d in declared_rules(meta).items() if c in info.capabilities}

    interfaces = [
        dict(i) for i in _list(given.get("supportedInterfaces")) if isinstance(i, Mapping)
    ]
    if not any(i.get("url") == url for i in interfaces):
        interfaces.append(
            {
                "url": url,
                "protocolBinding": PROTOCOL_BINDING,
                "tenant": namespace,
                "protocolVersion": A2A_PROTOCOL_VERSION,
            }
        )

    capabilities: dict[str, Any] = {"streaming": False, "pushNotifications": False}
    if isinstance(given.get("capabilities"), Mapping):
        capabilities.update(given["capabilities"])
    registration = {
        "uri": REACH_EXTENSION_URI,
        "description": "This agent's reach registration (docs/a2a.md).",
        "required": False,
        "params": {
            "namespace": namespace,
            "agentId": info.agent_id,
            "state": info.state,
            "ready": info.ready,
            "draining": info.draining,
            "weight": info.weight,
            "capabilities": list(info.capabilities),
            "metadata": dict(meta),
            **({"timeouts": timeouts} if timeouts else {}),
        },
    }
    extensions = [
        e
        for e in _list(capabilities.get("extensions"))
        if not (isinstance(e, Mapping) and e.get("uri") == REACH_EXTENSION_URI)
    ]
    capabilities["extensions"] = [*extensions, registration]

    card: dict[str, Any] = {
        "name": given.get("name") or info.agent_id,
        "description": given.get("description")
        or meta.get("description")
        or f"reach agent {info.agent_id} ({caps}).",
        "supportedInterfaces": interfaces,
        "version": str(
            given.get("version") or meta.get("version") or info.app_version or info.version
        ),
        "capabilities": capabilities,
        "defaultInputModes": list(given.get("defaultInputModes") or DEFAULT_MODES),
        "defaultOutputModes": list(given.get("defaultOutputModes") or DEFAULT_MODES),
        "skills": _merge_skills(
            info.capabilities, given.get("skills"), timeouts, schemas, security
        ),
    }
    for key, value in given.items():  # provider, documentationUrl, iconUrl, security...
        card.setdefault(key, value)
    return card


# -- checking ------------------------------------------------------------------------------
# The fields A2A 1.0 marks REQUIRED, with their JSON types (list[str]: array of strings).
CARD_REQUIRED: dict[str, Any] = {
    "name": str,
    "description": str,
    "supportedInterfaces": list,
    "version": str,
    "capabilities": dict,
    "defaultInputModes": list[str],
    "defaultOutputModes": list[str],
    "skills": list,
}
INTERFACE_REQUIRED: dict[str, Any] = {"url": str, "protocolBinding": str, "protocolVersion": str}
SKILL_REQUIRED: dict[str, Any] = {"id": str, "name": str, "description": str, "tags": list[str]}
PROVIDER_REQUIRED: dict[str, Any] = {"url": str, "organization": str}


def _type_ok(value: Any, t: Any) -> bool:
    if t == list[str]:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, t)


def _check(obj: Any, required: Mapping[str, Any], where: str, out: list[str]) -> None:
    if not isinstance(obj, Mapping):
        out.append(f"{where}: must be an object")
        return
    for field, t in required.items():
        if field not in obj:
            out.append(f"{where}.{field}: required field missing")
        elif not _type_ok(obj[field], t):
            name = "list[str]" if t == list[str] else t.__name__
            out.append(f"{where}.{field}: must be {name}")


def card_problems(card: Mapping[str, Any]) -> list[str]:
    """What keeps ``card`` from being a valid A2A 1.0 Agent Card ([] when nothing).

    Checks the required fields and their types, of the card and of its interfaces,
    skills and provider (a card an agent registered with may be incomplete on its own:
    check the output of :func:`agent_card`).
    """
    out: list[str] = []
    _check(card, CARD_REQUIRED, "card", out)
    for i, iface in enumerate(card.get("supportedInterfaces") or []):
        _check(iface, INTERFACE_REQUIRED, f"card.supportedInterfaces[{i}]", out)
    if isinstance(card.get("supportedInterfaces"), list) and not card["supportedInterfaces"]:
        out.append("card.supportedInterfaces: needs at least one interface")
    for i, skill in enumerate(card.get("skills") or []):
        _check(skill, SKILL_REQUIRED, f"card.skills[{i}]", out)
    if "provider" in card:
        _check(card["provider"], PROVIDER_REQUIRED, "card.provider", out)
    return out

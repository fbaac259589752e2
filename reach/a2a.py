"""Outside A2A agents as reach capability providers: :func:`remote` (docs/a2a.md, *Calling
outside A2A agents*; the ``gateway`` extra).

``agent = await reach.a2a.remote("https://host/agent")`` resolves the agent's card and
returns a :class:`reach.Agent` (a proxy, not started) whose capabilities are the card's
skills (or the ones given); run it like any agent (``await agent.run(redis_url=...)``, or
:func:`proxy_agent` from a ``reach worker MODULE:FACTORY`` factory) and reach callers reach
the outside agent by capability: each message goes to it as an A2A ``SendMessage`` over
HTTP with the official ``a2a-sdk`` client, and its answer comes back as the result.

The mapping is the gateway's, the other way round: the payload becomes one part (a
string a text part, bytes a raw part, anything else a data part), the message's
``session_id`` the A2A ``contextId``; the result is the task's artifacts (or the message's
parts): one part is its value, several a list. When the card says it streams, each
artifact update is also a chunk (``ctx.emit``), as it comes. A task
that ends ``rejected``, ``input-required`` or ``auth-required`` is a refusal
(:class:`reach.Reject`: no retry); ``failed`` and ``canceled``, and HTTP errors, raise
:class:`RemoteA2AError`, which reach retries as any handler error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.client import Client as A2AClient
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

from .agent import Agent
from .context import Context
from .envelope import new_id
from .errors import ConfigError, Reject
from .registry import normalize_capability

_REFUSED = {
    TaskState.TASK_STATE_REJECTED: "rejected the task",
    TaskState.TASK_STATE_INPUT_REQUIRED: "asks for input (reach messages cannot answer it)",
    TaskState.TASK_STATE_AUTH_REQUIRED: "asks for authentication",
}
_FAILED = {
    TaskState.TASK_STATE_FAILED: "failed the task",
    TaskState.TASK_STATE_CANCELED: "cancelled the task",
}


class RemoteA2AError(Exception):
    """The outside A2A agent failed the task, or could not be reached (raised in the proxy's
    handler: reach retries it up to the message's max attempts, then dead-letters it)."""


def _part(value: Any) -> Part:
    if isinstance(value, str):
        return Part(text=value, media_type="text/plain")
    if isinstance(value, bytes | bytearray | memoryview):
        return Part(raw=bytes(value), media_type="application/octet-stream")
    return Part(data=ParseDict(value, struct_pb2.Value()), media_type="application/json")


def _value(part: Part) -> Any:
    if part.HasField("data"):
        return MessageToDict(part.data)
    if part.HasField("text"):
        return part.text
    if part.HasField("raw"):
        return bytes(part.raw)
    return {"url": part.url, "mediaType": part.media_type}


def _values(parts: Sequence[Part]) -> Any:
    vals = [_value(p) for p in parts]
    return vals[0] if len(vals) == 1 else vals


def _why(task: Task) -> str:
    return " ".join(p.text for p in task.status.message.parts if p.HasField("text"))


def capabilities_of(card: AgentCard) -> list[str]:
    """The reach capabilities a card's skills name: each skill id that is a capability name
    (lower case words joined by dots) as it is, else its words joined by dots."""
    caps: list[str] = []
    for skill in card.skills:
        try:
            caps.append(normalize_capability(skill.id))
        except ConfigError:
            words = re.findall(r"[a-z0-9]+", skill.id.lower())
            if words:
                caps.append(normalize_capability(".".join(words)))
    return list(dict.fromkeys(caps))


class _Remote:
    """The A2A client of one proxy, made in the event loop of its first message."""

    def __init__(
        self, url: str, card: AgentCard, headers: Mapping[str, str], timeout_s: float
    ) -> None:
        self.url, self.card, self.headers, self.timeout_s = url, card, dict(headers), timeout_s
        self._client: A2AClient | None = None

    def client(self) -> A2AClient:
        if self._client is None:
            http = httpx.AsyncClient(headers=self.headers, timeout=self.timeout_s)
            config = ClientConfig(httpx_client=http, streaming=self.card.capabilities.streaming)
            self._client = ClientFactory(config).create(self.card)
        return self._client

    async def call(self, payload: Any, ctx: Context) -> Any:
        msg = Message(role=Role.ROLE_USER, message_id=new_id(), parts=[_part(payload)])
        if ctx.session_id:
            msg.context_id = ctx.session_id
        msg.metadata.update({"capability": ctx.capability, "reachMsgId": ctx.msg_id})
        last: StreamResponse | None = None
        streamed: dict[str, list[Part]] = {}  # artifact id -> its parts, as updates came
        try:
            async for event in self.client().send_message(SendMessageRequest(message=msg)):
                if event.HasField("artifact_update"):
                    update = event.artifact_update
                    parts = list(update.artifact.parts)
                    if update.append:
                        streamed.setdefault(update.artifact.artifact_id, []).extend(parts)
                    else:
                        streamed[update.artifact.artifact_id] = parts
                    await ctx.emit(_values(parts))
                last = event
        except (httpx.HTTPError, OSError) as e:
            raise RemoteA2AError(f"A2A agent at {self.url} could not be reached: {e}") from e
        if last is None:
            raise RemoteA2AError(f"A2A agent at {self.url} sent no answer.")
        if last.HasField("message"):
            return _values(last.message.parts)
        task = last.task if last.HasField("task") else await self._task_of(last)
        state = task.status.state
        if state in _REFUSED:
            raise Reject(f"A2A agent at {self.url} {_REFUSED[state]}: {_why(task)}".rstrip(": "))
        if state in _FAILED:
            raise RemoteA2AError(f"A2A agent at {self.url} {_FAILED[state]}: {_why(task)}")
        parts = [p for a in task.artifacts for p in a.parts] or [
            p for ps in streamed.values() for p in ps
        ]
        if not parts and task.status.message.parts:
            parts = list(task.status.message.parts)
        return _values(parts) if parts else None

    async def _task_of(self, last: StreamResponse) -> Task:
        from a2a.types.a2a_pb2 import GetTaskRequest

        task_id = last.status_update.task_id or last.artifact_update.task_id
        return await self.client().get_task(GetTaskRequest(id=task_id))


def proxy_agent(
    url: str,
    *,
    capabilities: Sequence[str],
    agent_id: str | None = None,
    card: AgentCard | None = None,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    streaming: bool = False,
) -> Agent:
    """A reach agent forwarding its ``capabilities`` to the A2A agent at ``url`` (JSON-RPC),
    without fetching anything (a ``reach worker`` factory may call it). ``card``: the
    agent's resolved card (else a minimal one for ``url``, ``streaming`` as given);
    ``token``: sent as ``Authorization: Bearer``; ``timeout_s``: per HTTP call."""
    if not capabilities:
        raise ConfigError(f"No capability to serve for the A2A agent at {url}: give some.")
    caps = [normalize_capability(c) for c in capabilities]
    if card is None:
        card = AgentCard(
            name=agent_id or url,
            supported_interfaces=[
                AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
            ],
            capabilities=AgentCapabilities(streaming=streaming),
        )
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    remote = _Remote(url, card, hdrs, timeout_s)
    card_json = MessageToDict(card)
    card_json["supportedInterfaces"] = [
        {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        *[i for i in card_json.get("supportedInterfaces", []) if i.get("url") != url],
    ]
    app = Agent(
        agent_id or f"a2a-{'-'.join(re.findall(r'[a-z0-9]+', card.name.lower()))[:60] or new_id()}",
        capabilities=caps,
        metadata={"a2a_url": url},
        card=card_json,
    )
    for cap in caps:
        app.handler(cap)(remote.call)
    return app


async def remote(
    url: str,
    *,
    capabilities: Sequence[str] | None = None,
    agent_id: str | None = None,
    token: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> Agent:
    """Resolve the card of the A2A agent at ``url`` (``<url>/.well-known/agent-card.json``)
    and return a reach agent (not started) serving its skills as capabilities (or
    ``capabilities``), forwarding each message to it: see the module docstring."""
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient(headers=hdrs, timeout=timeout_s) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
    caps = list(capabilities) if capabilities is not None else capabilities_of(card)
    iface = next((i for i in card.supported_interfaces if i.protocol_binding == "JSONRPC"), None)
    if iface is None:
        raise ConfigError(f"The A2A agent at {url} offers no JSON-RPC interface.")
    return proxy_agent(
        iface.url,
        capabilities=caps,
        agent_id=agent_id,
        card=card,
        token=token,
        headers=headers,
        timeout_s=timeout_s,
    )

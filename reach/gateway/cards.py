"""The gateway's Agent Cards: its own (the capabilities as skills, the URLs of the
capability and agent servers), a capability's and an agent's, generated per request from
the registry so they follow agents as they come and go.

:class:`CardRoutes` holds the card routes and what they share (the security schemes, the
gateway extension); :class:`~reach.gateway.server.Gateway` serves them, and the input modes
a capability's agents declare decide how its messages' text is read.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import AgentCard
from google.protobuf.json_format import ParseDict, ParseError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._jwt import JwtVerifier
from .._version import __version__
from ..card import A2A_PROTOCOL_VERSION, DEFAULT_MODES, agent_card, capability_skill
from ..client import Client
from ..errors import ReachError
from ..registry import AgentInfo, advertised_timeout, normalize_capability
from .auth import Tokens
from .mapping import TEXT_MODE

CARD_PATH = "/.well-known/agent-card.json"
GATEWAY_EXTENSION_URI = "urn:reach:gateway:v1"
OUTPUT_MODES = ["application/json", TEXT_MODE]


def input_modes(capability: str, agents: Sequence[AgentInfo]) -> list[str]:
    """The input modes the agents of ``capability`` declare for it (the skill's, else
    their card's default), all of them; reach's default (JSON) when none does."""
    modes: set[str] = set()
    for a in agents:
        card = a.card or {}
        skills = card.get("skills")
        skill = next(
            (
                s
                for s in (skills if isinstance(skills, list) else [])
                if isinstance(s, Mapping) and s.get("id") == capability
            ),
            {},
        )
        given = skill.get("inputModes") or card.get("defaultInputModes")
        for m in given if isinstance(given, list) else DEFAULT_MODES:
            if isinstance(m, str):
                modes.add(m)
    return sorted(modes) or list(DEFAULT_MODES)


def _live(agents: Sequence[AgentInfo]) -> list[AgentInfo]:
    return [a for a in agents if a.state != "evicted"]


class CardRoutes:
    """The card routes of :class:`~reach.gateway.server.Gateway` (a base class of it: the
    attributes below are the gateway's)."""

    client: Client
    namespace: str
    tokens: Tokens | None
    jwt: JwtVerifier | None
    public_url: str | None
    mtls: bool

    def _base(self, request: Request) -> str:
        return self.public_url or str(request.base_url).rstrip("/")

    def _security(self) -> dict[str, Any]:
        """The cards' security: a bearer token when tokens or JWTs are taken, a client
        certificate when mutual TLS is on; both when both are (one requirement naming
        each)."""
        schemes: dict[str, Any] = {}
        if self.tokens is not None or self.jwt is not None:
            given = []
            if self.tokens is not None:
                given.append(
                    "a token the gateway's operator gave you (reach gateway --token-file / "
                    "REACH_GATEWAY_TOKENS)"
                )
            if self.jwt is not None:
                given.append(f"a JWT of {self.jwt.issuer} for the audience {self.jwt.audience}")
            text = " or ".join(given) + "."
            scheme: dict[str, Any] = {"scheme": "Bearer", "description": text[0].upper() + text[1:]}
            if self.tokens is None:
                scheme["bearerFormat"] = "JWT"
            schemes["bearer"] = {"httpAuthSecurityScheme": scheme}
        if self.mtls:
            schemes["mtls"] = {
                "mtlsSecurityScheme": {
                    "description": "A client certificate signed by the CA the gateway's "
                    "operator names (reach gateway --tls-client-ca)."
                }
            }
        if not schemes:
            return {}
        return {
            "securitySchemes": schemes,
            "securityRequirements": [{"schemes": {name: {"list": []} for name in schemes}}],
        }

    def _interface(self, url: str) -> dict[str, Any]:
        return {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": A2A_PROTOCOL_VERSION}

    def _extension(self, **params: Any) -> dict[str, Any]:
        return {
            "uri": GATEWAY_EXTENSION_URI,
            "description": "Served by a reach A2A gateway (docs/a2a.md).",
            "required": False,
            "params": {"namespace": self.namespace, **params},
        }

    def _gateway_card_dict(self, base: str, caps: Sequence[str], **params: Any) -> dict[str, Any]:
        return {
            "name": f"reach gateway ({self.namespace})",
            "description": f"The capabilities of reach namespace {self.namespace!r} as A2A "
            "servers: each at /caps/<capability>, each agent at /agents/<agent_id>. Here, "
            "a message names its capability in metadata.capability.",
            "supportedInterfaces": [self._interface(base + "/")],
            "version": __version__,
            "capabilities": {
                "streaming": True,
                "pushNotifications": False,
                "extensions": [self._extension(**params)],
            },
            "defaultInputModes": ["application/json", TEXT_MODE],
            "defaultOutputModes": OUTPUT_MODES,
            "skills": [capability_skill(c) for c in caps],
            **self._security(),
        }

    @staticmethod
    def _parse(card: Mapping[str, Any]) -> AgentCard:
        parsed: AgentCard = ParseDict(card, AgentCard(), ignore_unknown_fields=True)
        return parsed

    def _respond(self, card: Mapping[str, Any]) -> Response:
        return JSONResponse(agent_card_to_dict(self._parse(card)))

    async def _gateway_card(self, request: Request) -> Response:
        base = self._base(request)
        registry = self.client.registry
        caps = [c for c, _ in await registry.capabilities()]
        agents = [a for a in await registry.agents() if a.state != "evicted"]
        timeouts = {c: t for c in sorted(caps) if (t := advertised_timeout(agents, c))}
        return self._respond(
            self._gateway_card_dict(
                base,
                sorted(caps),
                capabilities={c: f"{base}/caps/{c}" for c in sorted(caps)},
                agents={a.agent_id: f"{base}/agents/{a.agent_id}" for a in agents},
                **({"timeouts": timeouts} if timeouts else {}),
            )
        )

    async def _cap_card(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            cap = normalize_capability(name)
        except ReachError:
            return _not_found(f"{name!r} is not a capability name.")
        agents = _live((await self.client.view.candidates(cap))[0])
        if not agents:
            known = [c for c, _ in await self.client.registry.capabilities()]
            close = difflib.get_close_matches(cap, known, n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            return _not_found(f"No live agent of capability {cap!r} in {self.namespace!r}.{hint}")
        base = self._base(request)
        skill = capability_skill(cap)
        for a in sorted(agents, key=lambda a: a.agent_id):  # the first that describes it
            given = next((s for s in agent_card(a, namespace=self.namespace)["skills"]), None)
            if given and given.get("id") == cap:
                skill = {**skill, **given}
                break
        ids = sorted(a.agent_id for a in agents)
        timeout_s = advertised_timeout(agents, cap)
        more = {"timeoutS": timeout_s} if timeout_s is not None else {}
        card = {
            "name": cap,
            "description": skill.get("description")
            or f"reach capability {cap!r} in namespace {self.namespace!r}.",
            "supportedInterfaces": [self._interface(f"{base}/caps/{cap}")],
            "version": __version__,
            "capabilities": {
                "streaming": True,
                "pushNotifications": False,
                "extensions": [
                    self._extension(
                        capability=cap, agents={i: f"{base}/agents/{i}" for i in ids}, **more
                    )
                ],
            },
            "defaultInputModes": input_modes(cap, agents),
            "defaultOutputModes": OUTPUT_MODES,
            "skills": [skill],
            **self._security(),
        }
        return self._respond(card)

    async def _agent_card(self, request: Request) -> Response:
        name = request.path_params["name"]
        info = await self.client.registry.get(name)
        if info is None or info.state == "evicted":
            return _not_found(f"No live agent {name!r} in {self.namespace!r}.")
        card = agent_card(info, namespace=self.namespace)
        card["supportedInterfaces"] = [
            self._interface(f"{self._base(request)}/agents/{info.agent_id}"),
            *card["supportedInterfaces"],
        ]
        card["capabilities"]["streaming"] = True
        card.update(self._security())
        try:
            return self._respond(card)
        except ParseError:  # a card the agent registered with that A2A cannot read
            bare = agent_card(msgspec.structs.replace(info, card=None), namespace=self.namespace)
            bare["supportedInterfaces"].insert(0, card["supportedInterfaces"][0])
            bare["capabilities"]["streaming"] = True
            return self._respond({**bare, **self._security()})


def _not_found(why: str) -> Response:
    return JSONResponse({"error": why}, status_code=404)

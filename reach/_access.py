"""Who may call an HTTP face, and how often (docs/a2a.md, *Identity*): the IP allow and
deny lists, the bearer tokens (static ones, :mod:`reach._tokens`, and JWTs,
:mod:`reach._jwt`) and the rate limit per caller, as one ASGI middleware in front of
everything else, so that a refused request is answered before any of its body is read.

In order, for each HTTP request:

1. the client's address (the peer's; with ``trust_proxy``, the last ``X-Forwarded-For``
   entry, the one the proxy in front wrote) against the lists: denied (a deny rule wins),
   or an allow list that does not hold it → 403;
2. ``GET``/``HEAD`` (the cards) go on, unauthenticated and not counted;
3. the bearer token: a static token, else (when configured) a JWT; none taken → 401 with
   ``WWW-Authenticate: Bearer ... error="invalid_token", error_description="..."`` saying
   what was wrong;
4. the caller's rate limit (a GCRA bucket per caller in Redis, ``lua/rate_limit.lua``, the
   capabilities' limiter, so exact over every process of the face): over it → 429 with
   ``Retry-After`` and a JSON-RPC error (``data.reachError`` ``RateLimited``). Without
   authentication the caller is the client's address.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from ._http import ASGIApp, Receive, Scope, Send
from ._jwt import JwtRefused, JwtVerifier
from ._tokens import Tokens
from .errors import ConfigError
from .limits import RateLimit, take_call

log = logging.getLogger("reach.access")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def networks(cidrs: Sequence[str], *, option: str) -> list[Network]:
    """``cidrs`` (``10.0.0.0/8``, ``::1``, a bare address is its /32 or /128) parsed."""
    out: list[Network] = []
    for text in cidrs:
        try:
            out.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError as e:
            raise ConfigError(f"{option} {text!r}: not an address or CIDR ({e}).") from e
    return out


class IpRules:
    """The allow and deny lists of a face (deny wins; an empty allow list allows all)."""

    def __init__(
        self, allow: Sequence[str] = (), deny: Sequence[str] = (), *, trust_proxy: bool = False
    ) -> None:
        self.allow = networks(allow, option="--allow-ip")
        self.deny = networks(deny, option="--deny-ip")
        self.trust_proxy = trust_proxy

    @property
    def active(self) -> bool:
        return bool(self.allow or self.deny)

    def address(self, scope: Scope) -> Address | None:
        """The client's address (None: none, or one that does not parse)."""
        text: str | None = None
        if self.trust_proxy:
            for name, value in scope.get("headers") or ():
                if name == b"x-forwarded-for":
                    text = value.decode("latin-1").split(",")[-1].strip()
        if text is None:
            client = scope.get("client")
            text = client[0] if client else None
        if not text:
            return None
        try:
            return ipaddress.ip_address(text)
        except ValueError:
            return None

    def refusal(self, address: Address | None) -> str | None:
        """Why ``address`` is refused (None: it is not)."""
        if not self.active:
            return None
        if address is None:
            return "The client's address is unknown, and this server has an IP list."
        if any(address in n for n in self.deny):
            return f"The address {address} is denied here."
        if self.allow and not any(address in n for n in self.allow):
            return f"The address {address} is not on this server's allow list."
        return None


class Authenticator:
    """Static bearer tokens and JWTs: the caller name of an ``Authorization`` header."""

    def __init__(self, tokens: Tokens | None = None, jwt: JwtVerifier | None = None) -> None:
        self.tokens = tokens
        self.jwt = jwt

    def describe(self) -> str:
        parts = []
        if self.tokens is not None:
            parts.append(f"{len(self.tokens)} token(s)")
        if self.jwt is not None:
            parts.append(f"JWTs ({', '.join(self.jwt.algorithms)})")
        return " and ".join(parts) or "no authentication"

    async def check(self, authorization: str | None) -> str:
        """The caller; raises :class:`JwtRefused` (its text for the caller) when the
        header names none."""
        if not authorization:
            raise JwtRefused("")  # no token: the challenge alone
        if self.tokens is not None:
            name = self.tokens.check(authorization)
            if name is not None:
                return name
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise JwtRefused("Send Authorization: Bearer <token>.")
        if self.jwt is not None and JwtVerifier.looks_like(token):
            return await self.jwt.verify(token)
        raise JwtRefused("The token is not one of this server's.")


Take = Callable[[str], Awaitable[float]]
"""Takes one request from a caller's bucket: the seconds to wait before it fits (0: it
was taken)."""


def _starlette_user(scope: Scope, caller: str) -> None:
    from starlette.authentication import AuthCredentials, SimpleUser

    scope["user"] = SimpleUser(caller)
    scope["auth"] = AuthCredentials(["authenticated"])


class Access:
    """The ASGI middleware of the module docstring. ``realm``: named in the challenge.
    ``take``: the rate limit (None: none). ``json_rpc``: a 429 is also a JSON-RPC error.
    ``open_methods``: methods served without a token or a count (the A2A cards' ``GET``;
    none for the MCP endpoint, whose ``GET`` is a stream). ``mark``: puts the caller in
    the request's scope (default: Starlette's ``request.user``, which the A2A SDK scopes
    tasks by)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        realm: str,
        ips: IpRules | None = None,
        auth: Authenticator | None = None,
        take: Take | None = None,
        json_rpc: bool = False,
        open_methods: Collection[str] = ("GET", "HEAD"),
        mark: Callable[[Scope, str], None] = _starlette_user,
    ) -> None:
        self.app = app
        self.realm = realm
        self.ips = ips
        self.auth = auth
        self.take = take
        self.json_rpc = json_rpc
        self.open_methods = frozenset(open_methods)
        self.mark = mark

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        address = self.ips.address(scope) if self.ips is not None else None
        if self.ips is not None:
            why = self.ips.refusal(address)
            if why is not None:
                await _answer(send, 403, {"error": why})
                return
        if scope["method"] in self.open_methods:
            await self.app(scope, receive, send)
            return
        caller: str | None = None
        if self.auth is not None:
            authorization = None
            for name, value in scope.get("headers") or ():
                if name == b"authorization":
                    authorization = value.decode("latin-1")
            try:
                caller = await self.auth.check(authorization)
            except JwtRefused as e:
                await self._unauthorized(send, str(e))
                return
            self.mark(scope, caller)
        if self.take is not None:
            if caller is None:  # no authentication: the address is the caller
                client = scope.get("client")
                peer = address if address is not None else (client[0] if client else "-")
                caller = f"ip:{peer}"
            wait_s = await self.take(caller)
            if wait_s > 0:
                await self._too_many(send, wait_s)
                return
        await self.app(scope, receive, send)

    async def _unauthorized(self, send: Send, why: str) -> None:
        challenge = f'Bearer realm="{self.realm}"'
        if why:
            challenge += f', error="invalid_token", error_description="{_quoted(why)}"'
        text = "Authentication required: send Authorization: Bearer <token>."
        await _answer(
            send,
            401,
            {"error": f"{text} {why}" if why else text},
            [(b"www-authenticate", challenge.encode("latin-1", "replace"))],
        )

    async def _too_many(self, send: Send, wait_s: float) -> None:
        why = (
            f"This caller is over its rate limit: the next request is taken in "
            f"{wait_s:.3f} s. Retry after that."
        )
        after = [(b"retry-after", str(max(1, math.ceil(wait_s))).encode())]
        body: dict[str, Any] = {"error": why}
        if self.json_rpc:
            body = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": -32603,
                    "message": why,
                    "data": {"reachError": "RateLimited", "retryAfterS": wait_s},
                },
            }
        await _answer(send, 429, body, after)


def _quoted(text: str) -> str:
    # A quoted-string of RFC 9110, printable ASCII only: the description is read by people.
    clean = "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
    return clean.replace("\\", "\\\\").replace('"', '\\"')


async def _answer(
    send: Send, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def redis_take(commands: Callable[[], Any], namespace: str, face: str, limit: RateLimit) -> Take:
    """A :data:`Take` on ``limit`` in Redis (through ``commands()``, a started client's
    commands), one bucket per caller of ``face``. Redis away: the request goes on (it meets the same Redis next
    and reports that), as a client's own rate check does."""
    from redis import exceptions as rexc

    from .errors import RedisUnavailable
    from .keys import Keys

    keys = Keys(namespace)

    async def take(caller: str) -> float:
        state = keys.caller_rate_state(face, caller)
        try:
            taken = await take_call(keys, caller, limit, 1, state=state).run(commands())
        except (RedisUnavailable, rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
            log.warning("the rate limit of %s could not be read (%s): served", caller, e)
            return 0.0
        return 0.0 if taken.granted else max(taken.wait_us / 1e6, 0.001)

    return take

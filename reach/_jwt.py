"""JWT bearer tokens at an HTTP face (``reach gateway --jwks``; docs/a2a.md, *Identity*),
verified with PyJWT.

A token is taken when its signature verifies with a key of the configured JWKS (a file or
an ``https`` URL), its algorithm is one allowed (asymmetric only unless a shared secret is
given: never ``none``, never an HMAC keyed with a public key), its ``aud`` and ``iss`` are
the configured ones and it is within ``exp``/``nbf`` (with a small leeway; ``exp`` is
required: a token without it would be a credential for ever). The caller it stands for
is one claim (``sub`` by default), percent-encoded where it holds a character a caller
name may not (``:`` separates the caller from the context in a gateway session id).

A JWKS URL is fetched with a timeout, its body bounded, and kept; it is fetched again when
older than ``ttl_s`` and when a token names a ``kid`` it does not hold, at most once per
``min_refresh_s`` (a caller spraying unknown kids causes no more fetches than that). A
failed fetch keeps the keys already held. A JWKS file is re-read on an unknown ``kid`` when
it changed, under the same bound.

A refusal is :class:`JwtRefused`, whose text says what was wrong (expired, wrong
audience, bad signature) and never holds a key.

Held outside :mod:`reach.gateway` so that the MCP face can use it without the A2A SDK.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jwt
from jwt import exceptions as jex

from .errors import ConfigError

DEFAULT_ALGORITHMS = ("RS256", "ES256", "EdDSA")
ASYMMETRIC = frozenset(
    {
        "RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
        "ES256", "ES384", "ES512", "ES256K", "EdDSA",
    }
)  # fmt: skip
SHARED = frozenset({"HS256", "HS384", "HS512"})
DEFAULT_CALLER_CLAIM = "sub"
DEFAULT_LEEWAY_S = 30.0
DEFAULT_TTL_S = 600.0
DEFAULT_MIN_REFRESH_S = 30.0
DEFAULT_FETCH_TIMEOUT_S = 5.0
MAX_JWKS_BYTES = 1024 * 1024
MAX_TOKEN_CHARS = 16 * 1024
MAX_CALLER_CHARS = 128
MIN_SECRET_BYTES = 32
# What a caller name keeps as it is; everything else is percent-encoded (':' and '%' so).
_CALLER_SAFE = "@|+=/"


class JwtRefused(Exception):
    """A bearer token that is not taken; ``str()`` says why, for the caller."""


def caller_of(value: object, claim: str) -> str:
    """The caller name of a claim's value: a non-empty string, percent-encoded outside
    ``[A-Za-z0-9_.~@|+=/-]``, at most :data:`MAX_CALLER_CHARS` characters."""
    if not isinstance(value, str) or not value:
        raise JwtRefused(f"The token's {claim!r} claim is not a non-empty string.")
    name = quote(value, safe=_CALLER_SAFE)
    if len(name) > MAX_CALLER_CHARS:
        raise JwtRefused(
            f"The token's {claim!r} claim is over {MAX_CALLER_CHARS} characters (encoded)."
        )
    return name


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_jwks(text: str | bytes, *, where: str) -> dict[str | None, dict[str, Any]]:
    """The signing keys of a JWKS document by ``kid`` (None: a key without one, allowed
    when it is the only key). Shared (``oct``) keys and keys for another use are left out:
    an HMAC key is given only as the explicit shared secret."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: not a JSON document ({e}); give a JWKS.") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ConfigError(f'{where}: not a JWKS (a JSON object with a "keys" list).')
    out: dict[str | None, dict[str, Any]] = {}
    for jwk in doc["keys"]:
        if not isinstance(jwk, dict) or jwk.get("kty") not in ("RSA", "EC", "OKP"):
            continue
        if jwk.get("use", "sig") != "sig":
            continue
        kid = jwk.get("kid")
        if kid is not None and not isinstance(kid, str):
            continue
        out[kid] = jwk
    if not out:
        raise ConfigError(f"{where}: the JWKS has no RSA, EC or OKP signing key.")
    if None in out and len(out) > 1:
        raise ConfigError(f"{where}: a key without a kid among several; give each its kid.")
    return out


class KeySource:
    """The keys of a JWKS file or URL, kept and refreshed (see the module docstring)."""

    def __init__(
        self,
        where: str,
        *,
        timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
        ttl_s: float = DEFAULT_TTL_S,
        min_refresh_s: float = DEFAULT_MIN_REFRESH_S,
    ) -> None:
        self.where = where
        self.is_url = where.startswith(("http://", "https://"))
        if self.is_url:
            parts = urlsplit(where)
            if parts.scheme != "https" and not _loopback(parts.hostname or ""):
                raise ConfigError(
                    f"--jwks {where}: fetch keys over https (plain http only from a "
                    "loopback address): whoever can change them in transit could sign "
                    "tokens."
                )
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.min_refresh_s = min_refresh_s
        self.keys: dict[str | None, dict[str, Any]] = {}
        self._read_at = -float("inf")
        self._tried_at = -float("inf")
        self._mtime = 0.0
        self._lock: asyncio.Lock | None = None
        self.fetches = 0

    async def _read(self) -> dict[str | None, dict[str, Any]]:
        self.fetches += 1
        if not self.is_url:
            path = Path(self.where)
            try:
                self._mtime = path.stat().st_mtime
                return parse_jwks(path.read_bytes(), where=self.where)
            except OSError as e:
                raise ConfigError(f"Cannot read the JWKS file {self.where}: {e}") from e
        import httpx

        body = bytearray()
        try:
            async with (
                httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as h,
                h.stream("GET", self.where, headers={"Accept": "application/json"}) as r,
            ):
                if r.status_code != 200:
                    raise ConfigError(f"{self.where} answered HTTP {r.status_code}, not a JWKS.")
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        raise ConfigError(f"{self.where}: over {MAX_JWKS_BYTES} bytes.")
        except httpx.HTTPError as e:
            raise ConfigError(f"Cannot fetch the JWKS {self.where}: {e!r}") from e
        return parse_jwks(bytes(body), where=self.where)

    async def load(self) -> None:
        """Read the keys now (at start: a failure is the face's to report)."""
        self.keys = await self._read()
        self._read_at = self._tried_at = time.monotonic()

    def _changed(self) -> bool:
        try:
            return Path(self.where).stat().st_mtime != self._mtime
        except OSError:
            return False

    async def _refresh(self, *, unknown: bool) -> None:
        now = time.monotonic()
        stale = self.is_url and now - self._read_at >= self.ttl_s
        if not stale and not unknown:
            return
        if now - self._tried_at < self.min_refresh_s:
            return
        if not self.is_url and not self._changed():
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if time.monotonic() - self._tried_at < self.min_refresh_s:
                return  # another request refreshed meanwhile
            self._tried_at = time.monotonic()
            try:
                self.keys = await self._read()
                self._read_at = time.monotonic()
            except ConfigError:
                return  # the keys held stay; the next try after min_refresh_s

    async def key(self, kid: str | None) -> dict[str, Any] | None:
        """The JWK of ``kid`` (a token without a kid: the only key), refreshing first when
        the keys are stale or do not hold it."""
        await self._refresh(unknown=False)
        found = self._find(kid)
        if found is None:
            await self._refresh(unknown=True)
            found = self._find(kid)
        return found

    def _find(self, kid: str | None) -> dict[str, Any] | None:
        if kid is None:
            return next(iter(self.keys.values())) if len(self.keys) == 1 else None
        return self.keys.get(kid)


class JwtVerifier:
    """Verifies JWT bearer tokens and names their caller (see the module docstring).

    ``keys``: the JWKS (None: a shared secret only). ``audience``, ``issuer``: required
    of every token. ``algorithms``: those taken (default RS256, ES256, EdDSA, plus HS256
    when a ``shared_secret`` is given; HS* only with one). ``caller_claim``: the claim that
    names the caller. ``leeway_s``: the clock skew allowed on ``exp``, ``nbf`` and ``iat``.
    """

    def __init__(
        self,
        keys: KeySource | None,
        *,
        audience: str,
        issuer: str,
        algorithms: Sequence[str] | None = None,
        caller_claim: str = DEFAULT_CALLER_CLAIM,
        leeway_s: float = DEFAULT_LEEWAY_S,
        shared_secret: bytes | None = None,
    ) -> None:
        if not audience or not issuer:
            raise ConfigError(
                "JWT tokens need --jwt-audience and --jwt-issuer: a token minted for "
                "another service, or by another issuer, must not be taken here."
            )
        if keys is None and shared_secret is None:
            raise ConfigError("JWT tokens need keys: give --jwks FILE_OR_URL (or a secret).")
        if shared_secret is not None and len(shared_secret) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"The JWT shared secret has {len(shared_secret)} bytes: use at least "
                f"{MIN_SECRET_BYTES} random ones."
            )
        if algorithms is None:
            algorithms = DEFAULT_ALGORITHMS + (("HS256",) if shared_secret else ())
        algs = tuple(dict.fromkeys(a.strip() for a in algorithms if a.strip()))
        for alg in algs:
            if alg in SHARED and shared_secret is None:
                raise ConfigError(
                    f"JWT algorithm {alg}: HMAC algorithms need an explicit shared secret "
                    "(--jwt-secret-file); with a JWKS, use an asymmetric one."
                )
            if alg not in ASYMMETRIC | SHARED:
                raise ConfigError(
                    f"JWT algorithm {alg!r} is not taken: use some of "
                    f"{', '.join(sorted(ASYMMETRIC | SHARED))} (never 'none')."
                )
        if not algs:
            raise ConfigError("No JWT algorithm given.")
        if keys is None and not any(a in SHARED for a in algs):
            raise ConfigError("Asymmetric JWT algorithms need --jwks FILE_OR_URL.")
        self.keys = keys
        self.audience = audience
        self.issuer = issuer
        self.algorithms = algs
        self.caller_claim = caller_claim
        self.leeway_s = leeway_s
        self._secret = shared_secret
        self._built: dict[tuple[str, str | None], Any] = {}

    @staticmethod
    def looks_like(token: str) -> bool:
        """Whether ``token`` has a JWT's form (three dot-separated parts)."""
        return token.count(".") == 2

    async def _key(self, alg: str, kid: str | None) -> Any:
        if alg in SHARED:
            return self._secret
        assert self.keys is not None
        jwk = await self.keys.key(kid)
        if jwk is None:
            raise JwtRefused(
                "Unknown signing key: the token's kid is not in the server's JWKS."
                if kid is not None
                else "The token has no kid and the JWKS holds several keys."
            )
        if jwk.get("alg", alg) != alg:
            raise JwtRefused(f"The token's key is for {jwk.get('alg')}, not {alg}.")
        built = self._built.get((alg, kid))
        if built is None or built[0] is not jwk:
            try:
                built = (jwk, jwt.PyJWK(jwk, algorithm=alg).key)
            except (jex.PyJWKError, jex.InvalidKeyError, ValueError, TypeError) as e:
                raise JwtRefused(f"The token's key does not fit algorithm {alg}.") from e
            self._built[(alg, kid)] = built
        return built[1]

    async def verify(self, token: str) -> str:
        """The caller name of ``token``; raises :class:`JwtRefused` saying why not."""
        if len(token) > MAX_TOKEN_CHARS:
            raise JwtRefused(f"The token is over {MAX_TOKEN_CHARS} characters.")
        try:
            header = jwt.get_unverified_header(token)
        except jex.DecodeError as e:
            raise JwtRefused("The token is not a well-formed JWT.") from e
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise JwtRefused(
                f"The token's algorithm {str(alg)[:16]!r} is not taken here (taken: "
                f"{', '.join(self.algorithms)})."
            )
        if kid is not None and not isinstance(kid, str):
            raise JwtRefused("The token's kid is not a string.")
        key = await self._key(alg, kid)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={"require": ["exp", "aud", "iss"]},
            )
        except jex.ExpiredSignatureError as e:
            raise JwtRefused("The token has expired (exp).") from e
        except jex.ImmatureSignatureError as e:
            raise JwtRefused("The token is not valid yet (nbf or iat in the future).") from e
        except jex.InvalidAudienceError as e:
            raise JwtRefused("Wrong audience: the token's aud is not this server's.") from e
        except jex.InvalidIssuerError as e:
            raise JwtRefused("Wrong issuer: the token's iss is not the one trusted.") from e
        except jex.InvalidSignatureError as e:
            raise JwtRefused("Bad signature: the token does not verify with its key.") from e
        except jex.MissingRequiredClaimError as e:
            raise JwtRefused(f"The token has no {e.claim!r} claim.") from e
        except jex.InvalidTokenError as e:
            raise JwtRefused(f"Invalid token ({type(e).__name__}).") from e
        return caller_of(claims.get(self.caller_claim), self.caller_claim)

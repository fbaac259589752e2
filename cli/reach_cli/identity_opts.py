"""The options of an HTTP face's identity (``reach gateway``; docs/a2a.md, *Identity*): JWT
bearer tokens, a rate limit per caller, IP allow and deny lists, as option types a
command takes and the objects they make."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from reach.errors import ConfigError

if TYPE_CHECKING:
    from reach.limits import RateLimit

Jwks = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="FILE_OR_URL",
        help="Take JWT bearer tokens signed by a key of this JWKS (a file, or an https "
        "URL fetched with a timeout and cached); needs --jwt-audience and --jwt-issuer.",
    ),
]

JwtAudience = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(metavar="AUD", help="The aud every JWT must carry (this server's)."),
]

JwtIssuer = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(metavar="ISS", help="The iss every JWT must carry (the trusted issuer)."),
]

JwtAlgorithms = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="ALGS",
        help="JWT algorithms taken, comma-separated (default RS256,ES256,EdDSA; HS* "
        "only with --jwt-secret-file; never none).",
    ),
]

JwtCallerClaim = Annotated[
    str, typer.Option(metavar="CLAIM", help="The JWT claim that names the caller.")
]

JwtLeewayS = Annotated[
    float, typer.Option(help="Clock skew allowed on a JWT's exp and nbf, seconds.")
]

JwtSecretFile = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        metavar="FILE",
        help="A shared secret for HS256 JWTs (its first line; at least 32 bytes).",
    ),
]

RatePerCaller = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        metavar="RATE",
        help="Each caller (token name or JWT claim; else the client address) sends at "
        "most this many requests: 10/s, 600/m; 429 with Retry-After past it.",
    ),
]

Burst = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(min=1, help="Requests a caller may send at once after a quiet spell."),
]

AllowIp = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(metavar="CIDR", help="Serve only these addresses (repeatable); others get 403."),
]

DenyIp = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(metavar="CIDR", help="Refuse these addresses with 403 (repeatable; deny wins)."),
]

TrustProxy = Annotated[
    bool,
    typer.Option(
        "--trust-proxy",
        help="The client's address is the last X-Forwarded-For entry (only behind a "
        "proxy every connection comes through).",
    ),
]


def caller_rate(rate_per_caller: str | None, burst: int | None) -> RateLimit | None:
    """The RateLimit of --rate-per-caller and --burst (None: no limit)."""
    from reach.limits import parse_limit

    if burst is not None and rate_per_caller is None:
        raise ConfigError("--burst goes with --rate-per-caller.")
    return None if rate_per_caller is None else parse_limit(rate_per_caller, burst=burst)


def jwt_verifier(
    jwks: str | None,
    audience: str | None,
    issuer: str | None,
    algorithms: str | None,
    caller_claim: str,
    leeway_s: float,
    secret_file: Path | None,
) -> Any:
    """The JwtVerifier of the --jwt options (its JWKS read now: a bad one stops the start);
    None without --jwks and --jwt-secret-file."""
    from reach._jwt import JwtVerifier, KeySource

    if jwks is None and secret_file is None:
        if audience or issuer or algorithms:
            raise ConfigError("--jwt-* options need --jwks FILE_OR_URL (or --jwt-secret-file).")
        return None
    if not (math.isfinite(leeway_s) and 0 <= leeway_s <= 300):
        raise ConfigError(f"--jwt-leeway-s must be 0..300 seconds, not {leeway_s}.")
    secret = None
    if secret_file is not None:
        try:
            secret = (secret_file.read_text().splitlines() or [""])[0].strip().encode()
        except OSError as e:
            raise ConfigError(f"Cannot read the JWT secret file {secret_file}: {e}") from e
    source = KeySource(jwks) if jwks is not None else None
    verifier = JwtVerifier(
        source,
        audience=audience or "",
        issuer=issuer or "",
        algorithms=algorithms.split(",") if algorithms else None,
        caller_claim=caller_claim,
        leeway_s=leeway_s,
        shared_secret=secret,
    )
    if source is not None:
        asyncio.run(source.load())
    return verifier

"""Who may call an HTTP face (the A2A gateway, the MCP face): bearer tokens, compared in
constant time (docs/a2a.md and docs/mcp.md, *Security*).

Tokens come from a file (``reach gateway --token-file``, ``reach mcp --token-file``, one a
line) and from an environment variable (``REACH_GATEWAY_TOKENS``, ``REACH_MCP_TOKENS``:
comma-separated). A line is ``TOKEN`` or ``NAME:TOKEN``; the name (``token-N`` when none is
given) is the caller's identity inside the face: the gateway's tasks are their caller's
own, and the name goes on the fabric in a header of each message it sends
(``a2a-caller``, ``mcp-caller``).

Held outside :mod:`reach.gateway` so that the MCP face does not import the A2A SDK.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable
from pathlib import Path

from .errors import ConfigError

TOKENS_ENV = "REACH_GATEWAY_TOKENS"
MIN_TOKEN_CHARS = 16
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def _digest(token: str) -> bytes:
    # Compared as fixed-size digests: the comparison takes the same time whatever the
    # length of the given token and of the right one.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Tokens:
    """The bearer tokens the gateway accepts, each with the caller name it stands for."""

    def __init__(self, named: Iterable[tuple[str, str]]) -> None:
        self._items: list[tuple[bytes, str]] = []
        for name, token in named:
            if len(token) < MIN_TOKEN_CHARS:
                raise ConfigError(
                    f"The token of {name!r} has {len(token)} characters: use at least "
                    f"{MIN_TOKEN_CHARS} random ones (e.g. python -c 'import secrets; "
                    "print(secrets.token_urlsafe(32))')."
                )
            self._items.append((_digest(token), name))

    def __len__(self) -> int:
        return len(self._items)

    @classmethod
    def parse(cls, lines: Iterable[str], *, where: str) -> list[tuple[str, str]]:
        """``(name, token)`` of each line that is not blank or a ``#`` comment."""
        out: list[tuple[str, str]] = []
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, token = line.partition(":")
            if not sep or not _NAME.match(name):
                name, token = "", line
            out.append((name or f"token-{len(out) + 1}", token.strip()))
        names = [n for n, _ in out]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}: a caller name is given twice; give each token its own.")
        return out

    @classmethod
    def load(
        cls,
        token_file: Path | None = None,
        *,
        env: str | None = None,
        env_name: str = TOKENS_ENV,
    ) -> Tokens | None:
        """The tokens of ``token_file`` and of the variable ``env_name``
        (``REACH_GATEWAY_TOKENS``; its value ``env`` when given); None when neither gives
        any (the face then runs without authentication, which the CLI allows on a loopback
        address only)."""
        named: list[tuple[str, str]] = []
        if token_file is not None:
            try:
                text = token_file.read_text()
            except OSError as e:
                raise ConfigError(f"Cannot read the token file {token_file}: {e}") from e
            named += cls.parse(text.splitlines(), where=str(token_file))
        value = os.environ.get(env_name, "") if env is None else env
        named += cls.parse(value.split(","), where=env_name)
        return cls(named) if named else None

    def check(self, authorization: str | None) -> str | None:
        """The caller name of an ``Authorization: Bearer TOKEN`` header; None when the
        header is missing or its token is not one of these. Every token is compared,
        whether or not one matched already."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        given = _digest(token.strip())
        found: str | None = None
        for digest, name in self._items:
            if hmac.compare_digest(given, digest):
                found = name
        return found

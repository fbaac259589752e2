"""Who may call the gateway: bearer tokens (:mod:`reach._tokens`, which the MCP face
shares; docs/a2a.md, *Security*)."""

from __future__ import annotations

from .._tokens import MIN_TOKEN_CHARS, TOKENS_ENV, Tokens

__all__ = ["MIN_TOKEN_CHARS", "TOKENS_ENV", "Tokens"]

"""Agents whose handlers fail, for the traceback tests (in-process and as `reach worker`
processes)."""

from __future__ import annotations

import os
from typing import Any

from reach import Agent, Context


def lookup(payload: dict[str, Any]) -> Any:
    return payload["txt"]  # a KeyError for a payload without "txt"


def failing_agent(agent_id: str | None = None) -> Agent:
    """``fail.key``: reads ``payload["txt"]`` (a KeyError without it); ``fail.deep``:
    recurses ``payload["depth"]`` frames, then fails the same way (a long traceback);
    ``fail.secret``: raises with a secret in its message."""
    app = Agent(
        agent_id or os.environ.get("REACH_TEST_AGENT_ID", "failing-1"),
        capabilities=["fail.key", "fail.deep", "fail.secret"],
    )

    @app.handler("fail.key")
    async def key(payload: dict[str, Any], ctx: Context) -> Any:
        return {"got": lookup(payload)}

    def deep(n: int, payload: dict[str, Any]) -> Any:
        return lookup(payload) if n <= 0 else deep(n - 1, payload)

    @app.handler("fail.deep")
    async def deep_handler(payload: dict[str, Any], ctx: Context) -> Any:
        return deep(int(payload["depth"]), {})

    @app.handler("fail.secret")
    async def secret(payload: dict[str, Any], ctx: Context) -> Any:
        token = payload["token"]
        raise RuntimeError(f"upstream refused token {token}")

    return app


def mask_tokens(text: str) -> str:
    """A redaction hook for ``reach worker --redact-traceback``: masks the token
    ``fail.secret`` raises with in the tests."""
    return text.replace("s3cr3t", "***")

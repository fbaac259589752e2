"""Shell completion of capabilities and agent ids, read from the live registry.

``reach --install-completion`` installs typer's completion script for the user's shell;
then TAB after ``--cap``, ``reach send``, ``reach agents show`` and the like offers what
the registry holds. The Redis is found as every command finds it (``--redis-url`` and
``--namespace`` already typed on the line, else ``REACH_REDIS_URL`` /
``REACH_NAMESPACE``, else the nearest ``reach.toml`` / ``.reach/config``). Completion
never gets in the way of typing: no Redis configured, one that does not answer within
:data:`TIMEOUT_S`, or any error at all, and it offers nothing.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import anyio
import typer

from reach.config import locate_redis_url
from reach.connection import AnyRedis, connect
from reach.registry import Registry

TIMEOUT_S = 1.0
"""The longest a completion waits for Redis (connecting and reading)."""
MAX_ITEMS = 200


def _where(ctx: typer.Context) -> tuple[str, str] | None:
    """(Redis URL, namespace) of the command being completed, or None: none configured."""
    params = ctx.params or {}
    given = params.get("redis_url") or None
    ns = params.get("namespace") or os.environ.get("REACH_NAMESPACE") or "default"
    try:
        return locate_redis_url(given).url, str(ns)
    except Exception:  # noqa: BLE001 - no Redis configured: nothing to offer
        return None


def _ask(
    ctx: typer.Context, read: Callable[[Registry], Awaitable[list[str]]], incomplete: str
) -> list[str]:
    where = _where(ctx)
    if where is None:
        return []
    url, ns = where

    async def go() -> list[str]:
        r: AnyRedis | None = None
        with anyio.move_on_after(TIMEOUT_S):
            try:
                r = await connect(url)
                return await read(Registry(r, ns))
            finally:
                if r is not None:
                    with anyio.move_on_after(0.2, shield=True):
                        await r.aclose()
        return []

    try:
        found = anyio.run(go)
    except BaseException:  # noqa: BLE001 - completion never fails the shell (even ^C)
        return []
    return sorted({x for x in found if x.startswith(incomplete)})[:MAX_ITEMS]


async def _capabilities(reg: Registry) -> list[str]:
    return [cap for cap, _ in await reg.capabilities()]


async def _agent_ids(reg: Registry) -> list[str]:
    return await reg.agent_ids()


def complete_capability(ctx: typer.Context, incomplete: str) -> list[str]:
    """Typer autocompletion: the namespace's capabilities starting with ``incomplete``."""
    return _ask(ctx, _capabilities, incomplete)


def complete_agent_id(ctx: typer.Context, incomplete: str) -> list[str]:
    """Typer autocompletion: the namespace's agent ids starting with ``incomplete``."""
    return _ask(ctx, _agent_ids, incomplete)

"""Tenants on their own Redis in tests: agents that say which Redis served them, the keys a
namespace has on a server, a tenant map written to reach.toml."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import redis as redis_sync

from reach import Agent, Context
from reach.client import Client
from tests.support.agents_messaging import FAST, wait_eligible


def keys_of(url: str, ns: str) -> list[str]:
    with redis_sync.Redis.from_url(url) as r:
        return sorted(k.decode() for k in r.scan_iter(match=f"*{ns}*", count=1000))


def where_am_i(label: str) -> Agent:
    """An agent that answers with the label of the Redis it serves."""
    app = Agent(f"echo-{label}", capabilities=["where", "where.chunks"])

    @app.handler("where")
    async def where(payload: dict[str, str], ctx: Context) -> dict[str, str]:
        return {"served_by": label, "tenant": payload["tenant"]}

    @app.handler("where.chunks")
    async def chunks(payload: dict[str, str], ctx: Context) -> AsyncIterator[str]:
        for i in range(3):
            yield f"{label}{i}"

    return app


@asynccontextmanager
async def agents_on(*placed: tuple[Agent, str, str]) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        for app, url, ns in placed:
            tg.start_soon(partial(app.run, redis_url=url, namespace=ns, **FAST))
        try:
            for app, url, ns in placed:
                async with Client(redis_url=url, namespace=ns) as c:
                    await wait_eligible(c, "where", [app.agent_id])
            yield
        finally:
            for app, _, _ in placed:
                app.stop()


def write_map(directory: Path, tenants: dict[str, tuple[str, str]]) -> Path:
    """A reach.toml in ``directory`` with ``[tenants.<id>]`` of each (url, namespace)."""
    lines = []
    for tid, (url, ns) in tenants.items():
        lines += [f"[tenants.{tid}]", f'redis_url = "{url}"', f'namespace = "{ns}"', ""]
    f = directory / "reach.toml"
    f.write_text("\n".join(lines))
    return f


tenant_worker = Agent("tenant-worker", capabilities=["where"])
"""``reach worker tests.support.tenants:tenant_worker --tenant a --tenant b``: it answers
with the namespace that served the message."""


@tenant_worker.handler("where")
async def _where_served(payload: dict[str, str], ctx: Context) -> dict[str, str]:
    return {"served_by": ctx.keys.namespace, "tenant": payload["tenant"]}

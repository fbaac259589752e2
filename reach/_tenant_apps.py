"""Every tenant of the tenant map behind one HTTP face (``reach gateway --all-tenants``,
``reach mcp --all-tenants``; docs/operations.md, *Tenants on their own Redis*): each
request names its tenant in the ``X-Reach-Tenant`` header and goes to the application of
that tenant's Redis and namespace (its own reach client, stores and limits), made and
started at the tenant's first request.

A request without the header is the tenant ``default``'s (the map's default entry, or a
tenant named ``default``); a tenant the map does not give is refused with 404 before
anything reaches a Redis, and the refusal names no other tenant (a caller may not learn
who else is served here); an id that is no tenant id, 400; a tenant whose application
cannot start (its Redis down), 503, the other tenants served on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio
import anyio.abc

from .errors import ConfigError, ReachError, UnknownTenant
from .tenants import DEFAULT_TENANT, TENANT_HEADER, Tenant, Tenants

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.types import Receive, Scope, Send

log = logging.getLogger("reach.tenants")

_HEADER = TENANT_HEADER.lower().encode("latin-1")
F = TypeVar("F")


class TenantApps(Generic[F]):
    """An ASGI application (this object) serving every tenant of ``tenants``.
    ``make(tenant)`` builds one tenant's face (a Gateway, an MCP face: anything) and
    ``app_of(face)`` its Starlette application; the face's lifespan runs in a task of this
    application's own lifespan from the tenant's first request to the shutdown. Tenants
    that share a Redis and namespace share one face."""

    def __init__(
        self,
        tenants: Tenants,
        make: Callable[[Tenant], F],
        app_of: Callable[[F], Starlette],
    ) -> None:
        self.tenants = tenants
        self._make = make
        self._app_of = app_of
        self._open: dict[Tenant, tuple[F, Starlette]] = {}
        self._locks: dict[Tenant, anyio.Lock] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._stop = anyio.Event()

    @property
    def opened(self) -> dict[Tenant, F]:
        """The tenants' faces started so far."""
        return {t: face for t, (face, _) in self._open.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        tenant = DEFAULT_TENANT
        for name, value in scope.get("headers", []):
            if name == _HEADER:
                tenant = value.decode("latin-1").strip()
                break
        try:
            target = self.tenants.resolve(tenant)
        except UnknownTenant:
            await _refuse(send, 404, f"No tenant {tenant!r} is served here.")
            return
        except ConfigError as e:
            await _refuse(send, 400, f"{TENANT_HEADER}: {e}")
            return
        try:
            app = await self._app(target)
        except (ReachError, OSError) as e:  # its Redis is down or refuses: this tenant only
            log.warning("tenant %s cannot be served: %s", tenant, e)
            await _refuse(send, 503, f"Tenant {tenant!r} is unavailable; try again later.")
            return
        await app(scope, receive, send)

    async def _app(self, t: Tenant) -> Starlette:
        got = self._open.get(t)
        if got is not None:
            return got[1]
        async with self._locks.setdefault(t, anyio.Lock()):
            got = self._open.get(t)
            if got is None:
                if self._tg is None:
                    raise RuntimeError("TenantApps serves inside its ASGI lifespan only")
                await self._tg.start(self._keep, t)
                got = self._open[t]
        return got[1]

    async def _keep(self, t: Tenant, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """One tenant's face, its lifespan entered and left in this task."""
        face = self._make(t)
        app = self._app_of(face)
        async with app.router.lifespan_context(app):
            self._open[t] = (face, app)
            try:
                task_status.started()
                await self._stop.wait()
            finally:
                self._open.pop(t, None)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        msg = await receive()
        if msg["type"] != "lifespan.startup":
            return
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await send({"type": "lifespan.startup.complete"})
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            self._stop.set()  # each face leaves its lifespan in its own task
        self._tg = None
        await send({"type": "lifespan.shutdown.complete"})


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

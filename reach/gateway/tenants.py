"""One gateway process for every tenant of the tenant map (docs/operations.md, *Tenants on
their own Redis*): each request names its tenant in the ``X-Reach-Tenant`` header and goes
to a :class:`~reach.gateway.Gateway` of that tenant's Redis and namespace (its own reach
client, task store and limits), made at the tenant's first request.

A request without the header is the tenant ``default``'s (the map's default entry, or a
tenant named ``default``); a tenant the map does not give is refused with 404 before
anything reaches a Redis, and the refusal names no other tenant (a caller may not learn
who else is served here). Tasks live in their tenant's Redis: a task id asked for under
another tenant is not found.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
from starlette.types import Receive, Scope, Send

from ..errors import ConfigError, ReachError, UnknownTenant
from ..tenants import DEFAULT_TENANT, TENANT_HEADER, Tenant, Tenants
from .server import Gateway

log = logging.getLogger("reach.gateway")

_HEADER = TENANT_HEADER.lower().encode("latin-1")


class TenantGateways:
    """The ASGI application (:attr:`app`, this object) of a gateway serving every tenant of
    ``tenants``. ``make(tenant)`` builds the (not started) :class:`Gateway` of one
    tenant's Redis and namespace; this application starts it at its first request (its
    reach client, in a task of the server's lifespan) and closes it at shutdown. Tenants
    that share a Redis and namespace share one gateway."""

    def __init__(self, tenants: Tenants, make: Callable[[Tenant], Gateway]) -> None:
        self.tenants = tenants
        self._make = make
        self._open: dict[Tenant, Gateway] = {}
        self._locks: dict[Tenant, anyio.Lock] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._stop = anyio.Event()

    @property
    def app(self) -> TenantGateways:
        return self

    @property
    def opened(self) -> dict[Tenant, Gateway]:
        """The tenants' gateways started so far."""
        return dict(self._open)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] not in ("http", "websocket"):
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
            gw = await self._gateway(target)
        except (ReachError, OSError) as e:  # its Redis is down or refuses: this tenant only
            log.warning("tenant %s: its gateway cannot start: %s", tenant, e)
            await _refuse(send, 503, f"Tenant {tenant!r} is unavailable; try again later.")
            return
        await gw.app(scope, receive, send)

    async def _gateway(self, t: Tenant) -> Gateway:
        gw = self._open.get(t)
        if gw is not None:
            return gw
        async with self._locks.setdefault(t, anyio.Lock()):
            gw = self._open.get(t)
            if gw is None:
                if self._tg is None:
                    raise RuntimeError("TenantGateways serves inside its ASGI lifespan only")
                gw = await self._tg.start(self._keep, t)
        return gw

    async def _keep(self, t: Tenant, *, task_status: anyio.abc.TaskStatus[Gateway]) -> None:
        """One tenant's gateway, entered and left in this task (as its own lifespan would)."""
        gw = self._make(t)
        async with gw.client:
            try:
                self._open[t] = gw
                task_status.started(gw)
                await self._stop.wait()
            finally:
                self._open.pop(t, None)
                with anyio.CancelScope(shield=True):
                    await gw.handler.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        msg = await receive()
        if msg["type"] != "lifespan.startup":
            return
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await send({"type": "lifespan.startup.complete"})
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            self._stop.set()  # each gateway closes its client in its own task
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


def gateway_maker(
    client_options: dict[str, Any], gateway_options: dict[str, Any]
) -> Callable[[Tenant], Gateway]:
    """``make`` for :class:`TenantGateways`: a :class:`Gateway` with ``gateway_options`` over
    a client with ``client_options`` on the tenant's Redis and namespace."""
    from ..client import Client

    def make(t: Tenant) -> Gateway:
        client = Client(**client_options, redis_url=t.redis_url, namespace=t.namespace)
        return Gateway(client, **gateway_options)

    return make

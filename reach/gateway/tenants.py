"""``reach gateway --all-tenants``: one gateway process for every tenant of the tenant map,
a :class:`~reach.gateway.Gateway` per tenant picked by the ``X-Reach-Tenant`` header
(:mod:`reach._tenant_apps`). Tasks live in their tenant's Redis: a task id asked for under
another tenant is not found."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._tenant_apps import TenantApps
from ..client import Client
from ..tenants import Tenant, Tenants
from .server import Gateway


class TenantGateways(TenantApps[Gateway]):
    """The ASGI application of a gateway serving every tenant of ``tenants``;
    ``make(tenant)`` builds the (not started) :class:`Gateway` of one tenant's Redis and
    namespace (:func:`gateway_maker`)."""

    def __init__(self, tenants: Tenants, make: Callable[[Tenant], Gateway]) -> None:
        super().__init__(tenants, make, lambda gw: gw.app)


def gateway_maker(
    client_options: dict[str, Any], gateway_options: dict[str, Any]
) -> Callable[[Tenant], Gateway]:
    """``make`` for :class:`TenantGateways`: a :class:`Gateway` with ``gateway_options`` over
    a client with ``client_options`` on the tenant's Redis and namespace."""

    def make(t: Tenant) -> Gateway:
        client = Client(**client_options, redis_url=t.redis_url, namespace=t.namespace)
        return Gateway(client, **gateway_options)

    return make

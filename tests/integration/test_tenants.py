"""Tenants on their own Redis (issue 32 item 1): one Client sends each tenant's messages
to that tenant's Redis server and namespace, and neither server holds the other's keys."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

import reach
from reach.client import Client
from reach.embedded import RedisServer
from tests.support.tenants import agents_on, keys_of, where_am_i

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def two_servers(server_binary) -> Iterator[tuple[RedisServer, RedisServer]]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary) as a, RedisServer(binary=server_binary) as b:
        yield a, b


async def test_one_client_two_tenants_two_servers(
    two_servers: tuple[RedisServer, RedisServer], ns: str
) -> None:
    a, b = two_servers
    ns_a, ns_b = f"{ns}-acme", f"{ns}-beta"
    tenants = reach.Tenants({"acme": (a.url, ns_a), "beta": (b.url, ns_b)})
    async with (
        agents_on((where_am_i("A"), a.url, ns_a), (where_am_i("B"), b.url, ns_b)),
        Client(redis_url=a.url, namespace=f"{ns}-own", tenants=tenants) as client,
    ):
        got_a = await client.request("where", {"tenant": "acme"}, tenant="acme", timeout_s=20)
        got_b = await client.request("where", {"tenant": "beta"}, tenant="beta", timeout_s=20)
        assert got_a == {"served_by": "A", "tenant": "acme"}
        assert got_b == {"served_by": "B", "tenant": "beta"}
        sent = await client.send("where", {"tenant": "beta"}, tenant="beta")
        assert (await client.result(sent, tenant="beta", timeout_s=20))["served_by"] == "B"
        assert (await client.task(sent, tenant="beta")).status == reach.Status.SUCCEEDED
        # beta's task is not in acme's namespace, nor in the client's own
        assert (await client.task(sent, tenant="acme")).status == reach.Status.UNKNOWN
        assert (await client.task(sent)).status == reach.Status.UNKNOWN
        stream = client.stream("where.chunks", {"tenant": "beta"}, tenant="beta")
        assert [c async for c in stream] == ["B0", "B1", "B2"]
        assert stream.seq == 3 and stream.msg_id  # the inner stream's, once it ran
        many = await client.request_many("where", [{"tenant": "beta"}] * 3, tenant="beta")
        assert [m["served_by"] for m in many] == ["B", "B", "B"]
        with pytest.raises(reach.UnknownTenant) as e:
            await client.request("where", {}, tenant="gamma")
        assert e.value.known == ("acme", "beta")
        assert len(client.tenants.opened) == 2  # one inner client per tenant, reused
    # each tenant's keys are on its own server only
    assert keys_of(a.url, ns_a) and keys_of(b.url, ns_b)
    assert keys_of(b.url, ns_a) == [] and keys_of(a.url, ns_b) == []


async def test_default_puts_each_other_tenant_in_its_own_namespace(
    two_servers: tuple[RedisServer, RedisServer], ns: str
) -> None:
    a, b = two_servers
    tenants = {"big": (a.url, f"{ns}-big"), "default": (b.url, f"{ns}-{{tenant}}")}
    small = f"{ns}-small"
    async with (
        agents_on((where_am_i("shared"), b.url, small)),
        Client(redis_url=a.url, namespace=f"{ns}-own", tenants=tenants) as client,
    ):
        got: list[dict[str, str]] = []

        async def ask() -> None:
            got.append(await client.request("where", {"tenant": "small"}, tenant="small"))

        async with anyio.create_task_group() as tg:  # first calls from tasks that then end
            for _ in range(3):
                tg.start_soon(ask)
        assert [g["served_by"] for g in got] == ["shared"] * 3
        assert len(client.tenants.opened) == 1
    assert keys_of(b.url, small) and keys_of(a.url, small) == []

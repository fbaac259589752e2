"""One ``reach gateway --all-tenants`` process, callers with the official ``a2a-sdk``
client: each request's X-Reach-Tenant picks the tenant's own Redis and namespace, its tasks
are there only, and a tenant the map does not give is refused (issue 32 item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from a2a.helpers.proto_helpers import get_data_parts, new_data_part
from a2a.types.a2a_pb2 import GetTaskRequest, Message, Role, SendMessageRequest, TaskState
from a2a.utils.errors import TaskNotFoundError

import reach
from reach.embedded import RedisServer, free_port
from reach.envelope import new_id
from tests.support.gateway import a2a_client, stop_process, wait_card
from tests.support.tenants import agents_on, keys_of, where_am_i, write_map

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_servers(server_binary) -> Iterator[tuple[RedisServer, RedisServer]]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary) as a, RedisServer(binary=server_binary) as b:
        yield a, b


@pytest.fixture
def tenant_gateway(
    two_servers: tuple[RedisServer, RedisServer], ns: str, tmp_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    a, b = two_servers
    write_map(tmp_path, {"acme": (a.url, f"{ns}-acme"), "beta": (b.url, f"{ns}-beta")})
    port = free_port()
    log = tmp_path / "gateway.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    cmd = [sys.executable, "-m", "reach_cli.app", "gateway", "--port", str(port)]
    cmd += ["--all-tenants", "--log-level", "info"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stderr=err,
            env={**env, "PYTHONPATH": str(ROOT)},
        )
    try:
        yield f"http://127.0.0.1:{port}", proc, log
    finally:
        assert stop_process(proc) == 0, log.read_text()


def message(payload: object) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=new_id(), parts=[new_data_part(payload)])
    )


async def test_one_gateway_two_tenants_two_servers(
    two_servers: tuple[RedisServer, RedisServer],
    ns: str,
    tenant_gateway: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    a, b = two_servers
    ns_a, ns_b = f"{ns}-acme", f"{ns}-beta"
    url, proc, log = tenant_gateway
    async with (
        agents_on((where_am_i("A"), a.url, ns_a), (where_am_i("B"), b.url, ns_b)),
        httpx.AsyncClient(headers={"X-Reach-Tenant": "acme"}, timeout=30) as ha,
        httpx.AsyncClient(headers={"X-Reach-Tenant": "beta"}, timeout=30) as hb,
    ):
        await wait_card(ha, url, proc, log)
        task_ids = {}
        for tenant, h, label in (("acme", ha, "A"), ("beta", hb, "B")):
            a2a, card = await a2a_client(h, f"{url}/caps/where", streaming=False)
            assert [s.id for s in card.skills] == ["where"]
            [resp] = [e async for e in a2a.send_message(message({"tenant": tenant}))]
            assert resp.task.status.state == TaskState.TASK_STATE_COMPLETED
            [art] = [x for x in resp.task.artifacts if x.name == "result"]
            assert get_data_parts(art.parts)[0] == {"served_by": label, "tenant": tenant}
            task_ids[tenant] = resp.task.id
        # a task is its tenant's: asked for under the other tenant, it is not there
        a2a_b, _ = await a2a_client(hb, f"{url}/caps/where", streaming=False)
        assert (await a2a_b.get_task(GetTaskRequest(id=task_ids["beta"]))).id == task_ids["beta"]
        with pytest.raises(TaskNotFoundError):
            await a2a_b.get_task(GetTaskRequest(id=task_ids["acme"]))
        # an unknown tenant, and a request naming none (the map has no default): refused
        async with httpx.AsyncClient(timeout=30) as h:
            r = await h.get(
                f"{url}/.well-known/agent-card.json", headers={"X-Reach-Tenant": "gamma"}
            )
            assert r.status_code == 404 and "gamma" in r.text and "acme" not in r.text
            r = await h.get(f"{url}/.well-known/agent-card.json")
            assert r.status_code == 404
            r = await h.get(f"{url}/.well-known/agent-card.json", headers={"X-Reach-Tenant": "a b"})
            assert r.status_code == 400
        # each tenant's messages, tasks and gateway store are on its own server only
        async with reach.Client(redis_url=a.url, namespace=ns_a) as ca:
            assert (await ca.task(task_ids["acme"])).status == reach.Status.SUCCEEDED
            assert (await ca.task(task_ids["beta"])).status == reach.Status.UNKNOWN
    assert any(":gw:" in k for k in keys_of(a.url, ns_a))  # the gateway task store too
    assert keys_of(a.url, ns_b) == [] and keys_of(b.url, ns_a) == []

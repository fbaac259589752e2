"""The load check of the gateway: 1,000 concurrent A2A requests (the official ``a2a-sdk``
client, one HTTP connection each) through one ``reach gateway`` process to a ``reach
worker`` process, every one answered with its own result (bench/gateway_bench.py measures
the same with latencies; docs/a2a.md has its figures)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from a2a.helpers.proto_helpers import get_data_parts, new_data_part
from a2a.types.a2a_pb2 import Message, Role, SendMessageRequest, TaskState

from reach.embedded import free_port
from reach.envelope import new_id
from tests.support.gateway import a2a_client, start_gateway_process, stop_process, wait_card
from tests.support.workers import Workers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
TOKEN = "load-test-token-0123456789abcdef"
N = 1000


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_gateway")
    try:
        yield w
    finally:
        w.stop_all()


@pytest.mark.timeout(600)
async def test_a_thousand_concurrent_a2a_requests_are_all_answered(
    redis_url: str, ns: str, workers: Workers, tmp_path: Path
) -> None:
    workers.start("echo_agent", "--concurrency", "64")
    port = free_port()
    log = tmp_path / "gateway.log"
    # --max-connections: N at once (503 past the bound); the gateway lowers it to its
    # open-files limit less 100, so this needs an open-files limit above N + 100
    gw = start_gateway_process(
        redis_url, ns, port, "--timeout-s", "300", "--max-connections", str(N + 100), log=log,
        env={"REACH_GATEWAY_TOKENS": f"load:{TOKEN}"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/caps/gw.echo"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    # One connection per request, over 20 HTTP clients of 50 (one pool of 1,000 connections
    # costs this process more CPU than the gateway spends, on the same cores).
    pools = [httpx.AsyncClient(headers=headers, timeout=300, limits=limits) for _ in range(20)]
    try:
        await wait_card(pools[0], url, gw, log)
        clients = [(await a2a_client(h, url, streaming=False))[0] for h in pools]
        answers: dict[int, object] = {}

        async def one(i: int) -> None:
            req = SendMessageRequest(
                message=Message(
                    role=Role.ROLE_USER, message_id=new_id(), parts=[new_data_part({"i": i})]
                )
            )
            async for resp in clients[i % len(clients)].send_message(req):
                task = resp.task
                assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
                answers[i] = get_data_parts(task.artifacts[0].parts)[0]["echo"]

        try:
            async with anyio.create_task_group() as tg:
                for i in range(N):
                    tg.start_soon(one, i)
        except BaseException:
            print("gateway log:", log.read_text())
            raise
        assert len(answers) == N
        assert all(answers[i] == {"i": i} for i in range(N))  # each its own answer
    finally:
        for h in pools:
            await h.aclose()
        code = stop_process(gw)
    assert code == 0, log.read_text()

"""The gateway's log, from a ``reach gateway`` process: one line per client error (its
JSON-RPC code, the caller, the method), no traceback for what a caller got wrong
(docs/a2a.md, *Logs*)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from reach.embedded import free_port
from tests.support.gateway import start_gateway_process, stop_process, wait_card

pytestmark = pytest.mark.anyio
TOKEN = "logs-token-0123456789abcdef"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}


def send(capability_part: object = 1) -> dict[str, object]:
    return {
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER",
                               "parts": [{"data": capability_part}]}},
    }  # fmt: skip


@pytest.mark.timeout(300)
async def test_one_line_per_client_error_and_no_traceback(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "gateway.log"
    proc = start_gateway_process(
        redis_url, ns, port, log=log, env={"REACH_GATEWAY_TOKENS": f"ops:{TOKEN}"}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(headers=HEADERS, timeout=60) as h:
            await wait_card(h, url, proc, log)
            r = await h.post(f"{url}/caps/gw.nobody", json=send())  # no agent
            assert r.json()["error"]["code"] == -32603
            r = await h.post(f"{url}/caps/Not%20A%20Cap", json=send())  # a bad name
            assert r.json()["error"]["code"] == -32602
            get = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "nope"}}
            r = await h.post(f"{url}/caps/gw.nobody", json=get)  # no such task
            assert r.json()["error"]["code"] == -32001
        lines = log.read_text().splitlines()
        served = [i for i, line in enumerate(lines) if "serving http://" in line]
        assert served == [0], lines
        errors = lines[1:]
        assert "Traceback" not in log.read_text(), log.read_text()
        assert len(errors) == 3, errors
        for line, code, method in zip(
            errors,
            ("-32603", "-32602", "-32001"),
            ("SendMessage", "SendMessage", "GetTask"),
            strict=True,
        ):
            assert f"code {code}" in line and "caller ops" in line and f"method {method}" in line
    finally:
        assert stop_process(proc) == 0, log.read_text()[-3000:]


async def test_serving_is_printed_only_once_the_port_is_bound(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = int(taken.getsockname()[1])
    log = tmp_path / "gateway.log"
    try:
        proc = start_gateway_process(redis_url, ns, port, log=log)
        assert proc.wait(timeout=60) == 2
    finally:
        taken.close()
    text = log.read_text()
    assert "serving" not in text, text

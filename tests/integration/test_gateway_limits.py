"""The HTTP faces' limits, against ``reach gateway`` and ``reach web`` processes: request
bodies past the limit (413, not read), idle sockets past the open-files limit (closed after
the header timeout, service goes on, one log line), a stream its caller never reads (cut;
the process does not grow) (docs/a2a.md and docs/web.md, *Limits*)."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from reach.client import Client
from reach.embedded import free_port
from tests.support.gateway import (
    start_gateway_process,
    start_web_process,
    stop_process,
    wait_card,
)
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio
TOKEN = "limits-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def open_files(limit: int) -> object:
    """A preexec_fn: the child's open-files limit, soft and hard (it cannot raise it)."""

    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return set_limit


def send_body(size: int) -> dict[str, object]:
    return {
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER",
                               "parts": [{"data": {"pad": "x" * size}}]}},
    }  # fmt: skip


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_gateway")
    try:
        yield w
    finally:
        w.stop_all()


@pytest.fixture
async def gateway(
    redis_url: str, ns: str, tmp_path: Path, workers: Workers
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes], Path]]:
    workers.start("echo_agent")
    port = free_port()
    log = tmp_path / "gateway.log"
    proc = start_gateway_process(
        redis_url, ns, port, "--header-timeout-s", "2", log=log,
        env={"REACH_GATEWAY_TOKENS": f"limits:{TOKEN}"}, preexec_fn=open_files(256),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=30) as h:
            # the capability's card is served once its agent is live: requests routed then
            # find it (the gateway's own card is served before any agent registers)
            await wait_card(h, f"{url}/caps/gw.echo", proc, log)
        yield url, proc, log
    finally:
        assert stop_process(proc) == 0, log.read_text()[-3000:]


async def test_a_body_past_the_limit_is_refused_unread(
    gateway: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, proc, _ = gateway
    before = rss_bytes(proc.pid)
    async with httpx.AsyncClient(headers=AUTH, timeout=120) as h:
        ok = await h.post(f"{url}/caps/gw.echo", json=send_body(500_000))
        assert ok.status_code == 200 and "result" in ok.json(), ok.text[:300]
        # declared too large: answered at once, the body never read
        r = await h.post(f"{url}/caps/gw.echo", json=send_body(100 * 1024 * 1024))
        assert r.status_code == 413, r.text[:300]
        err = r.json()["error"]
        assert err["code"] == -32600 and "limit" in err["message"]

        # not declared (chunked): read up to the limit, then refused
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(100):
                yield b"x" * (1024 * 1024)

        r = await h.post(
            f"{url}/caps/gw.echo",
            content=chunks(),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 413, r.text[:300]
    grown = rss_bytes(proc.pid) - before
    assert grown < 40 * 1024 * 1024, f"the gateway grew {grown} bytes"
    assert proc.poll() is None


@pytest.mark.timeout(300)
async def test_idle_sockets_past_the_open_files_limit_do_not_stop_the_gateway(
    gateway: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    """300 idle connections to a gateway limited to 256 open files: they are closed after
    the header timeout, a request made meanwhile is answered, and the log stays small."""
    url, proc, log = gateway
    port = int(url.rsplit(":", 1)[1])
    idle: list[socket.socket] = []
    try:
        for _ in range(300):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            idle.append(s)
        async with httpx.AsyncClient(headers=AUTH, timeout=120) as h:
            t0 = time.monotonic()
            answered = None
            while time.monotonic() - t0 < 90:
                try:
                    r = await h.post(f"{url}/caps/gw.echo", json=send_body(10))
                except httpx.TransportError:
                    await anyio.sleep(0.5)
                    continue
                if r.status_code == 503:  # past the connection bound: told to come back
                    await anyio.sleep(float(r.headers.get("retry-after", "0.5") or 0.5))
                    continue
                answered = r
                break
            assert answered is not None and answered.status_code == 200, log.read_text()[-3000:]
            assert "result" in answered.json()
    finally:
        for s in idle:
            s.close()
    assert proc.poll() is None
    size = log.stat().st_size
    assert size < 20_000, f"the log grew to {size} bytes: {log.read_text()[-2000:]}"


@pytest.mark.timeout(300)
async def test_the_console_refuses_a_large_form_and_outlives_idle_sockets(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "web.log"
    proc = start_web_process(
        redis_url, ns, port, "--header-timeout-s", "2", log=log, preexec_fn=open_files(256)
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=60) as h:

            async def up() -> bool:
                assert proc.poll() is None, log.read_text()
                try:
                    return (await h.get(url + "/")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(up, timeout_s=60, what="the console to serve")
            r = await h.post(
                url + "/login",
                content=b"token=" + b"x" * (20 * 1024 * 1024),
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            assert r.status_code == 413, r.text[:300]
            idle = []
            try:
                for _ in range(300):
                    s = socket.socket()
                    s.setblocking(False)
                    try:
                        s.connect(("127.0.0.1", port))
                    except BlockingIOError:
                        pass
                    idle.append(s)
                t0 = time.monotonic()
                served = False
                while time.monotonic() - t0 < 90 and not served:
                    try:
                        r = await h.get(url + "/")
                        served = r.status_code == 200
                    except httpx.TransportError:
                        pass
                    if not served:
                        await anyio.sleep(0.5)
                assert served, log.read_text()[-3000:]
            finally:
                for s in idle:
                    s.close()
        assert proc.poll() is None
        assert log.stat().st_size < 20_000, log.read_text()[-2000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def stream_request(port: int, payload: object) -> bytes:
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendStreamingMessage",
            "params": {
                "message": {
                    "messageId": "m-flood",
                    "role": "ROLE_USER",
                    "parts": [{"data": payload}],
                }
            },
        }
    ).encode()
    head = (
        f"POST /caps/gw.flood HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nA2A-Version: 1.0\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@pytest.mark.timeout(300)
async def test_a_stream_never_read_does_not_grow_the_gateway(
    redis_url: str, ns: str, tmp_path: Path, workers: Workers
) -> None:
    """A caller opens a stream of 200 MiB (3,200 chunks of 64 KiB) and never reads it: the
    gateway ends the task past its bytes bound (8 MiB here), cuts the response its caller
    does not read, and grows by less than 150 MB meanwhile; others are still answered."""
    workers.start("flood_agent")
    workers.start("echo_agent")
    port = free_port()
    log = tmp_path / "gateway.log"
    proc = start_gateway_process(
        redis_url, ns, port, "--max-task-bytes", str(8 * 1024 * 1024),
        "--send-timeout-s", "3", log=log, env={"REACH_GATEWAY_TOKENS": f"limits:{TOKEN}"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(headers=AUTH, timeout=60) as h:
            await wait_card(h, url, proc, log)
            await wait_card(h, f"{url}/caps/gw.flood", proc, log)
            base = rss_bytes(proc.pid)
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            peak = 0
            try:
                s.sendall(stream_request(port, {"n": 3200, "size": 65536}))
                async with Client(redis_url=redis_url, namespace=ns) as c:
                    t0 = time.monotonic()
                    ended = False
                    while time.monotonic() - t0 < 60:
                        peak = max(peak, rss_bytes(proc.pid) - base)
                        tasks = await c.commands.keys(f"reach:{{{ns}}}:gw:task:*")
                        states = [await c.commands.hget(k, "state") for k in tasks]
                        if states and all(
                            st is not None and int(st) in (4, 5, 6, 7) for st in states
                        ):
                            ended = True
                            break
                        await anyio.sleep(0.2)
                    assert ended, "the flooded task did not end"
                for _ in range(20):  # the cut comes send-timeout after the buffers filled
                    peak = max(peak, rss_bytes(proc.pid) - base)
                    if "cut a response" in log.read_text():
                        break
                    await anyio.sleep(0.5)
            finally:
                s.close()
            assert peak < 150 * 1024 * 1024, f"the gateway grew {peak} bytes"
            r = await h.post(f"{url}/caps/gw.echo", json=send_body(10))
            assert r.status_code == 200 and "result" in r.json()
        text = log.read_text()
        assert "cut a response its caller did not read" in text, text[-2000:]
    finally:
        assert stop_process(proc) == 0, log.read_text()[-3000:]

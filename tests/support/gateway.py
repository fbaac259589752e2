"""Serve a :class:`reach.gateway.Gateway` with uvicorn on a free port of this event loop, and
talk to it with the official ``a2a-sdk`` client."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.client import Client as A2AClient
from a2a.types.a2a_pb2 import AgentCard

from reach.gateway import Gateway
from tests.support.waiting import wait_until
from tests.support.workers import ROOT


@asynccontextmanager
async def gateway_served(gateway: Gateway, *, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``gateway`` (its lifespan starts its reach Client); yields its base URL."""
    async with gateway_served_app(lambda base: gateway.app, host=host) as url:
        yield url


@asynccontextmanager
async def gateway_served_app(
    make: Callable[[str], Any], *, host: str = "127.0.0.1"
) -> AsyncIterator[str]:
    """Serve the ASGI app ``make(base_url)`` with uvicorn on a free port of this event loop;
    yields its base URL."""
    # Bound here and handed to uvicorn: no other process (a parallel test worker) can take
    # the port between its choice and the server's start.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = int(sock.getsockname()[1])
    url = f"http://{host}:{port}"
    # proxy_headers off, as reach gateway serves: the client's address is the peer's
    # (tests/integration/test_gateway_identity.py sends X-Forwarded-For from loopback)
    config = uvicorn.Config(
        make(url),
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        backlog=4096,
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:

        async def up() -> bool:
            return server.started or task.done()

        await wait_until(up, timeout_s=30, what="the server serving")
        if task.done():
            task.result()  # raises what stopped it
        yield url
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def http(
    token: str | None = None,
    *,
    timeout_s: float = 30.0,
    headers: dict[str, str] | None = None,
    **kw: Any,
) -> httpx.AsyncClient:
    headers = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    return httpx.AsyncClient(headers=headers, timeout=timeout_s, limits=limits, **kw)


async def resolve(client: httpx.AsyncClient, url: str) -> AgentCard:
    return await A2ACardResolver(client, url).get_agent_card()


async def a2a_client(
    client: httpx.AsyncClient, url: str, *, streaming: bool = True
) -> tuple[A2AClient, AgentCard]:
    """An SDK client for the A2A server at ``url``, from the card it resolves there."""
    card = await resolve(client, url)
    factory = ClientFactory(ClientConfig(httpx_client=client, streaming=streaming))
    return factory.create(card), card


def start_gateway_process(
    redis_url: str,
    ns: str,
    port: int,
    *extra: str,
    log: Path,
    env: dict[str, str] | None = None,
    preexec_fn: Any = None,
) -> subprocess.Popen[bytes]:
    """A ``reach gateway`` process (stderr to ``log``); the caller stops it. ``preexec_fn``
    runs in the child before it starts (e.g. to lower its open-files limit)."""
    cmd = [sys.executable, "-m", "reach_cli.app", "gateway", "--port", str(port)]
    cmd += ["--redis-url", redis_url, "--namespace", ns, *extra]
    with open(log, "wb") as err:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec_fn,  # noqa: PLW1509 - only sets limits, before exec
        )


async def wait_card(
    h: httpx.AsyncClient, url: str, proc: subprocess.Popen[bytes], log: Path
) -> None:
    """Wait until ``url``'s card is served (failing at once if the gateway process died)."""

    async def served() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            r = await h.get(f"{url}/.well-known/agent-card.json")
        except httpx.TransportError:
            return False
        return r.status_code == 200

    await wait_until(served, timeout_s=60, what=f"the card of {url}")


def start_web_process(
    redis_url: str, ns: str, port: int, *extra: str, log: Path, preexec_fn: Any = None
) -> subprocess.Popen[bytes]:
    """A ``reach web`` process (its output to ``log``); the caller stops it."""
    cmd = [sys.executable, "-m", "reach_cli.app", "web", "--port", str(port)]
    cmd += ["--redis-url", redis_url, "--namespace", ns, *extra]
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            preexec_fn=preexec_fn,  # noqa: PLW1509 - only sets limits, before exec
        )


def stop_process(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then its exit code (SIGKILL after 30 s)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

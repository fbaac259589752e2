"""Serving the console: one uvicorn server on a socket bound here (so port 0 works and
the address is known before the first request)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn

from ..connection import connect, redact
from .app import create_app
from .security import Guard, is_loopback, loopback_hosts

GRACE_S = 1  # open live streams never end by themselves: shutdown waits this long


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: any free one)."""
    h = host.strip("[]")
    family = socket.AF_INET6 if ":" in h else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((h, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    h = host.strip("[]")
    shown = f"[{h}]" if ":" in h else h
    if h in ("0.0.0.0", "::"):
        shown = "127.0.0.1" if h == "0.0.0.0" else "[::1]"
    return f"http://{shown}:{port}/"


async def serve(
    redis_url: str,
    namespace: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8090,
    token: str | None = None,
    read_only: bool = False,
    interval_s: float = 1.0,
    history_s: float = 600.0,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run the console until cancelled (or SIGINT/SIGTERM). ``on_ready`` gets its URL once
    it answers. A non-loopback ``host`` needs a ``token`` (the caller checks)."""
    guard = Guard(
        token=token,
        read_only=read_only,
        allowed_hosts=loopback_hosts(host.strip("[]")) if is_loopback(host) else None,
    )
    sock = bind(host, port)
    url = url_of(sock, host)
    redis = await connect(redis_url, client_name=f"reach-web:{namespace}")
    try:

        async def ready() -> None:
            if on_ready is not None:
                on_ready(url)

        app = create_app(
            redis,
            namespace,
            guard,
            interval_s=interval_s,
            history_s=history_s,
            redis_label=redact(redis_url),
            on_ready=ready,
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=GRACE_S,
            lifespan="on",
        )
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
        await redis.aclose()

"""Serving the console: one uvicorn server on a socket bound here (so port 0 works and
the address is known before the first request)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import uvicorn

from .._http import (
    BodyLimit,
    Limits,
    quiet_accept_errors,
    raise_open_files_limit,
    uvicorn_options,
)
from ..connection import connect, redact
from .app import create_app
from .security import Guard, is_loopback, loopback_hosts

GRACE_S = 1  # open live streams never end by themselves: shutdown waits this long
DEFAULT_MAX_BODY_BYTES = 65_536  # the console's forms are a few fields
BACKLOG = 511
log = logging.getLogger("reach.web")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: any free one)."""
    h = host.strip("[]")
    family = socket.AF_INET6 if ":" in h else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((h, port))
    sock.listen(BACKLOG)
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
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_connections: int = Limits.max_connections,
    header_timeout_s: float = Limits.header_timeout_s,
    registry_url: str | None = None,
) -> None:
    """Run the console until cancelled (or SIGINT/SIGTERM). ``on_ready`` gets its URL once
    it answers. A non-loopback ``host`` needs a ``token`` (the caller checks).

    Bounded against its clients (docs/web.md, *Limits*): the open-files limit is raised to
    its hard limit, ``max_connections`` (fitted to it) are served at once, a connection
    without a request head for ``header_timeout_s`` is closed, a body past
    ``max_body_bytes`` is answered 413 unread. ``registry_url``: the control plane's Redis
    when the namespace keeps it apart (reach.planes)."""
    limits = Limits(max_connections=max_connections, header_timeout_s=header_timeout_s)
    limits = limits.fitted(raise_open_files_limit())
    quiet_accept_errors(asyncio.get_running_loop(), log)
    guard = Guard(
        token=token,
        read_only=read_only,
        allowed_hosts=loopback_hosts(host.strip("[]")) if is_loopback(host) else None,
    )
    sock = bind(host, port)
    url = url_of(sock, host)
    redis = await connect(redis_url, client_name=f"reach-web:{namespace}")
    control = None
    try:
        if registry_url:
            control = await connect(registry_url, client_name=f"reach-web:{namespace}")

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
            control=control,
        )
        config = uvicorn.Config(
            BodyLimit(app, max_bytes=max_body_bytes),
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=GRACE_S,
            lifespan="on",
            **uvicorn_options(limits),
        )
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
        await redis.aclose()
        if control is not None:
            await control.aclose()

"""What bounds reach's HTTP faces (the A2A gateway, the console) against their clients:
open files, connections, idle sockets, request bodies, readers that never read
(docs/a2a.md and docs/web.md, *Limits*).

Pure ASGI and uvicorn's own knobs, no framework: both faces use them the same way.

* :func:`raise_open_files_limit`: the soft ``RLIMIT_NOFILE`` up to the hard one, at start.
* :func:`uvicorn_options`: a bound on connections (past it a connection is answered 503
  and closed as it is accepted; ``limit_concurrency`` too), the keep-alive timeout, a smaller listen backlog, and the protocol
  :func:`protocol_class`, which closes a connection that has not sent a whole request head
  within ``header_timeout_s`` of opening (or of its last response): an idle or trickling
  socket does not hold a file descriptor for ever.
* :func:`quiet_accept_errors`: the event loop's "socket.accept() out of system resource"
  errors (file descriptors exhausted) as one warning line per ``every_s``, counted.
* :class:`BodyLimit`: a request body past ``max_bytes`` is answered 413 (the gateway adds
  the JSON-RPC error), read no further than the limit.
* :class:`SendTimeout`: a response its client does not read for ``timeout_s`` (a stream
  never read, its socket buffers full) is cut, so what it holds is freed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import anyio

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_KEEP_ALIVE_S = 5
DEFAULT_BACKLOG = 511
# A body past the limit is read on (and dropped) up to this much before the 413, so the
# client, still sending, reads the answer instead of a reset connection.
DRAIN_MAX_BYTES = 128 * 1024 * 1024
DRAIN_MAX_S = 10.0
FD_RESERVE = 100  # descriptors kept for Redis connections, logs, the listening socket
ACCEPT_ERROR = "socket.accept() out of system resource"


def raise_open_files_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


@dataclass(frozen=True)
class Limits:
    """The bounds of one HTTP face (see the module docstring)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: int = DEFAULT_KEEP_ALIVE_S
    backlog: int = DEFAULT_BACKLOG

    def fitted(self, open_files: int) -> Limits:
        """These limits with ``max_connections`` lowered to leave :data:`FD_RESERVE`
        descriptors of ``open_files`` to everything else."""
        room = max(open_files - FD_RESERVE, 16)
        if self.max_connections <= room:
            return self
        return Limits(room, self.header_timeout_s, self.keep_alive_s, self.backlog)


BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


def protocol_class(header_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request head has not come
    within ``header_timeout_s`` of its opening or of its last response; a connection past
    ``max_connections`` is answered 503 (``Retry-After: 1``) and closed at once, so that
    open connections never take the descriptors Redis and the rest need."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(BUSY)
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(header_timeout_s, self._no_head)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _no_head(self) -> None:
            self._head_timer = None
            if self.conn.their_state == h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state != h11.IDLE:
                self._disarm()  # a request's head came: the request's own pace now

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


def uvicorn_options(limits: Limits) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments of ``limits``."""
    return {
        "http": protocol_class(limits.header_timeout_s, limits.max_connections),
        "limit_concurrency": limits.max_connections,
        "timeout_keep_alive": limits.keep_alive_s,
        "backlog": limits.backlog,
    }


def quiet_accept_errors(
    loop: asyncio.AbstractEventLoop, log: logging.Logger, *, every_s: float = 10.0
) -> None:
    """Log the loop's accept errors (file descriptors exhausted: asyncio retries the accept
    every second) as one warning per ``every_s`` with their count, instead of one
    traceback each; every other error goes where it went."""
    previous = loop.get_exception_handler()
    state = {"last": 0.0, "count": 0}

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith(ACCEPT_ERROR):
            state["count"] += 1
            now = time.monotonic()
            if now - state["last"] >= every_s:
                soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
                log.warning(
                    "cannot accept connections: out of file descriptors (%d accept errors "
                    "in the last %.0f s; open-files limit %d); idle connections are closed "
                    "after the header timeout",
                    state["count"],
                    every_s,
                    soft,
                )
                state["last"], state["count"] = now, 0
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
    quiet_uvicorn(every_s=every_s)


# uvicorn's lines per refused request or cut response: one a request, so a flood under
# attack; kept to one per period, with the count of those left out.
_UVICORN_REPEATS = (
    "Exceeded concurrency limit",
    "ASGI callable returned without completing response",
)


class _Repeats(logging.Filter):
    def __init__(self, every_s: float) -> None:
        super().__init__()
        self.every_s = every_s
        self.last: dict[str, float] = {}
        self.left_out: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        kind = next((k for k in _UVICORN_REPEATS if text.startswith(k)), None)
        if kind is None:
            return True
        now = time.monotonic()
        if now - self.last.get(kind, -self.every_s) < self.every_s:
            self.left_out[kind] = self.left_out.get(kind, 0) + 1
            return False
        self.last[kind] = now
        n = self.left_out.pop(kind, 0)
        if n:
            record.msg = f"{text} ({n} more like it in the last {self.every_s:.0f} s)"
            record.args = ()
        return True


def quiet_uvicorn(*, every_s: float = 10.0) -> None:
    """uvicorn's per-request warnings (a request past the connection bound, a response
    cut) at most once per ``every_s`` each."""
    logging.getLogger("uvicorn.error").addFilter(_Repeats(every_s))


class BodyLimit:
    """ASGI middleware: a request whose body passes ``max_bytes`` (by its Content-Length,
    or as it is read) is answered 413, and no more of it is read. ``json_rpc``: the answer
    is also a JSON-RPC error (-32600, ``id`` null), as a JSON-RPC client expects."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, json_rpc: bool = False) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.json_rpc = json_rpc

    def _why(self, size: int | None) -> str:
        given = f"{size} bytes" if size is not None else "more"
        return (
            f"The request body is {given}, over this server's limit of {self.max_bytes} "
            "bytes: send a smaller one."
        )

    async def _refuse(self, send: Send, size: int | None) -> None:
        why = self._why(size)
        if self.json_rpc:
            body = json.dumps(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": why}}
            ).encode()
            kind = b"application/json"
        else:
            body, kind = why.encode(), b"text/plain; charset=utf-8"
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", kind),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _drain(receive: Receive) -> None:
        """Read the rest of the body and drop it, up to DRAIN_MAX_BYTES / DRAIN_MAX_S."""
        seen = 0
        with anyio.move_on_after(DRAIN_MAX_S):
            while seen < DRAIN_MAX_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return
                seen += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    size = -1
                if size > self.max_bytes:
                    await self._drain(receive)
                    await self._refuse(send, size)
                    return
        # Read here, up to the limit (the application would hold the whole body anyway),
        # so that a body past it is answered 413 before the application sees any of it.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([], message), send)
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await self._drain(receive)
                await self._refuse(send, None)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(chunks, None, receive), send)


def _replay(chunks: list[bytes], last: Message | None, then: Receive | None = None) -> Receive:
    """A ``receive`` that gives the body read already as one message, then ``last`` (or
    whatever ``then`` gives: a disconnect)."""
    pending: list[Message] = [
        {"type": "http.request", "body": b"".join(chunks), "more_body": False}
    ]
    if last is not None:
        pending = [last]

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


class SendTimeout:
    """ASGI middleware: a response message its client does not take within ``timeout_s``
    (the socket's buffers full: a stream nobody reads) ends the response, and with it
    what the response holds; ``on_cut`` is told (to log one line)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        timeout_s: float,
        on_cut: Callable[[Scope], None] | None = None,
    ) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.on_cut = on_cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def timed_send(message: Message) -> None:
            try:
                with anyio.fail_after(self.timeout_s):
                    await send(message)
            except TimeoutError:
                if self.on_cut is not None:
                    self.on_cut(scope)
                raise SlowReader(self.timeout_s) from None

        try:
            await self.app(scope, receive, timed_send)
        except SlowReader:
            pass  # the response is over: the server closes the connection


class SlowReader(Exception):
    """A client did not read its response for ``timeout_s`` seconds."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the client read nothing for {timeout_s:g} s")

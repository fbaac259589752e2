"""The console as a Starlette application: the guard in front of every route, the route
table, and the lifespan that runs the monitor and the client the actions send with.

Pages are rendered on the server (Jinja2, every value escaped: names, ids, errors and
payloads come from Redis, where anyone holding the namespace's keys can write). A page
names its live view in ``data-live``; ``static/console.js`` opens that Server-Sent
Events stream and puts each fragment it brings (HTML rendered here, by element id) in
place. The work itself is :mod:`reach.admin`, :mod:`reach.overview`,
:mod:`reach.registry` and :mod:`reach.tasks`, as for the ``reach`` command.

What the pages share is :mod:`reach.web.console`, how they write values
:mod:`reach.web.formatting`, and the routes are :mod:`reach.web.routes` by group; the
names they held when they were all here are re-exported below.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from redis import exceptions as rexc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..audit import reset_operator
from ..client import Client
from ..connection import AnyRedis
from .console import HERE, Console
from .formatting import _ago, _q, note_text, sent_ms_of
from .routes.audit import acting_for, audit_page
from .routes.dead_letters import (
    dlq_page,
    letter_page,
    purge_confirm,
    purge_do,
    replay_confirm,
    replay_do,
)
from .routes.forms import login_do, login_page, read_form
from .routes.messages import (
    answer_do,
    answer_form,
    cancel_confirm,
    cancel_do,
    message_page,
    messages_page,
)
from .routes.overview import (
    agent_page,
    drain_confirm,
    drain_do,
    events_page,
    frame_json,
    live,
    overview,
)
from .security import Guard

__all__ = [
    "Console",
    "GuardMiddleware",
    "_ago",
    "create_app",
    "note_text",
    "read_form",
    "sent_ms_of",
]


# -- the guard, in front of every route ----------------------------------------------------
OPEN_PATHS = ("/login", "/static/")
# Only the console's own files: no inline script or style, no other site's.
CSP = (
    b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    b"frame-ancestors 'none'; form-action 'self'"
)


class GuardMiddleware:
    """Host check, session cookie, sign-in (see :mod:`reach.web.security`)."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        g = self.guard
        if not g.host_ok(headers.get("host")):
            await PlainTextResponse(
                "Unknown host name: open the console as http://127.0.0.1:PORT/ or "
                "http://localhost:PORT/.",
                status_code=421,
            )(scope, receive, send)
            return
        session = g.read_cookie(headers.get("cookie"))
        fresh = session is None
        if session is None:
            session = g.new_session()
        scope.setdefault("state", {})["session"] = session
        path: str = scope["path"]
        signed_in = (
            g.token is None or session.signed_in or g.bearer_ok(headers.get("authorization"))
        )
        if not signed_in and not path.startswith(OPEN_PATHS):
            if scope["method"] == "GET" and path != "/live":
                resp: Response = RedirectResponse("/login?" + _q(next=path), status_code=303)
            else:
                resp = PlainTextResponse("Sign in first (a token is required).", status_code=401)
            if fresh:
                resp.headers["set-cookie"] = g.set_cookie_header(session)
            await resp(scope, receive, send)
            return

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                hs = list(message.get("headers", []))
                hs.append((b"x-frame-options", b"DENY"))
                hs.append((b"x-content-type-options", b"nosniff"))
                hs.append((b"referrer-policy", b"same-origin"))
                hs.append(
                    (
                        b"content-security-policy",
                        CSP,
                    )
                )
                if fresh and not any(k.lower() == b"set-cookie" for k, _ in hs):
                    hs.append((b"set-cookie", g.set_cookie_header(session).encode()))
                message["headers"] = hs
            await send(message)

        # The request's actions are recorded in the audit trail as this console's, for
        # this request only (reset: a task serving several requests keeps none of it).
        client = scope.get("client")
        token = acting_for(session, str(client[0]) if client else "")
        try:
            await self.app(scope, receive, send_with_cookie)
        finally:
            reset_operator(token)


def create_app(
    redis: AnyRedis,
    namespace: str,
    guard: Guard,
    *,
    interval_s: float = 1.0,
    history_s: float = 600.0,
    redis_label: str = "",
    on_ready: Callable[[], Awaitable[None]] | None = None,
    control: AnyRedis | None = None,
) -> Starlette:
    """The console for ``namespace`` on ``redis`` (the caller closes ``redis``, and
    ``control``, the control plane's Redis when the namespace keeps it apart)."""
    console = Console(
        redis,
        namespace,
        guard,
        interval_s=interval_s,
        history_s=history_s,
        redis_label=redis_label,
        control=control,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            Client(redis=redis, registry_redis=control, namespace=namespace) as client,
            anyio.create_task_group() as tg,
        ):
            console.client = client  # replays are sent by one named, live client
            await console.monitor.prime()
            tg.start_soon(console.monitor.run)
            if on_ready is not None:
                await on_ready()
            yield
            tg.cancel_scope.cancel()

    routes = [
        Route("/", overview),
        Route("/api/frame", frame_json),
        Route("/events", events_page),
        Route("/agent", agent_page),
        Route("/messages", messages_page),
        Route("/message", message_page),
        Route("/message/cancel", cancel_confirm, methods=["GET"]),
        Route("/message/cancel", cancel_do, methods=["POST"]),
        Route("/message/answer", answer_form, methods=["GET"]),
        Route("/message/answer", answer_do, methods=["POST"]),
        Route("/audit", audit_page),
        Route("/dlq", dlq_page),
        Route("/dlq/letter", letter_page),
        Route("/dlq/replay", replay_confirm, methods=["GET"]),
        Route("/dlq/replay", replay_do, methods=["POST"]),
        Route("/dlq/purge", purge_confirm, methods=["GET"]),
        Route("/dlq/purge", purge_do, methods=["POST"]),
        Route("/agents/drain", drain_confirm, methods=["GET"]),
        Route("/agents/drain", drain_do, methods=["POST"]),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login_do, methods=["POST"]),
        Route("/live", live),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]

    async def redis_refused(request: Request, exc: Exception) -> Response:
        return console.page(
            "error.html", request, 503, message=f"Redis refused or did not answer: {exc}"
        )

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={rexc.RedisError: redis_refused, OSError: redis_refused},
    )
    app.state.console = console
    app.add_middleware(GuardMiddleware, guard=guard)
    return app

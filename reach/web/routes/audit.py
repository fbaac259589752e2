"""The audit trail (reach.audit): the newest entries, filtered by action, kind and age,
and who the console's actions are recorded as.
"""

from __future__ import annotations

import contextvars
import hashlib

from starlette.requests import Request
from starlette.responses import Response

from ... import audit
from ...recent import parse_since
from ..console import _view
from ..security import Session

SHOWN = 200
"""The most entries the page lists (``reach audit --limit N`` reads more)."""


def acting_for(session: Session, address: str) -> contextvars.Token[audit.Operator | None]:
    """Name who acts while one request is handled: the console's operator (``reach
    --as``, ``REACH_OPERATOR``, else the OS user at the host of the console's process),
    through ``web``, with a digest of the browser's session (never the cookie itself: it
    tells one browser's actions from another's) and the client's address. Returns the
    token that ends it (:class:`reach.web.app.GuardMiddleware` resets it after the
    request)."""
    digest = hashlib.sha256(b"reach-web-session:" + session.sid.encode()).hexdigest()[:12]
    name = audit.current_operator().name
    return audit.acting_as(name, via="web", session=digest, address=address)


async def audit_page(request: Request) -> Response:
    c = _view(request)
    p = request.query_params
    action, kind, since = p.get("action", "").strip(), p.get("kind", ""), p.get("since", "")
    problem = ""
    try:
        since_ms = parse_since(since)
    except ValueError as e:
        problem, since_ms = str(e), 0
    entries = await audit.read_audit(
        c.control,
        c.keys,
        since_ms=since_ms,
        action=action or None,
        kind=kind if kind in audit.KINDS else None,
        limit=SHOWN,
    )
    return c.page(
        "audit.html",
        request,
        entries=entries[::-1],
        action=action,
        kind=kind,
        since=since,
        kinds=audit.KINDS,
        problem=problem,
        shown=SHOWN,
        retention=audit.retention_text(audit.retention_s()),
        filtered=bool(action or kind or since),
    )

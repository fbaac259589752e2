"""Posted forms: reading one, the checks a change must pass (read-only console, origin,
the session's CSRF token or a bearer token), and sign-in.

Every action's POST goes through :func:`_checked_form`, so the rules that guard a change
are in one place.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ..console import Console, _view
from ..security import Session


def _read_only(c: Console, request: Request) -> Response:
    return c.page("error.html", request, 403, message="This console is read-only (--read-only).")


MAX_FORM_BYTES = 16 * 1024


async def read_form(request: Request) -> dict[str, str]:
    """A small urlencoded form (what the console's own forms send); anything else, or a
    body over :data:`MAX_FORM_BYTES`, reads as empty (and so fails the token check)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != (
        "application/x-www-form-urlencoded"
    ):
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return dict(pairs)


async def _checked_form(c: Console, request: Request) -> dict[str, str] | Response:
    """The form of a POST that may change something, or the refusal."""
    if c.guard.read_only:
        return _read_only(c, request)
    if not c.guard.origin_ok(request.headers.get("origin"), request.headers.get("host")):
        return PlainTextResponse("Cross-site request refused.", status_code=403)
    form = await read_form(request)
    bearer = c.guard.bearer_ok(request.headers.get("authorization"))
    if not bearer and not c.guard.csrf_ok(request.state.session, form.get("csrf", "")):
        return PlainTextResponse(
            "This form's token is not this session's (an old page, or a request made by "
            "another site): reload the page and try again.",
            status_code=403,
        )
    return form


# -- login --------------------------------------------------------------------------------
async def login_page(request: Request) -> Response:
    c = _view(request)
    return c.page("login.html", request, failed=False, next=request.query_params.get("next", "/"))


async def login_do(request: Request) -> Response:
    c = _view(request)
    form = await read_form(request)
    s: Session = request.state.session
    if not c.guard.csrf_ok(s, form.get("csrf", "")) or not c.guard.token_ok(form.get("token", "")):
        return c.page("login.html", request, 401, failed=True, next="/")
    nxt = form.get("next", "/")
    # Only a path of this console: "//host" and "/\\host" would leave it.
    if not nxt.startswith("/") or nxt.startswith("//") or "\\" in nxt or ":" in nxt:
        nxt = "/"
    resp = RedirectResponse(nxt, status_code=303)
    resp.headers["set-cookie"] = c.guard.set_cookie_header(c.guard.new_session(signed_in=True))
    return resp

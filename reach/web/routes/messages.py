"""Messages: the list (by capability, agent, status, age), one message's task record, and
cancelling it.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ...errors import ReachError
from ..console import _view
from ..formatting import _q
from .forms import _checked_form, _read_only


async def messages_page(request: Request) -> Response:
    c = _view(request)
    ctx = await c.messages_ctx(dict(request.query_params))
    return c.page("messages.html", request, **ctx)


async def cancel_confirm(request: Request) -> Response:
    c = _view(request)
    if c.guard.read_only:
        return _read_only(c, request)
    msg_id = request.query_params.get("id", "")
    return c.page(
        "confirm.html",
        request,
        action="/message/cancel",
        verb="Cancel",
        what=f"message {msg_id}",
        detail="A message not started yet never runs; a running one's handler is told "
        "(ctx.cancelled) and stopped after its grace. It ends as cancelled, and its caller "
        "gets reach.Cancelled.",
        hidden={"id": msg_id},
        back="/message?" + _q(id=msg_id),
        letters=[],
    )


async def cancel_do(request: Request) -> Response:
    c = _view(request)
    form = await _checked_form(c, request)
    if isinstance(form, Response):
        return form
    msg_id = form.get("id", "")
    if c.client is None:
        return c.page("error.html", request, 503, message="The console is still starting.")
    try:
        res = await c.client.cancel(msg_id, by="reach web")
    except ReachError as e:
        return c.page("error.html", request, 409, message=str(e))
    note = "cancelled" if res.cancelled else "not-cancelled"
    return RedirectResponse("/message?" + _q(id=msg_id, note=note), status_code=303)


async def answer_form(request: Request) -> Response:
    c = _view(request)
    if c.guard.read_only:
        return _read_only(c, request)
    msg_id = request.query_params.get("id", "").strip()
    if c.client is None:
        return c.page("error.html", request, 503, message="The console is still starting.")
    return c.page("answer.html", request, msg_id=msg_id, st=await c.client.task(msg_id))


def _answer_value(text: str) -> Any:
    """What the form's answer field means: its JSON value, or the text itself when it is
    no JSON (a person types ``yes`` more often than ``"yes"``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


async def answer_do(request: Request) -> Response:
    c = _view(request)
    form = await _checked_form(c, request)
    if isinstance(form, Response):
        return form
    msg_id = form.get("id", "")
    if c.client is None:
        return c.page("error.html", request, 503, message="The console is still starting.")
    ask = form.get("ask", "")
    try:
        await c.client.answer(
            msg_id,
            _answer_value(form.get("answer", "")),
            ask=int(ask) if ask.isdigit() and int(ask) > 0 else None,
        )
    except ReachError as e:
        return c.page("error.html", request, 409, message=str(e))
    return RedirectResponse("/message?" + _q(id=msg_id, note="answered"), status_code=303)


async def message_page(request: Request) -> Response:
    c = _view(request)
    msg_id = request.query_params.get("id", "").strip()
    if not msg_id:
        return c.page("message_find.html", request)
    return c.page("message.html", request, **(await c.task_ctx(msg_id)))

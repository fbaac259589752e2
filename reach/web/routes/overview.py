"""The namespace at a glance: the overview, its JSON frame, the registry events, one agent
(and draining it), and the live stream every page's fragments come by.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from redis import exceptions as rexc
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse

from ... import admin
from ...errors import ReachError
from ...registry import Registry
from ..console import _view
from ..formatting import _json, _q
from .forms import _checked_form, _read_only

LIVE_KEEPALIVE_S = 15.0


async def overview(request: Request) -> Response:
    c = _view(request)
    return c.page("overview.html", request, charts=c.charts(), **c.overview_ctx())


async def frame_json(request: Request) -> Response:
    c = _view(request)
    return JSONResponse(
        {"frame": c.monitor.frame, "error": c.monitor.error, "sampled": c.monitor.sampled}
    )


async def events_page(request: Request) -> Response:
    c = _view(request)
    return c.page("events.html", request, events=c._all())


async def agent_page(request: Request) -> Response:
    c = _view(request)
    agent_id = request.query_params.get("id", "")
    info = await Registry(c.control, c.namespace).get(agent_id) if agent_id else None
    ctx = c.agent_ctx(agent_id)
    card = _json(info.card) if info is not None and info.card else ""
    return c.page("agent.html", request, info=info, card=card, **ctx)


async def drain_confirm(request: Request) -> Response:
    c = _view(request)
    if c.guard.read_only:
        return _read_only(c, request)
    agent_id = request.query_params.get("id", "")
    return c.page(
        "confirm.html",
        request,
        action="/agents/drain",
        verb="Drain",
        what=f"agent {agent_id}",
        detail="It gets no new work, finishes what it has, then leaves the registry.",
        hidden={"id": agent_id},
        back="/agent?" + _q(id=agent_id),
        letters=[],
    )


async def drain_do(request: Request) -> Response:
    c = _view(request)
    form = await _checked_form(c, request)
    if isinstance(form, Response):
        return form
    agent_id = form.get("id", "")
    try:
        code = await admin.drain_agent(c.control, c.keys, agent_id)
    except ReachError as e:
        return c.page("error.html", request, 400, message=str(e))
    note = "already-draining" if code == 2 else "draining"
    return RedirectResponse("/agent?" + _q(id=agent_id, note=note), status_code=303)


# -- live ---------------------------------------------------------------------------------
async def live(request: Request) -> Response:
    c = _view(request)
    view = request.query_params.get("view", "overview")
    arg = request.query_params.get("arg", "")

    async def stream() -> AsyncIterator[str]:
        memo: dict[str, Any] = {}
        yield "retry: 2000\n\n"
        while True:
            seen = c.monitor.version
            try:
                parts = await c.fragments(view, arg, memo)
                yield "event: fragments\ndata: " + json.dumps(parts) + "\n\n"
            except (ReachError, rexc.RedisError, OSError) as e:
                yield "event: problem\ndata: " + json.dumps(str(e)) + "\n\n"
            new = await c.monitor.changed(seen, timeout_s=LIVE_KEEPALIVE_S)
            if new == seen:
                yield ": keep-alive\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )

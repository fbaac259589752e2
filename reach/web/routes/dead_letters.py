"""The dead-letter queue: the letters by capability, one letter, and the two actions on
them (replay, purge), each a GET that asks to confirm and a POST that does it.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ... import admin
from ...envelope import decode_payload
from ...errors import ReachError
from ..console import _view
from ..formatting import _json, _q
from .forms import _checked_form, _read_only

# Envelope fields a dead letter's page leaves out: the payload (shown apart), the
# signature, and the runtime's own bookkeeping (version, retry routing, waits, preemption).
ENVELOPE_INTERNAL = frozenset(
    {"payload", "sig", "kid", "v", "avoid", "busy_waits", "preempts", "holds"}
)
ENVELOPE_TIMES = frozenset({"sent_ms", "deadline_ms"})


async def dlq_page(request: Request) -> Response:
    c = _view(request)
    cap = request.query_params.get("cap", "")
    try:
        ctx = await c.dlq_ctx(cap)
    except ReachError as e:
        return c.page("error.html", request, 400, message=str(e))
    return c.page("dlq.html", request, **ctx)


async def letter_page(request: Request) -> Response:
    c = _view(request)
    cap, entry = request.query_params.get("cap", ""), request.query_params.get("id", "")
    try:
        found = await admin.find_dead_letter(c.redis, c.keys, entry, capability=cap or None)
    except ReachError as e:
        return c.page("error.html", request, 404, message=str(e))
    d = found.letter
    env = d.envelope
    fields: dict[str, Any] = {}
    payload = ""
    if env is not None:
        fields = {
            f: getattr(env, f)
            for f in env.__struct_fields__
            if f not in ENVELOPE_INTERNAL and getattr(env, f) not in ("", 0, {})
        }
        try:
            payload = _json(decode_payload(env.payload))
        except Exception:  # noqa: BLE001 - whatever the bytes, the rest is shown
            payload = "<undecodable>"
    return c.page(
        "letter.html",
        request,
        d=d,
        fields=fields,
        times=ENVELOPE_TIMES,
        payload=payload,
        raw=d.raw[:200].hex(),
    )


# -- actions: a GET asks to confirm, the POST (with the session's token) does it ------------
async def replay_confirm(request: Request) -> Response:
    c = _view(request)
    cap, entry = request.query_params.get("cap", ""), request.query_params.get("id", "")
    if c.guard.read_only:
        return _read_only(c, request)
    try:
        if entry:
            targets = [await admin.find_dead_letter(c.redis, c.keys, entry, capability=cap or None)]
        else:
            targets = await admin.list_dead_letters(
                c.redis, c.keys, capability=cap or None, limit=None
            )
    except ReachError as e:
        return c.page("error.html", request, 404, message=str(e))
    return c.page(
        "confirm.html",
        request,
        action="/dlq/replay",
        verb="Replay",
        what=(
            f"dead letter {entry}"
            if entry
            else f"all {len(targets)} dead letters" + (f" of {cap}" if cap else "")
        ),
        detail="Sent again through the router (same msg_id and idempotency key, attempts "
        "from 1): a letter sent leaves the dead-letter queue, one that cannot be sent stays.",
        hidden={"cap": cap, "id": entry},
        back="/dlq?" + _q(cap=cap),
        letters=[t.letter for t in targets][:20],
    )


async def replay_do(request: Request) -> Response:
    c = _view(request)
    form = await _checked_form(c, request)
    if isinstance(form, Response):
        return form
    cap, entry = form.get("cap", ""), form.get("id", "")
    try:
        if entry:
            targets = [await admin.find_dead_letter(c.redis, c.keys, entry, capability=cap or None)]
        else:
            targets = await admin.list_dead_letters(
                c.redis, c.keys, capability=cap or None, limit=None
            )
        res = await admin.replay_dead_letters(
            c.redis, c.keys, targets, client=c.client, control=c.apart
        )
    except ReachError as e:
        return c.page("error.html", request, 409, message=str(e))
    if len(res.sent) == 1 and not res.failed:
        return RedirectResponse(
            "/message?" + _q(id=res.sent[0].msg_id, note="replayed"), status_code=303
        )
    return c.page("replayed.html", request, res=res, back="/dlq?" + _q(cap=cap))


async def purge_confirm(request: Request) -> Response:
    c = _view(request)
    if c.guard.read_only:
        return _read_only(c, request)
    cap = request.query_params.get("cap", "")
    try:
        counts = await admin.dead_letter_counts(c.redis, c.keys)
    except ReachError as e:
        return c.page("error.html", request, 400, message=str(e))
    n = sum(x.count for x in counts if not cap or x.capability == cap)
    return c.page(
        "confirm.html",
        request,
        action="/dlq/purge",
        verb="Purge",
        what=f"{n} dead letters" + (f" of {cap}" if cap else " of every capability"),
        detail="They are deleted for good: nothing can bring them back.",
        hidden={"cap": cap},
        back="/dlq?" + _q(cap=cap),
        letters=[],
    )


async def purge_do(request: Request) -> Response:
    c = _view(request)
    form = await _checked_form(c, request)
    if isinstance(form, Response):
        return form
    cap = form.get("cap", "")
    try:
        n = await admin.purge_dead_letters(c.redis, c.keys, capability=cap or None, control=c.apart)
    except ReachError as e:
        return c.page("error.html", request, 400, message=str(e))
    return RedirectResponse("/dlq?" + _q(note="purged", n=n), status_code=303)

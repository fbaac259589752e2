"""The console's pages, live stream and actions (a Starlette application).

Pages are rendered on the server (Jinja2, every value escaped: names, ids, errors and
payloads come from Redis, where anyone holding the namespace's keys can write). A page
names its live view in ``data-live``; ``static/console.js`` opens that Server-Sent
Events stream and puts each fragment it brings (HTML rendered here, by element id) in
place. The work itself is :mod:`reach.admin`, :mod:`reach.overview`,
:mod:`reach.registry` and :mod:`reach.tasks`, as for the ``reach`` command.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import anyio
import jinja2
import msgspec
from markupsafe import Markup
from redis import exceptions as rexc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import admin
from ..client import Client
from ..connection import AnyRedis
from ..envelope import decode_payload, now_ms
from ..errors import ReachError
from ..keys import PRIORITIES, Keys
from ..outcomes import Status
from ..recent import DISPLAY_STATUSES, Filters, attempts_of, in_inboxes, list_messages, parse_since
from ..registry import Registry
from ..tasks import DeadLetter, get_status, parse_dead_letter
from ..untrusted import safe_text
from .charts import line_chart
from .live import Monitor
from .security import Guard, Session

HERE = Path(__file__).parent
LIVE_KEEPALIVE_S = 15.0
EVENTS_ON_OVERVIEW = 15
LETTERS_SHOWN = 200
LETTERS_SEARCHED = 1000  # dead letters of a capability searched for a message's own
MESSAGES_SHOWN = 50
INBOX_SEARCHED = 1000  # entries of each inbox searched for a pending message's payload
# Envelope fields a dead letter's page leaves out: the payload (shown apart), the
# signature, and the runtime's own bookkeeping (version, retry routing, waits, preemption).
ENVELOPE_INTERNAL = frozenset(
    {"payload", "sig", "kid", "v", "avoid", "busy_waits", "preempts", "holds"}
)
ENVELOPE_TIMES = frozenset({"sent_ms", "deadline_ms"})
TERMINAL = {Status.SUCCEEDED, Status.FAILED, Status.EXPIRED, Status.DEAD, Status.CANCELLED}


def sent_ms_of(msg_id: str) -> int | None:
    """When a msg_id made by reach was made: its first 12 hex digits are epoch ms."""
    head = msg_id[:12]
    if len(head) == 12 and all(c in "0123456789abcdef" for c in head):
        ms = int(head, 16)
        if 1_500_000_000_000 < ms < 4_000_000_000_000:
            return ms
    return None


def _when(ms: Any) -> str:
    if not isinstance(ms, int) or ms <= 0:
        return "-"
    try:
        return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"
    except (OverflowError, OSError, ValueError):
        return "-"


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _ago(ms: Any, now: int | None = None) -> Markup:
    """A time as people read it: ``12 s ago`` (``in 3 s`` ahead), the exact ISO time (UTC)
    on hover and in ``datetime``."""
    if not isinstance(ms, int) or isinstance(ms, bool) or not 0 < ms < 2**53:
        return Markup("-")
    try:
        iso = _iso(ms)
    except (OverflowError, OSError, ValueError):
        return Markup("-")
    d = (now_ms() if now is None else now) - ms
    a = abs(d)
    if a < 1000:
        text = "just now"
    else:
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
            if a >= size:
                n = a // size
                text = f"{n} {unit} ago" if d > 0 else f"in {n} {unit}"
                break
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(iso, text)


def _dur(ms: Any) -> str:
    if ms is None:
        return "-"
    ms = float(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def _rate(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def _json(v: Any) -> str:
    try:
        return json.dumps(v, indent=2, default=safe_text, ensure_ascii=False)[:20_000]
    except (TypeError, ValueError, RecursionError):
        return safe_text(repr(v))[:20_000]


# What a redirect after an action says: fixed texts, so a link cannot make the console
# show words of someone else's choosing.
NOTES = {
    "replayed": "Replayed: the message was sent again; its status below follows it.",
    "purged": "Purged {n} dead letters.",
    "draining": "Draining: the agent gets no new work, finishes what it has, then leaves.",
    "already-draining": "The agent was already draining.",
    "cancelled": "Cancelled: the message will not run (or is being stopped).",
    "not-cancelled": "Not cancelled: it had finished already (its status below).",
}


def note_text(code: str, params: Any) -> str:
    text = NOTES.get(code, "")
    n = params.get("n", "")
    return text.format(n=int(n) if n.isdigit() and len(n) < 12 else "?")


def _q(**kw: Any) -> str:
    return urlencode({k: v for k, v in kw.items() if v is not None and v != ""})


class Console:
    """What the pages share: the Redis, the monitor, the guard, the templates."""

    def __init__(
        self,
        redis: AnyRedis,
        namespace: str,
        guard: Guard,
        *,
        interval_s: float = 1.0,
        history_s: float = 600.0,
        redis_label: str = "",
    ) -> None:
        self.redis = redis
        self.namespace = namespace
        self.keys = Keys(namespace)
        self.guard = guard
        self.redis_label = redis_label
        self.monitor = Monitor(redis, namespace, interval_s=interval_s, history_s=history_s)
        self.client: Client | None = None
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters.update(
            when=_when, ago=_ago, dur=_dur, rate=_rate, pretty=_json, text=safe_text
        )
        self.env.globals.update(quote=lambda s: quote(safe_text(s), safe=""), q=_q)
        self.env.globals["PRIORITIES"] = PRIORITIES

    # -- rendering ------------------------------------------------------------------------
    def render(self, name: str, request: Request | None = None, **ctx: Any) -> str:
        m = self.monitor
        base: dict[str, Any] = {
            "ns": self.namespace,
            "redis_label": self.redis_label,
            "read_only": self.guard.read_only,
            "frame": m.frame,
            "error": m.error,
            "sampled": m.sampled,
            "note": "",
        }
        if request is not None:
            s: Session = request.state.session
            base["csrf"] = self.guard.csrf_token(s)
            base["note"] = note_text(request.query_params.get("note", ""), request.query_params)
        base.update(ctx)
        return self.env.get_template(name).render(**base)

    def page(self, name: str, request: Request, status: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(self.render(name, request, **ctx), status_code=status)

    def overview_ctx(self) -> dict[str, Any]:
        m = self.monitor
        return {
            "frame": m.frame,
            "error": m.error,
            "events": list(m.events)[-EVENTS_ON_OVERVIEW:][::-1],
            "sampled": m.sampled,
        }

    def charts(self) -> str:
        hist = list(self.monitor.history)
        ts = [p.ts_ms for p in hist]
        w = self.monitor.history_s
        rates = line_chart(
            "messages / s",
            ts,
            [
                ("in", [p.in_per_s for p in hist]),
                ("taken", [p.taken_per_s for p in hist]),
                ("dead", [p.dead_per_s for p in hist]),
            ],
            window_s=w,
        )
        load = line_chart(
            "in the inboxes",
            ts,
            [
                ("queued", [float(p.queued) for p in hist]),
                ("in flight", [p.inflight for p in hist]),
            ],
            window_s=w,
        )
        wait = line_chart(
            "latency (ms)",
            ts,
            [
                ("oldest pending", [p.oldest_pending_ms for p in hist]),
                ("time in inbox", [p.time_in_inbox_ms for p in hist]),
            ],
            window_s=w,
        )
        return rates + load + wait

    async def fragments(
        self, view: str, arg: str, memo: dict[str, Any] | None = None
    ) -> dict[str, str]:
        """The live parts of one view, by element id. ``memo``: what one live stream
        already sent (the dead letters are read again only when their counts moved)."""
        ctx = self.overview_ctx()
        status = self.render("_status.html", **ctx)
        if view == "overview":
            return {
                "status": status,
                "totals": self.render("_totals.html", **ctx),
                "caps": self.render("_caps.html", **ctx),
                "agents": self.render("_agents.html", **ctx),
                "charts": self.charts(),
                "events": self.render("_events.html", **ctx),
            }
        if view == "events":
            return {"status": status, "events": self.render("_events.html", events=self._all())}
        if view == "agent":
            return {"status": status, "agent": self.render("_agent.html", **self.agent_ctx(arg))}
        if view == "message":
            return {
                "status": status,
                "task": self.render("_task.html", **(await self.task_ctx(arg))),
            }
        if view == "messages":
            mctx = await self.messages_ctx(dict(parse_qsl(arg)))
            return {"status": status, "messages": self.render("_messages.html", **mctx)}
        if view == "dlq":
            sig = self.monitor.dlq_signature()
            if memo is not None and sig is not None and memo.get("dlq") == sig:
                return {"status": status}
            if memo is not None:
                memo["dlq"] = sig
            return {"status": status, "dlq": self.render("_dlq.html", **(await self.dlq_ctx(arg)))}
        return {"status": status}

    def _all(self) -> list[Any]:
        return list(self.monitor.events)[::-1]

    def agent_ctx(self, agent_id: str) -> dict[str, Any]:
        row = next((a for a in self.monitor.frame["agents"] if a["agent_id"] == agent_id), None)
        evs = [e for e in self._all() if e.agent_id == agent_id][:30]
        return {
            "agent_id": agent_id,
            "row": row,
            "events": evs,
            "ts_ms": self.monitor.frame["ts_ms"],
        }

    def known(self) -> tuple[list[str], list[str]]:
        """The capabilities and agent ids the last sample saw (for the filters)."""
        f = self.monitor.frame
        return (
            sorted(c["capability"] for c in f["capabilities"]),
            sorted(a["agent_id"] for a in f["agents"]),
        )

    async def messages_ctx(self, params: dict[str, str]) -> dict[str, Any]:
        """The message list for the filters in ``params`` (cap, agent, status, since,
        cursor); a filter that cannot be read is named in ``problem``."""
        caps, agents = self.known()
        problem = ""
        since = params.get("since", "").strip()
        try:
            since_ms = parse_since(since)
        except ValueError as e:
            problem, since_ms = str(e), 0
        status = params.get("status", "")
        if status and status not in DISPLAY_STATUSES:
            problem, status = f"unknown status {status!r}", ""
        f = Filters(
            capability=params.get("cap", ""),
            agent_id=params.get("agent", ""),
            status=status,
            since_ms=since_ms,
        )
        cursor = params.get("cursor", "")
        base = {"cap": f.capability, "agent": f.agent_id, "status": f.status, "since": since}
        # Only the inboxes the last sample saw holding entries are read (pending, running).
        busy = [
            a["agent_id"]
            for a in self.monitor.frame["agents"]
            if a["pending"] or a["inflight"] or any(a["queue"].values())
        ]
        try:
            page = await list_messages(
                self.redis, self.keys, f, limit=MESSAGES_SHOWN, cursor=cursor, agent_ids=busy
            )
        except ValueError as e:
            problem, page = str(e), await list_messages(self.redis, self.keys, f, limit=0)
        return {
            "page": page,
            "f": f,
            "since": since,
            "cursor": cursor,
            "caps": sorted(set(caps) | ({f.capability} - {""})),
            "agents": sorted(set(agents) | ({f.agent_id} - {""})),
            "statuses": DISPLAY_STATUSES,
            "query": _q(**base, cursor=cursor),
            "older": _q(**base, cursor=page.next),
            "newest": _q(**base),
            "problem": problem,
        }

    async def letter_of(self, capability: str, msg_id: str) -> DeadLetter | None:
        """The newest dead letter of ``msg_id`` among the last :data:`LETTERS_SEARCHED` of
        its capability's stream."""
        if not capability:
            return None
        rows = await self.redis.xrevrange(
            self.keys.dlq(capability), "+", "-", count=LETTERS_SEARCHED
        )
        for entry_id, fields in rows:
            d = parse_dead_letter(entry_id, fields)
            if d.msg_id == msg_id:
                return d
        return None

    async def task_ctx(self, msg_id: str) -> dict[str, Any]:
        st = await get_status(self.redis, self.keys, msg_id)
        result: Any = None
        if st.reply is not None and st.reply.status == Status.SUCCEEDED:
            try:
                result = decode_payload(st.reply.result)
            except Exception:  # noqa: BLE001 - whatever the bytes are, the rest is shown
                result = "<undecodable>"
        sent = sent_ms_of(msg_id)
        elapsed = None
        if sent is not None:
            end = st.updated_ms if st.status in TERMINAL and st.updated_ms else now_ms()
            elapsed = max(0, end - sent)
        attempts = await attempts_of(self.redis, self.keys, msg_id)
        letter = None
        if st.status in (Status.DEAD, Status.EXPIRED, Status.CANCELLED):
            letter = await self.letter_of(st.capability, msg_id)
        head: bytes | None = None
        length = 0
        if attempts:
            head, length = attempts[-1].payload_head, attempts[-1].payload_len
        elif letter is None and st.status in (Status.PENDING, Status.RUNNING, Status.RETRYING):
            agents = [st.agent_id] if st.agent_id else self.known()[1]
            for m in await in_inboxes(self.redis, self.keys, agents, INBOX_SEARCHED):
                if m.msg_id == msg_id:
                    head, length = m.payload_head, m.payload_len
                    break
        cancelled = st.status == Status.CANCELLED or (
            letter is not None and letter.reason == "cancelled"
        )
        return {
            "msg_id": msg_id,
            "st": st,
            "shown_status": Status.CANCELLED if cancelled else st.status,
            "result": result,
            "sent_ms": sent,
            "elapsed_ms": elapsed,
            "terminal": st.status in TERMINAL,
            "attempts": attempts,
            "letter": letter,
            "payload": _payload_preview(letter, head, length),
            "can_cancel": st.status in (Status.PENDING, Status.RUNNING, Status.RETRYING),
        }

    async def dlq_ctx(self, cap: str) -> dict[str, Any]:
        counts = await admin.dead_letter_counts(self.redis, self.keys)
        letters = await admin.list_dead_letters(
            self.redis, self.keys, capability=cap or None, limit=LETTERS_SHOWN
        )
        return {"counts": counts, "letters": [e.letter for e in letters], "cap": cap}


def _payload_preview(letter: DeadLetter | None, head: bytes | None, length: int) -> str:
    """The message's payload as JSON, from its dead letter (whole), else from the first
    bytes the index or its inbox entry gave (``head``, of ``length``); a note when none
    has it."""
    if letter is not None and letter.envelope is not None:
        head, length = bytes(letter.envelope.payload), len(letter.envelope.payload)
    if head is None:
        return "(not kept: no dead letter, inbox entry or index row of it is left)"
    if len(head) == length:
        try:
            return _json(decode_payload(msgspec.Raw(head)))
        except Exception:  # noqa: BLE001 - whatever the bytes, the rest is shown
            return "<undecodable>"
    text = head.decode("utf-8", "replace")
    return f"(the first {len(head)} of {length} bytes, msgpack) {text!r}"


def _view(request: Request) -> Console:
    c: Console = request.app.state.console
    return c


# -- pages ----------------------------------------------------------------------------------
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
    info = await Registry(c.redis, c.namespace).get(agent_id) if agent_id else None
    ctx = c.agent_ctx(agent_id)
    card = _json(info.card) if info is not None and info.card else ""
    return c.page("agent.html", request, info=info, card=card, **ctx)


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


async def message_page(request: Request) -> Response:
    c = _view(request)
    msg_id = request.query_params.get("id", "").strip()
    if not msg_id:
        return c.page("message_find.html", request)
    return c.page("message.html", request, **(await c.task_ctx(msg_id)))


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
        res = await admin.replay_dead_letters(c.redis, c.keys, targets, client=c.client)
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
        n = await admin.purge_dead_letters(c.redis, c.keys, capability=cap or None)
    except ReachError as e:
        return c.page("error.html", request, 400, message=str(e))
    return RedirectResponse("/dlq?" + _q(note="purged", n=n), status_code=303)


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
        code = await Registry(c.redis, c.namespace).drain(agent_id)
    except ReachError as e:
        return c.page("error.html", request, 400, message=str(e))
    note = "already-draining" if code == 2 else "draining"
    return RedirectResponse("/agent?" + _q(id=agent_id, note=note), status_code=303)


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

        await self.app(scope, receive, send_with_cookie)


def create_app(
    redis: AnyRedis,
    namespace: str,
    guard: Guard,
    *,
    interval_s: float = 1.0,
    history_s: float = 600.0,
    redis_label: str = "",
    on_ready: Callable[[], Awaitable[None]] | None = None,
) -> Starlette:
    """The console for ``namespace`` on ``redis`` (the caller closes ``redis``)."""
    console = Console(
        redis,
        namespace,
        guard,
        interval_s=interval_s,
        history_s=history_s,
        redis_label=redis_label,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            Client(redis=redis, namespace=namespace) as client,
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

"""What the console's pages share: :class:`Console` (the Redis, the monitor, the guard,
the templates) and the contexts the pages and the live stream render.

A page and its live fragments render the same context, so both are built here once; the
route modules (:mod:`reach.web.routes`) only read the request and pick the template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

import jinja2
import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse

from .. import admin
from ..client import Client
from ..connection import AnyRedis
from ..envelope import decode_payload, now_ms
from ..keys import PRIORITIES, Keys
from ..outcomes import Status
from ..recent import (
    DISPLAY_STATUSES,
    Filters,
    Page,
    attempts_of,
    in_inboxes,
    list_messages,
    parse_since,
)
from ..scheduling import ScheduledSend, count_scheduled, list_scheduled
from ..tasks import DeadLetter, get_status, parse_dead_letter
from ..untrusted import safe_text
from .charts import line_chart
from .formatting import _ago, _dur, _json, _q, _rate, _when, note_text, sent_ms_of
from .live import Monitor
from .security import Guard, Session

HERE = Path(__file__).parent
EVENTS_ON_OVERVIEW = 15
LETTERS_SHOWN = 200
LETTERS_SEARCHED = 1000  # dead letters of a capability searched for a message's own
MESSAGES_SHOWN = 50
INBOX_SEARCHED = 1000  # entries of each inbox searched for a pending message's payload
SCHEDULED_SEARCHED = 10_000  # scheduled sends read when the list is filtered
CONSOLE_STATUSES = ("scheduled", *DISPLAY_STATUSES)
"""The message list's status filter: ``scheduled`` lists the sends waiting for their due
time (``send(at=...)``), the others read the index of recent messages."""
TERMINAL = {Status.SUCCEEDED, Status.FAILED, Status.EXPIRED, Status.DEAD, Status.CANCELLED}


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
        control: AnyRedis | None = None,
    ) -> None:
        self.redis = redis
        # The control plane's Redis (registry, audit, access rules): ``redis`` unless the
        # namespace keeps it apart (reach.planes); ``apart`` is that one, else None.
        self.control = control or redis
        self.apart = control
        self.namespace = namespace
        self.keys = Keys(namespace)
        self.guard = guard
        self.redis_label = redis_label
        self.monitor = Monitor(
            redis, namespace, interval_s=interval_s, history_s=history_s, control=control
        )
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
        if status and status not in CONSOLE_STATUSES:
            problem, status = f"unknown status {status!r}", ""
        f = Filters(
            capability=params.get("cap", ""),
            agent_id=params.get("agent", ""),
            status=status,
            since_ms=since_ms,
        )
        cursor = params.get("cursor", "")
        base = {"cap": f.capability, "agent": f.agent_id, "status": f.status, "since": since}
        scheduled: list[ScheduledSend] = []
        scheduled_total = await count_scheduled(self.redis, self.keys)
        if status == "scheduled":
            scheduled = await self.scheduled_rows(f, scheduled_total)
        # Only the inboxes the last sample saw holding entries are read (pending, running).
        busy = [
            a["agent_id"]
            for a in self.monitor.frame["agents"]
            if a["pending"] or a["inflight"] or any(a["queue"].values())
        ]
        try:
            page = (
                Page(messages=[])
                if status == "scheduled"
                else await list_messages(
                    self.redis, self.keys, f, limit=MESSAGES_SHOWN, cursor=cursor, agent_ids=busy
                )
            )
        except ValueError as e:
            problem, page = str(e), await list_messages(self.redis, self.keys, f, limit=0)
        return {
            "page": page,
            "scheduled": scheduled,
            "scheduled_total": scheduled_total,
            "listing_scheduled": status == "scheduled",
            "scheduled_query": _q(cap=f.capability, agent=f.agent_id, status="scheduled"),
            "f": f,
            "since": since,
            "cursor": cursor,
            "caps": sorted(set(caps) | ({f.capability} - {""})),
            "agents": sorted(set(agents) | ({f.agent_id} - {""})),
            "statuses": CONSOLE_STATUSES,
            "query": _q(**base, cursor=cursor),
            "older": _q(**base, cursor=page.next),
            "newest": _q(**base),
            "problem": problem,
        }

    async def scheduled_rows(self, f: Filters, total: int) -> list[ScheduledSend]:
        """The first :data:`MESSAGES_SHOWN` scheduled sends, earliest due first, of the
        capability and target agent in ``f`` (filtered among the first
        :data:`SCHEDULED_SEARCHED` due)."""
        if not total:
            return []
        filtered = bool(f.capability or f.agent_id)
        limit = min(total, SCHEDULED_SEARCHED) if filtered else MESSAGES_SHOWN
        rows = await list_scheduled(self.redis, self.keys, limit=max(limit, 1))
        if f.capability:
            rows = [r for r in rows if r.capability == f.capability]
        if f.agent_id:
            rows = [r for r in rows if r.target == f.agent_id]
        return rows[:MESSAGES_SHOWN]

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
        elif letter is None and st.status in (
            Status.PENDING,
            Status.RUNNING,
            Status.INPUT_REQUIRED,
            Status.RETRYING,
        ):
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
            "can_cancel": st.status
            in (
                Status.SCHEDULED,
                Status.PENDING,
                Status.RUNNING,
                Status.INPUT_REQUIRED,
                Status.RETRYING,
            ),
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

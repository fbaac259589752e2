"""How the console writes values: times, durations, rates, JSON, query strings, notes.

The template filters and the few helpers the pages share, apart from the pages so each
route module reads them from one place. Values come from Redis, where anyone holding the
namespace's keys can write: each helper is total (any input gives a text) and escapes
what it marks safe.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup

from ..envelope import now_ms
from ..untrusted import safe_text


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
    "answered": "Answered: its handler goes on with the answer (its status below).",
}


def note_text(code: str, params: Any) -> str:
    text = NOTES.get(code, "")
    n = params.get("n", "")
    return text.format(n=int(n) if n.isdigit() and len(n) < 12 else "?")


def _q(**kw: Any) -> str:
    return urlencode({k: v for k, v in kw.items() if v is not None and v != ""})

"""The audit trail: an append-only, bounded stream per namespace (``Keys.audit``) of who
did what, when, and how it ended.

Two kinds of entries (docs/security.md, *Audit trail*):

* ``operator`` - an operator's action: dead letters replayed or purged, an agent drained,
  a rate limit or a quota set or cleared, a message cancelled, a question answered, a
  sweep. The shared functions that do them (:mod:`reach.admin`, :mod:`reach.limits`,
  :mod:`reach.quotas`, :mod:`reach._cancel`, :mod:`reach.asking`) write the entry, so
  the ``reach`` command, the console and a script calling the library are all recorded;
* ``call`` - a call of a capability marked ``@app.handler(CAP, audited=True)``, written by
  the agent when it settles the message (reach._worker.auditing).

Who acted is :func:`current_operator`: the name set for this task with :func:`acting_as`
(``reach --as NAME``, the console per request), else ``REACH_OPERATOR``, else the OS user
at the host, with the face it came through (``cli``, ``web``, ``api``) and the Redis ACL
user of the connection when the URL names one.

Retention: every write trims entries older than :func:`retention_s` (``XTRIM MINID``,
exact), and the stream never holds more than about :data:`AUDIT_MAXLEN` entries
(``MAXLEN ~``) whatever the retention. The retention is ``REACH_AUDIT_RETENTION`` (``30d``,
``12h``, ``3600`` seconds), else ``audit_retention`` in the project file (reach.toml),
else :data:`DEFAULT_RETENTION_S` (30 days). Every writer trims with its own setting, so
give every process of a namespace the same one (the shortest wins).

An entry's write failing never undoes nor fails the action it records (it is done): it is
logged (``reach.audit``, a warning) and :func:`record` returns None.

To record an action of your own (a command of yours, an extension)::

    await audit.record(redis, keys, action="caps.allow", target="payments.refund",
                       detail={"who": ["team:billing"]}, outcome="ok")
"""

from __future__ import annotations

import contextlib
import contextvars
import getpass
import json
import logging
import os
import re
import socket
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis import exceptions as rexc

from .clock import now_ms
from .config import PROJECT_FILES, read_project_file
from .connection import AnyRedis
from .errors import ConfigError
from .keys import Keys
from .untrusted import safe_text

log = logging.getLogger("reach.audit")

__all__ = [
    "AUDIT_MAXLEN",
    "DEFAULT_RETENTION_S",
    "ENV_OPERATOR",
    "ENV_RETENTION",
    "AuditEntry",
    "Operator",
    "acting_as",
    "current_operator",
    "operator_action",
    "parse_retention",
    "read_audit",
    "record",
    "record_many",
    "reset_operator",
    "retention_s",
    "tail_audit",
]

ENV_OPERATOR = "REACH_OPERATOR"
ENV_RETENTION = "REACH_AUDIT_RETENTION"
RETENTION_KEY = "audit_retention"
"""The project file's (reach.toml) setting of the retention, e.g. ``audit_retention = "7d"``."""
DEFAULT_RETENTION_S = 30 * 86_400
AUDIT_MAXLEN = 100_000
"""The most entries the stream keeps whatever the retention (about: ``MAXLEN ~``), so a
flood of audited calls cannot grow it without bound."""
MAX_FIELD_CHARS = 4096
"""The longest a field is written (a detail, an error): longer text is cut."""
KINDS = ("operator", "call")

_DURATION = re.compile(r"(\d{1,9})\s*([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}


# -- the retention --------------------------------------------------------------------------
def parse_retention(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``3600s`` or ``3600`` as seconds (at least 1)."""
    m = _DURATION.fullmatch(str(text).strip().lower())
    if not m or int(m.group(1)) < 1:
        raise ConfigError(
            f"Audit retention {text!r} is not a duration: give e.g. 30d, 12h, 90m or 3600 "
            f"(seconds), in {ENV_RETENTION} or {RETENTION_KEY} in reach.toml."
        )
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def _project_retention(start: Path) -> str | None:
    for d in (start, *start.parents):
        for name in PROJECT_FILES:
            f = d / name
            if f.is_file():
                value = read_project_file(f).get(RETENTION_KEY)
                if value is not None:
                    return str(value)
    return None


def retention_s() -> int:
    """How long entries are kept, in seconds: ``REACH_AUDIT_RETENTION``, else
    ``audit_retention`` in the nearest project file, else 30 days."""
    text = os.environ.get(ENV_RETENTION, "").strip()
    if not text:
        try:
            text = _project_retention(Path.cwd().resolve()) or ""
        except (OSError, ConfigError):
            text = ""
    return parse_retention(text) if text else DEFAULT_RETENTION_S


def retention_text(seconds: int) -> str:
    """``seconds`` as the shortest of ``Nd``, ``Nh``, ``Nm``, ``Ns`` that says it exactly."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# -- who acts -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Operator:
    """Who an operator entry names: ``name`` (``--as`` / ``REACH_OPERATOR``, else the OS
    user at the host), the face it came through (``via``: ``cli``, ``web``, ``api``), the
    console's browser session (a digest, never the cookie) and the client's address."""

    name: str
    via: str = "api"
    session: str = ""
    address: str = ""


_acting: contextvars.ContextVar[Operator | None] = contextvars.ContextVar(
    "reach_audit_operator", default=None
)


def _os_identity() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


def acting_as(
    name: str | None = None, *, via: str = "api", session: str = "", address: str = ""
) -> contextvars.Token[Operator | None]:
    """Name who acts from now on in this task (and the tasks it starts): ``name``, else
    ``REACH_OPERATOR``, else the OS user at the host. Returns the token that undoes it
    (:func:`reset_operator`), for code that must."""
    who = (name or "").strip() or os.environ.get(ENV_OPERATOR, "").strip() or _os_identity()
    return _acting.set(Operator(who[:200], via, session, address))


def reset_operator(token: contextvars.Token[Operator | None]) -> None:
    """Undo an :func:`acting_as` (its token): who acted before is who acts again."""
    _acting.reset(token)


def current_operator() -> Operator:
    """Who acts now (see :func:`acting_as`)."""
    op = _acting.get()
    if op is not None:
        return op
    name = os.environ.get(ENV_OPERATOR, "").strip() or _os_identity()
    return Operator(name[:200])


def _redis_user(redis: Any) -> str:
    """The ACL user the connection logs in as, when its URL or options name one."""
    for holder in (redis, getattr(redis, "redis", None)):
        pool = getattr(holder, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", None)
        if isinstance(kwargs, dict) and kwargs.get("username"):
            return str(kwargs["username"])
    return ""


# -- writing --------------------------------------------------------------------------------
def _cut(text: str) -> str:
    return text if len(text) <= MAX_FIELD_CHARS else text[: MAX_FIELD_CHARS - 1] + "…"


def _detail_text(detail: Any) -> str:
    if detail is None or detail == {} or detail == "":
        return ""
    if isinstance(detail, str):
        return _cut(detail)
    return _cut(json.dumps(detail, default=str, ensure_ascii=False, sort_keys=True))


def operator_fields(
    redis: Any,
    *,
    action: str,
    target: str = "",
    detail: Any = None,
    outcome: str = "ok",
    error: str = "",
    msg_id: str = "",
    operator: Operator | None = None,
) -> dict[str, str]:
    """The fields of an operator entry (what :func:`record` writes)."""
    op = operator or current_operator()
    fields = {
        "kind": "operator",
        "action": action,
        "target": target,
        "who": op.name,
        "via": op.via,
        "outcome": outcome,
        "error": _cut(error),
        "msg_id": msg_id,
        "detail": _detail_text(detail),
        "redis_user": _redis_user(redis),
        "session": op.session,
        "address": op.address,
    }
    return {k: v for k, v in fields.items() if v}


async def record_many(
    redis: AnyRedis,
    keys: Keys,
    entries: Sequence[Mapping[str, str]],
    *,
    retention: int | None = None,
    quiet: bool = False,
) -> list[str] | None:
    """Append ``entries`` (their fields as text) in one pipelined round trip, then trim
    the stream: entries older than the retention (``retention`` seconds, else
    :func:`retention_s`) go, and at most about :data:`AUDIT_MAXLEN` stay. Returns their
    ids; None when Redis refused (logged: the actions they record are done; at DEBUG with
    ``quiet``, for the entry of an action that failed and says so itself)."""
    if not entries:
        return []
    keep_s = retention if retention is not None else retention_s()
    try:
        pipe = redis.pipeline(transaction=False)
        for fields in entries:
            args: list[Any] = ["XADD", keys.audit, "MAXLEN", "~", AUDIT_MAXLEN, "*"]
            for k, v in fields.items():
                args += [k, v]
            pipe.execute_command(*args)
        # the cutoff on Redis's clock (reach.clock: this host's, corrected by its offset)
        cutoff = now_ms() - keep_s * 1000
        pipe.execute_command("XTRIM", keys.audit, "MINID", "=", max(0, cutoff))
        replies = await pipe.execute()
    except (rexc.RedisError, OSError) as e:
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "audit trail of %s: %d entr%s not written (%s: %s)",
            keys.namespace,
            len(entries),
            "y" if len(entries) == 1 else "ies",
            type(e).__name__,
            e,
        )
        return None
    return [safe_text(i) for i in replies[:-1]]


async def record(
    redis: AnyRedis,
    keys: Keys,
    *,
    action: str,
    target: str = "",
    detail: Any = None,
    outcome: str = "ok",
    error: str = "",
    msg_id: str = "",
    operator: Operator | None = None,
    retention: int | None = None,
    quiet: bool = False,
) -> str | None:
    """Record one operator action: ``action`` (``dlq.replay``, ``caps.allow``...), its
    ``target`` (a capability, an agent, a msg_id), ``detail`` (its arguments and result:
    a dict, written as JSON, or text), ``outcome`` (``ok`` or ``error``, with ``error``
    the text), ``msg_id`` where one applies. Who: ``operator``, else
    :func:`current_operator`. Returns the entry's id (None: not written, logged)."""
    fields = operator_fields(
        redis,
        action=action,
        target=target,
        detail=detail,
        outcome=outcome,
        error=error,
        msg_id=msg_id,
        operator=operator,
    )
    ids = await record_many(redis, keys, [fields], retention=retention, quiet=quiet)
    return ids[0] if ids else None


@dataclass(slots=True)
class ActionNote:
    """What an action adds to its entry as it goes (:func:`operator_action`): more
    ``detail``, its ``msg_id``, or an ``outcome``/``error`` of its own (a replay whose
    letters all failed is an ``error`` without raising)."""

    detail: dict[str, Any] = field(default_factory=dict)
    msg_id: str = ""
    outcome: str = "ok"
    error: str = ""


@contextlib.asynccontextmanager
async def operator_action(
    redis: AnyRedis,
    keys: Keys,
    action: str,
    *,
    target: str = "",
    detail: Mapping[str, Any] | None = None,
    msg_id: str = "",
) -> AsyncIterator[ActionNote]:
    """Record the action done in the block: ``ok`` (or what the block put in the note)
    when it ends, ``error`` with the exception's text when it raises (re-raised)."""
    note = ActionNote(dict(detail or {}), msg_id)
    try:
        yield note
    except Exception as e:
        await record(
            redis,
            keys,
            action=action,
            target=target,
            detail=note.detail,
            outcome="error",
            error=f"{type(e).__name__}: {e}",
            msg_id=note.msg_id,
            quiet=True,  # the action's own error is what its caller hears of
        )
        raise
    await record(
        redis,
        keys,
        action=action,
        target=target,
        detail=note.detail,
        outcome=note.outcome,
        error=note.error,
        msg_id=note.msg_id,
    )


# -- reading --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One entry as read (anyone holding the namespace's keys can write the stream: every
    field is read as text, whatever it holds). ``ts_ms`` is the time in its id."""

    id: str
    ts_ms: int
    kind: str
    action: str
    target: str
    who: str
    via: str
    outcome: str
    error: str
    msg_id: str
    detail: str
    fields: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        """The entry as ``reach audit --json`` prints it."""
        out: dict[str, Any] = {"id": self.id, "ts_ms": self.ts_ms}
        out.update(self.fields)
        if self.detail:
            try:
                out["detail"] = json.loads(self.detail)
            except ValueError:
                out["detail"] = self.detail
        return out


def parse_entry(entry_id: Any, raw: Mapping[Any, Any]) -> AuditEntry:
    """An entry of the stream as :class:`AuditEntry`."""
    fields = {safe_text(k): safe_text(v) for k, v in raw.items()}
    eid = safe_text(entry_id)
    head = eid.split("-", 1)[0]
    return AuditEntry(
        id=eid,
        ts_ms=int(head) if head.isdigit() else 0,
        kind=fields.get("kind", ""),
        action=fields.get("action", ""),
        target=fields.get("target", ""),
        who=fields.get("who", ""),
        via=fields.get("via", ""),
        outcome=fields.get("outcome", ""),
        error=fields.get("error", ""),
        msg_id=fields.get("msg_id", ""),
        detail=fields.get("detail", ""),
        fields=fields,
    )


def matches(e: AuditEntry, action: str | None, kind: str | None) -> bool:
    """Whether ``e`` passes the filters: ``action`` the action itself or a prefix ending
    at a dot (``dlq`` matches ``dlq.replay``), ``kind`` ``operator`` or ``call``."""
    if kind and e.kind != kind:
        return False
    return not action or e.action == action or e.action.startswith(action.rstrip(".") + ".")


SCAN_CHUNK = 500


async def read_audit(
    redis: AnyRedis,
    keys: Keys,
    *,
    since_ms: int = 0,
    action: str | None = None,
    kind: str | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """The newest ``limit`` entries since ``since_ms`` (epoch ms; 0: all kept) that
    match ``action`` and ``kind`` (see :func:`matches`), oldest first."""
    out: list[AuditEntry] = []
    end = "+"
    start = str(since_ms) if since_ms > 0 else "-"
    while len(out) < limit:
        try:
            rows = await redis.xrevrange(keys.audit, end, start, count=SCAN_CHUNK)
        except rexc.ResponseError as err:
            if "WRONGTYPE" in str(err):
                return []
            raise
        for entry_id, raw in rows:
            e = parse_entry(entry_id, raw)
            if matches(e, action, kind):
                out.append(e)
                if len(out) >= limit:
                    break
        if len(rows) < SCAN_CHUNK:
            break
        end = "(" + safe_text(rows[-1][0])
    return out[::-1]


async def audit_position(redis: AnyRedis, keys: Keys) -> str:
    """The id of the newest entry (``0-0``: none): where a follow starts."""
    rows = await redis.xrevrange(keys.audit, "+", "-", count=1)
    return safe_text(rows[0][0]) if rows else "0-0"


async def tail_audit(
    redis: AnyRedis, keys: Keys, *, last_id: str, block_ms: int = 1000
) -> list[AuditEntry]:
    """The entries after ``last_id``, waiting up to ``block_ms`` for one."""
    reply = await redis.xread({keys.audit: last_id}, block=block_ms, count=1000)
    out: list[AuditEntry] = []
    for _stream, rows in reply or []:
        out += [parse_entry(i, f) for i, f in rows]
    return out


@contextlib.contextmanager
def operator_scope(name: str | None = None, *, via: str = "api") -> Iterator[Operator]:
    """:func:`acting_as` for a block only (a script's batch of actions under one name)."""
    token = acting_as(name, via=via)
    try:
        op = _acting.get()
        assert op is not None
        yield op
    finally:
        reset_operator(token)

"""``reach audit``: the namespace's audit trail (reach.audit), past entries and, with
``--follow``, new ones as they come."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any, Optional

import typer

from reach import audit
from reach.errors import ConfigError
from reach.keys import Keys
from reach.recent import parse_since

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    command,
    json_line,
    open_control,
    print_json,
    safe_text,
    table,
)

RETENTION_HELP = (
    f"Entries are kept {audit.retention_text(audit.DEFAULT_RETENTION_S)} by default: set "
    f"{audit.ENV_RETENTION} (e.g. 7d, 12h) or audit_retention in reach.toml for every "
    "process of the namespace (each write trims what is older); at most about "
    f"{audit.AUDIT_MAXLEN:,} entries are kept whatever the retention."
)


def _when(ts_ms: int) -> str:
    if ts_ms <= 0:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts_ms / 1000))


def _what(e: audit.AuditEntry) -> str:
    extra = []
    if e.fields.get("agent"):
        extra.append(f"agent={e.fields['agent']}")
    if e.fields.get("reason"):
        extra.append(f"reason={e.fields['reason']}")
    if e.detail:
        extra.append(e.detail)
    if e.error:
        extra.append(e.error)
    return " ".join(extra)


def _who(e: audit.AuditEntry) -> str:
    via = e.via or "?"
    auth = e.fields.get("auth")
    user = e.fields.get("redis_user")
    return (
        f"{e.who} ({via}"
        + (f", {auth}" if auth else "")
        + (f", redis {user}" if user else "")
        + ")"
    )


def _line(e: audit.AuditEntry) -> str:
    return safe_text(
        f"{_when(e.ts_ms)}  {e.action:<16} {e.target}  {e.outcome}  by {_who(e)}"
        + (f"  msg {e.msg_id}" if e.msg_id else "")
        + (f"  {_what(e)}" if _what(e) else ""),
        oneline=True,
    )


def _print(e: audit.AuditEntry, as_json: bool) -> None:
    print(json_line(e.as_dict()) if as_json else _line(e))


async def _audit(
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new entries as they come.")
    ] = False,
    since: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--since", metavar="AGE", help="Only entries newer: 15m, 2h, 1d, or epoch ms."
        ),
    ] = None,
    action: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--action",
            metavar="ACTION",
            help="Only this action, or a family: dlq (dlq.replay, dlq.purge), caps.limit, "
            "quota, agents.drain, cancel, task.answer, sweep, call (audited calls).",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=0, help="How many past entries to show (the newest).")
    ] = 50,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show the audit trail: every operator action (dead letters replayed or purged, an
    agent drained, limits and quotas set or cleared, a cancel, an answer, a sweep; from
    this command, the console or the library) and every call of a capability marked
    @app.handler(CAP, audited=True): who, what, when, the outcome and the msg_id.

    Who: `reach --as NAME ...` or REACH_OPERATOR, else the OS user at the host; a call's
    caller is its verified signer (signed), else the source it claims (claimed).

    Examples: reach audit --since 1d --action dlq;  reach audit -f --json
    """
    try:
        since_ms = parse_since(since or "")
    except ValueError as err:
        raise ConfigError(f"--since: {err}") from None
    keys = Keys(namespace)
    r = await open_control(redis_url)
    try:
        past = (
            await audit.read_audit(r, keys, since_ms=since_ms, action=action, limit=limit)
            if limit
            else []
        )
        if json_ and not follow:
            print_json([e.as_dict() for e in past])
            return
        if not follow:
            _table(past, namespace)
            return
        for e in past:
            _print(e, json_)
        sys.stdout.flush()
        # From a position, not "$": an entry landing between two reads is not missed.
        last = past[-1].id if past else await audit.audit_position(r, keys)
        while True:
            for e in await audit.tail_audit(r, keys, last_id=last, block_ms=1000):
                last = e.id
                if audit.matches(e, action, None) and e.ts_ms >= since_ms:
                    _print(e, json_)
            sys.stdout.flush()
    finally:
        await r.aclose()


_audit.__doc__ = (_audit.__doc__ or "") + "\n\n" + RETENTION_HELP
audit_cmd = command(_audit)


def _table(entries: list[audit.AuditEntry], namespace: str) -> None:
    rows: list[list[Any]] = [
        [
            _when(e.ts_ms),
            e.action,
            e.target,
            e.outcome,
            _who(e),
            e.msg_id,
            _what(e),
        ]
        for e in entries
    ]
    keep = audit.retention_text(audit.retention_s())
    table(
        f"audit trail of {namespace} (kept {keep})",
        ["when", "action", "target", "outcome", "who", "msg_id", "detail"],
        rows,
        optional=("detail", "msg_id"),
    )

"""`reach tasks`: the recent messages, as the console's message list shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Optional

import msgspec
import typer

from reach.envelope import now_ms
from reach.keys import Keys
from reach.recent import DISPLAY_STATUSES, Filters, list_messages, parse_since
from reach.registry import Registry
from reach.scheduling import count_scheduled, list_scheduled

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    age,
    command,
    fail,
    open_control_apart,
    open_redis,
    print_json,
    safe_text,
    table,
)
from .completion import complete_agent_id, complete_capability


@command
async def tasks(
    cap: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--cap", help="Only this capability.", autocompletion=complete_capability),
    ] = None,
    agent: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--agent", help="Only this agent's.", autocompletion=complete_agent_id),
    ] = None,
    status: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--status",
            metavar="STATUS",
            help="Only this status: " + ", ".join(DISPLAY_STATUSES) + " (failed: dead or "
            "expired, not cancelled).",
        ),
    ] = None,
    since: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--since", metavar="AGE", help="Only since: 30s, 15m, 2h, 1d or epoch ms."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="About this many.")] = 50,
    cursor: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--cursor", metavar="CURSOR", help="Go on from a page's `next`."),
    ] = None,
    scheduled: Annotated[
        bool,
        typer.Option(
            "--scheduled",
            help="List the scheduled sends instead (send(at=...)): due first, with their due "
            "time; --cap and --limit apply.",
        ),
    ] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """List recent messages, newest first: those in an inbox (pending, running), then those
    handled lately, from the index of recent messages (as the console's /messages).
    With --scheduled: the sends waiting for their due time, the earliest first.

    Example: reach tasks --status failed --since 1h
    """
    if scheduled:
        if agent or status or since or cursor:
            fail("--scheduled lists every scheduled send: use it with --cap and --limit only.")
        await _scheduled(redis_url, namespace, cap or "", limit, json_)
        return
    if status and status not in DISPLAY_STATUSES:
        fail(f"--status {status!r}: use one of {', '.join(DISPLAY_STATUSES)}.")
    try:
        since_ms = parse_since(since or "")
    except ValueError as e:
        fail(f"--since: {e}.")
    f = Filters(capability=cap or "", agent_id=agent or "", status=status or "", since_ms=since_ms)
    r = await open_redis(redis_url)
    try:
        keys = Keys(namespace)
        control = await open_control_apart(redis_url)  # the registry's, when apart
        try:
            agents = [a.agent_id for a in await Registry(control or r, namespace).agents()]
        finally:
            if control is not None:
                await control.aclose()
        try:
            page = await list_messages(
                r, keys, f, limit=limit, cursor=cursor or "", agent_ids=agents
            )
        except ValueError as e:
            fail(f"--cursor: {e}.")
    finally:
        await r.aclose()
    if json_:
        print_json({"messages": [m.as_json() for m in page.messages], "next": page.next})
        return
    now = now_ms()
    table(
        f"messages in {namespace!r}" + (" (newest first)" if page.messages else ": none"),
        ["msg_id", "status", "capability", "agent", "attempt", "error", "sent", "last"],
        [
            (
                m.msg_id,
                m.status + (f" ({m.reason})" if m.reason and m.status == "dead" else ""),
                m.capability,
                m.agent_id,
                m.attempt,
                safe_text(
                    f"{m.error_type}: {m.error}" if m.error_type and m.error else m.error_type,
                    oneline=True,
                ),
                age(m.sent_ms, now),
                age(m.ended_ms or m.started_ms or m.sent_ms, now),
            )
            for m in page.messages
        ],
        optional=("sent", "attempt", "agent"),
    )
    if page.next:
        print(f"older: reach tasks --cursor {page.next} (same filters)")


async def _scheduled(redis_url: str, namespace: str, cap: str, limit: int, json_: bool) -> None:
    """``reach tasks --scheduled``: the scheduled sends, the earliest due first."""
    r = await open_redis(redis_url)
    try:
        keys = Keys(namespace)
        total = await count_scheduled(r, keys)
        # A capability filter reads further: the first ``limit`` of that capability.
        rows = await list_scheduled(r, keys, limit=max(limit, total) if cap else limit)
    finally:
        await r.aclose()
    if cap:
        rows = [s for s in rows if s.capability == cap][:limit]
    if json_:
        print_json({"scheduled": [msgspec.to_builtins(s) for s in rows], "total": total})
        return
    now = now_ms()
    shown = f"{len(rows)} of {total}" if total > len(rows) else str(len(rows))
    table(
        f"scheduled sends in {namespace!r}: "
        + (f"{shown}, the earliest due first" if rows else "none"),
        ["msg_id", "capability", "due (UTC)", "in", "priority", "target"],
        [
            (
                s.msg_id,
                s.capability,
                _utc(s.due_ms),
                ("in " + age(now, s.due_ms)) if s.due_ms > now else "due now",
                s.priority,
                s.target,
            )
            for s in rows
        ],
        optional=("priority", "target"),
    )


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

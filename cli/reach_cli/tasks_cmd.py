"""`reach tasks`: the recent messages, as the console's message list shows them."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from reach.envelope import now_ms
from reach.keys import Keys
from reach.recent import DISPLAY_STATUSES, Filters, list_messages, parse_since
from reach.registry import Registry

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    age,
    command,
    fail,
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
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """List recent messages, newest first: those in an inbox (pending, running), then those
    handled lately, from the index of recent messages (as the console's /messages).

    Example: reach tasks --status failed --since 1h
    """
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
        agents = [a.agent_id for a in await Registry(r, namespace).agents()]
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

"""``reach quota``: set, show and clear a namespace's quotas (reach.quotas): a bound on
every agent's inbox and a send rate per caller identity."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from reach.keys import Keys
from reach.limits import parse_limit
from reach.quotas import MAX_INBOX, Quotas, clear_quotas, get_quotas, set_quotas

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    command,
    fail,
    open_control,
    print_json,
)

quota_app = typer.Typer(
    help="Per-tenant quotas: a bound on every agent's inbox, a send rate per caller.",
    no_args_is_help=True,
)


def describe(namespace: str, q: Quotas) -> str:
    """One line: the namespace's quotas."""
    parts = []
    if q.max_inbox:
        parts.append(f"max inbox {q.max_inbox} messages per agent")
    if q.send_rate is not None:
        parts.append(f"send rate {q.send_rate} per caller identity")
    return f"quotas of {namespace!r}: " + ("; ".join(parts) if parts else "none")


def _show(namespace: str, q: Quotas, json_: bool, note: str = "") -> None:
    if json_:
        print_json(q.as_dict())
    else:
        print(describe(namespace, q) + note)


@quota_app.command("show")
@command
async def show_cmd(
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Print the namespace's quotas. `--json`: `max_inbox`, `send_rate` (text), and
    `send_rate_per_s`, `burst` (each `null` when not set).

    Example: reach quota show --namespace prod
    """
    r = await open_control(redis_url)
    try:
        q = await get_quotas(r, Keys(namespace))
    finally:
        await r.aclose()
    _show(namespace, q, json_)


@quota_app.command("set")
@command
async def set_cmd(
    max_inbox: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--max-inbox",
            min=1,
            max=MAX_INBOX,
            help="Messages an agent's inbox may hold (queued + being handled); a new send "
            "past it raises Overloaded.",
        ),
    ] = None,
    send_rate: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--send-rate",
            help="Sends per period per caller identity: 100/s, 600/m, 3/10s.",
        ),
    ] = None,
    burst: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--burst", min=1, help="Sends allowed at once after a quiet spell."),
    ] = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Set the namespace's quotas (those not given are kept). Clients apply a change
    within a second, to new sends only: a retry or a rerouted message, accepted once, is
    never refused.

    Examples: reach quota set --max-inbox 1000;  reach quota set --send-rate 100/s
    --burst 20
    """
    if burst is not None and send_rate is None:
        fail("--burst goes with --send-rate, e.g. reach quota set --send-rate 100/s --burst 20")
    if max_inbox is None and send_rate is None:
        fail("give --max-inbox N and/or --send-rate RATE, e.g. reach quota set --max-inbox 1000")
    rate = parse_limit(send_rate, burst=burst) if send_rate is not None else None
    keys = Keys(namespace)
    r = await open_control(redis_url)
    try:
        await set_quotas(r, keys, max_inbox=max_inbox, send_rate=rate)
        q = await get_quotas(r, keys)
    finally:
        await r.aclose()
    _show(namespace, q, json_, "; clients apply it within a second")


@quota_app.command("clear")
@command
async def clear_cmd(
    max_inbox: Annotated[
        bool, typer.Option("--max-inbox", help="Remove only the inbox bound.")
    ] = False,
    send_rate: Annotated[
        bool, typer.Option("--send-rate", help="Remove only the send rate.")
    ] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Remove the namespace's quotas (both, or the one named).

    Examples: reach quota clear;  reach quota clear --send-rate
    """
    both = not max_inbox and not send_rate
    keys = Keys(namespace)
    r = await open_control(redis_url)
    try:
        await clear_quotas(r, keys, max_inbox=both or max_inbox, send_rate=both or send_rate)
        q = await get_quotas(r, keys)
    finally:
        await r.aclose()
    _show(namespace, q, json_)

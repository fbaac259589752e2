"""``reach caps split``: split a capability's new sessions and messages between the
application versions its agents run (version canaries: reach.splits, docs/routing.md)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from reach.keys import Keys
from reach.registry import AgentInfo, Registry, normalize_capability
from reach.routing.split import Split
from reach.splits import get_split, set_split

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
    table,
    warn,
)
from .completion import complete_capability


def _rows(split: Split | None, agents: list[AgentInfo]) -> list[dict[str, Any]]:
    """One row per version the split names or a live agent runs (those: share 0)."""
    versions = [v for v, _ in split.shares] if split is not None else []
    versions += sorted({a.app_version for a in agents} - set(versions))
    rows = []
    for v in versions:
        mine = [a for a in agents if a.app_version == v]
        share = split.share(v) if split is not None else None
        rows.append(
            {
                "version": v,
                "share": share,
                "percent": round(split.percent(v), 2) if split is not None else None,
                "agents": len(mine),
                "routable": sum(a.routable for a in mine),
            }
        )
    return rows


@command
async def split(
    capability: Annotated[
        str,
        typer.Argument(
            help="The capability, e.g. text.summarize.", autocompletion=complete_capability
        ),
    ],
    shares: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Argument(
            help="VERSION=SHARE items, e.g. 1.4=90 1.5=10 (relative shares; =90 names the "
            "agents without a version). Left out: show the split.",
            show_default=False,
        ),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Remove the split: every agent takes messages again.")
    ] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Set, show or remove how a capability's traffic is split between the application
    versions its agents run (Agent(version=...), reach worker --version; shown by reach
    agents). New sessions go to each version in proportion to its share and stay on it
    while it keeps a share; a message without a session is split per message. A version
    the split does not name gets no traffic (share 0), nor do agents without a version
    unless the split names them (=SHARE). Messages sent to one agent (--target) and
    broadcasts ignore the split. Clients apply a change within a second.

    Examples: reach caps split text.summarize 1.4=90 1.5=10;  reach caps split
    text.summarize --json;  reach caps split text.summarize --clear
    """
    cap = normalize_capability(capability)
    if clear and shares:
        fail("give VERSION=SHARE items or --clear, not both")
    new = Split.parse(shares) if shares else None
    keys = Keys(namespace)
    r = await open_control(redis_url)  # splits and the registry: the control plane
    try:
        if clear or new is not None:
            await set_split(r, keys, cap, new)
            current = new
        else:
            current = await get_split(r, keys, cap)
        agents = [a for a in await Registry(r, namespace).agents(cap) if a.state != "evicted"]
    finally:
        await r.aclose()
    rows = _rows(current, agents)
    if json_:
        print_json(
            {"capability": cap, "split": str(current) if current else None, "versions": rows}
        )
        return
    if current is None:
        print(f"{cap}: not split" + (" (removed)" if clear else "") + " - every agent takes it")
    else:
        table(
            f"{cap}: split {current}",
            ["version", "share", "percent", "agents", "routable"],
            [
                (
                    r["version"] or '"" (none)',
                    f"{r['share']:g}",
                    f"{r['percent']:g}%",
                    r["agents"],
                    r["routable"],
                )
                for r in rows
            ],
        )
    if new is not None:
        print(f"{cap}: clients apply the split within a second")
        missing = [
            v for v in new.live if not any(a.app_version == v and a.routable for a in agents)
        ]
        if len(missing) == len(new.live):
            warn(
                f"no routable agent of {cap!r} runs a version with a share: its messages fail "
                "(NoAgentAvailable, reason 'version') until one does"
            )
        else:
            for v in missing:
                warn(
                    f"no routable agent of {cap!r} runs version {v!r}: its share goes to the "
                    "other versions until one does"
                )

"""``reach agents``: list, show, card and drain the agents of a namespace."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

import reach
from reach import admin
from reach.envelope import now_ms
from reach.errors import UnknownAgent
from reach.keys import Keys
from reach.overview import routing_of
from reach.registry import STATES, Registry

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    age,
    command,
    fail,
    find_redis,
    open_control,
    print_json,
    require_text,
    run,
    safe_text,
    table,
    warn,
)
from .completion import complete_agent_id, complete_capability

agents_app = typer.Typer(
    help="List, inspect and drain agents.", invoke_without_command=True, no_args_is_help=False
)


# -- agents -------------------------------------------------------------------------------
def _agent_row(a: reach.AgentInfo, now: int) -> dict[str, Any]:
    return {
        "agent_id": a.agent_id,
        "state": a.state,
        "routing": routing_of(a),
        "ready": a.ready,
        "draining": a.draining,
        "weight": a.weight,
        "version": a.version,
        "app_version": a.app_version,
        "instance_id": a.instance_id,
        "capabilities": a.capabilities,
        "metadata": a.metadata,
        "last_heartbeat_ms": a.last_heartbeat_ms,
        "lease_age_ms": _lease_age(a.last_heartbeat_ms, now),
        "queue_depth": a.queue_depth,
        "inflight": a.inflight,
        "registered_ms": a.registered_ms,
        "protocol": a.protocol or None,  # None: the runtime states none (before version 1)
    }


@agents_app.callback()
def agents_list(
    ctx: typer.Context,
    cap: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--cap",
            help="Only agents of this capability.",
            autocompletion=complete_capability,
        ),
    ] = None,
    state: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--state", help=f"Only agents in this state: {', '.join(STATES)}."),
    ] = None,
    where: Annotated[
        Optional[list[str]], typer.Option("--where", help="Metadata filter KEY=VALUE (repeatable).")  # noqa: UP045
    ] = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """List agents with state, readiness, weight, application version (Agent(version=),
    reach worker --version: what reach caps split routes by) and lease age.

    Examples: reach agents --cap text.summarize --state active;  reach agents --json
    """
    if ctx.invoked_subcommand is not None:
        return
    require_text(
        {"cap": cap, "state": state, "where": where, "redis_url": redis_url, "namespace": namespace}
    )
    if state is not None and state not in STATES:
        fail(f"unknown state {state!r}: use {', '.join(STATES)}")
    redis_url = find_redis(redis_url)
    filt: dict[str, str] = {}
    for w in where or []:
        if "=" not in w:
            fail(f"--where takes KEY=VALUE, got {w!r}")
        k, v = w.split("=", 1)
        filt[k] = v

    async def body() -> list[reach.AgentInfo]:
        r = await open_control(redis_url)
        try:
            return await Registry(r, namespace).agents(cap, state=state, where=filt or None)
        finally:
            await r.aclose()

    agents = run(body, url=redis_url)
    now = now_ms()
    if json_:
        print_json([_agent_row(a, now) for a in agents])
        return
    rows = [
        (
            a.agent_id,
            a.state,
            routing_of(a),
            _number(a.weight),
            a.app_version,
            a.capabilities,
            age(a.last_heartbeat_ms, now),
            a.queue_depth,
            a.inflight,
            dict(_items(a.metadata)),
        )
        for a in agents
    ]
    table(
        f"agents in {namespace!r}",
        [
            "agent",
            "state",
            "routing",
            "weight",
            "version",
            "capabilities",
            "lease age",
            "queue",
            "in-flight",
            "metadata",
        ],
        rows,
        optional=("metadata", "weight", "version", "lease age", "routing"),
    )


def _lease_age(last_heartbeat_ms: Any, now: int) -> int | None:
    if isinstance(last_heartbeat_ms, int) and last_heartbeat_ms:
        return max(0, now - last_heartbeat_ms)
    return None


def _number(v: Any) -> str:
    """A number from a record for a table: compact, or as stored when it is not one."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:g}"
    return safe_text(v)


def _items(d: Any) -> list[tuple[Any, Any]]:
    return list(d.items()) if isinstance(d, dict) else []


async def _get_agent(redis_url: str, namespace: str, agent_id: str) -> reach.AgentInfo:
    """One agent's record (live or shadow), or UnknownAgent that says where to look."""
    r = await open_control(redis_url)
    try:
        a = await Registry(r, namespace).get(agent_id)
    finally:
        await r.aclose()
    if a is None:
        raise UnknownAgent(
            f"No agent {agent_id!r} in namespace {namespace!r} (see `reach agents`)."
        )
    return a


@agents_app.command("show")
@command
async def agents_show(
    agent_id: Annotated[
        str, typer.Argument(help="The agent's id.", autocompletion=complete_agent_id)
    ],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show one agent's whole record (also shadows of evicted agents).

    Example: reach agents show summarizer-1
    """
    a = await _get_agent(redis_url, namespace, agent_id)
    row = _agent_row(a, now_ms())
    row.update(
        lease_ms=a.lease_ms,
        evict_after_ms=a.evict_after_ms,
        state_ms=a.state_ms,
        ready_ms=a.ready_ms,
        max_queue=a.max_queue,
        card=a.card,
    )
    if json_:
        print_json(row)
        return
    table(f"agent {agent_id}", ["field", "value"], [(k, v) for k, v in row.items()])


@agents_app.command("card")
@command
async def agents_card(
    agent_id: Annotated[
        str, typer.Argument(help="The agent's id.", autocompletion=complete_agent_id)
    ],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show an agent as an A2A Agent Card (the card JSON with --json; see docs/a2a.md).

    Example: reach agents card summarizer-1 --json > summarizer-1.agent-card.json
    """
    from reach.card import agent_card, card_problems

    a = await _get_agent(redis_url, namespace, agent_id)
    card = agent_card(a, namespace=namespace)
    for problem in card_problems(card):  # only a card the agent registered with can cause these
        warn(problem)
    if json_:
        print_json(card)
        return
    iface = "\n".join(
        f"{i.get('url')} ({i.get('protocolBinding')})" for i in card["supportedInterfaces"]
    )
    rows = [
        ("name", card["name"]),
        ("description", card["description"]),
        ("version", card["version"]),
        ("interfaces", iface),
        ("input modes", ", ".join(card["defaultInputModes"])),
        ("output modes", ", ".join(card["defaultOutputModes"])),
    ]
    if isinstance(card.get("provider"), dict):
        rows.append(("provider", card["provider"].get("organization", "")))
    table(f"A2A Agent Card of {agent_id}", ["field", "value"], rows)
    table(
        "skills",
        ["id", "name", "description", "tags"],
        [
            (s.get("id"), s.get("name"), s.get("description"), ", ".join(s.get("tags") or []))
            for s in card["skills"]
        ],
    )


@agents_app.command("drain")
@command
async def agents_drain(
    agent_id: Annotated[
        str, typer.Argument(help="The agent to drain.", autocompletion=complete_agent_id)
    ],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
) -> None:
    """Stop routing new work to an agent; it finishes what it holds, then deregisters.

    Example: reach agents drain summarizer-1
    """
    r = await open_control(redis_url)
    try:
        code = await admin.drain_agent(r, Keys(namespace), agent_id)
    finally:
        await r.aclose()
    print(f"{agent_id}: {'already draining' if code == 2 else 'draining'}")

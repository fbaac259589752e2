"""``reach caps``: list the capabilities of a namespace, show one (its agents, timeout,
limit and schemas), and set their rate limits."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from reach.authz import capability_security
from reach.keys import Keys
from reach.limits import RateLimit, get_limits, parse_limit, set_limit
from reach.registry import Registry, advertised_timeout, normalize_capability
from reach.schemas import capability_schemas

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    command,
    fail,
    find_redis,
    json_line,
    open_control,
    print_json,
    require_text,
    run,
    table,
)
from .completion import complete_capability
from .split_cmd import split

caps_app = typer.Typer(
    help="List capabilities; set their rate limits; say who may call them; split them between versions.",
    invoke_without_command=True,
    no_args_is_help=False,
)


@caps_app.callback()
def caps_list(
    ctx: typer.Context,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """List capabilities, how many live agents declare each (and how many of them are
    routable), the timeout their agents advertise (what a call that names none gets; the
    longest when they differ), their rate limits and their security level (public,
    internal, sensitive: `reach caps access` shows who may call them).

    Examples: reach caps --namespace prod;  reach caps limit text.summarize 50/s
    """
    if ctx.invoked_subcommand is not None:
        return
    require_text({"redis_url": redis_url, "namespace": namespace})
    url = find_redis(redis_url)

    Found = tuple[list[tuple[str, int]], dict[str, int], dict[str, float | None], dict[str, str]]

    async def body() -> tuple[Found, dict[str, RateLimit]]:
        r = await open_control(url)
        try:
            reg = Registry(r, namespace)
            rows = await reg.capabilities()
            ready: dict[str, int] = {}
            timeouts: dict[str, float | None] = {}
            security: dict[str, str] = {}  # reach.authz: public, internal, sensitive
            for cap, _ in rows:
                agents = await reg.agents(cap, state="active")
                ready[cap] = sum(a.routable for a in agents)
                timeouts[cap] = advertised_timeout(agents, cap)
                security[cap] = capability_security(agents, cap)
            return (rows, ready, timeouts, security), await get_limits(r, Keys(namespace))
        finally:
            await r.aclose()

    (rows, ready, timeouts, security), limits = run(body, url=url)
    if json_:
        print_json(
            [
                {
                    "capability": c,
                    "agents": n,
                    "routable": ready[c],
                    "timeout_s": timeouts[c],
                    "limit": str(limits[c]) if c in limits else None,
                    "security": security[c],
                }
                for c, n in rows
            ]
        )
        return
    table(
        f"capabilities in {namespace!r}",
        ["capability", "agents", "routable", "timeout", "limit", "security"],
        [
            (
                c,
                n,
                ready[c],
                _seconds(timeouts[c]),
                str(limits[c]) if c in limits else "",
                security[c],
            )
            for c, n in rows
        ],
    )


def _seconds(value: float | None) -> str:
    return f"{value:g} s" if value is not None else ""


def _limit_row(cap: str, limit: RateLimit | None) -> dict[str, object]:
    if limit is None:
        return {"capability": cap, "limit": None}
    return {
        "capability": cap,
        "limit": str(limit),
        "per_second": limit.per_second,
        "burst": limit.burst,
    }


@caps_app.command("limit")
@command
async def limit_cmd(
    capability: Annotated[
        str,
        typer.Argument(
            help="The capability, e.g. text.summarize.", autocompletion=complete_capability
        ),
    ],
    rate: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="Starts per period: 50/s, 600/m, 3/10s. Left out: show the limit."),
    ] = None,
    burst: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            "--burst", min=1, help="Starts allowed at once after a quiet spell (default 1)."
        ),
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the capability's limit.")] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Set, show or remove how often a capability's handlers may start, over every agent
    and process of the namespace: messages over the limit wait (in the delayed set) until
    their turn, their callers keep waiting up to their deadlines. Workers apply a change
    within a second.

    Examples: reach caps limit text.summarize 50/s;  reach caps limit llm.call 600/m
    --burst 10;  reach caps limit llm.call --clear
    """
    cap = normalize_capability(capability)
    if clear and rate is not None:
        fail("give a RATE or --clear, not both")
    if burst is not None and rate is None:
        fail("--burst goes with a RATE, e.g. reach caps limit CAP 50/s --burst 10")
    keys = Keys(namespace)
    r = await open_control(redis_url)
    try:
        if clear:
            await set_limit(r, keys, cap, None)
            new: RateLimit | None = None
        elif rate is not None:
            new = parse_limit(rate, burst=burst)
            await set_limit(r, keys, cap, new)
        else:
            new = (await get_limits(r, keys)).get(cap)
    finally:
        await r.aclose()
    if json_:
        print_json(_limit_row(cap, new))
    elif new is None:
        print(f"{cap}: no rate limit" + (" (removed)" if clear else ""))
    else:
        print(
            f"{cap}: at most {new} ({new.per_second:g} starts/s over every agent)"
            + ("; workers apply it within a second" if rate is not None else "")
        )


@caps_app.command("show")
@command
async def show_cmd(
    capability: Annotated[
        str,
        typer.Argument(
            help="The capability, e.g. text.summarize.", autocompletion=complete_capability
        ),
    ],
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show one capability: its live agents, the timeout they advertise, its rate limit,
    and the JSON Schemas of what it takes and returns (from its handler's annotations:
    docs/concepts.md, *Capability schemas*; the newest registration's when agents differ).

    Example: reach caps show text.summarize --json
    """
    cap = normalize_capability(capability)
    r = await open_control(redis_url)
    try:
        agents = [a for a in await Registry(r, namespace).agents(cap) if a.state != "evicted"]
        limit = (await get_limits(r, Keys(namespace))).get(cap)
    finally:
        await r.aclose()
    if not agents:
        fail(f"no live agent has capability {cap!r} in namespace {namespace!r} (see reach caps)")
    schemas = capability_schemas(agents, cap)
    timeout = advertised_timeout(agents, cap)
    if json_:
        print_json(
            {
                "capability": cap,
                "agents": [
                    {"agent_id": a.agent_id, "state": a.state, "routable": a.routable}
                    for a in agents
                ],
                "timeout_s": timeout,
                "limit": str(limit) if limit else None,
                "input_schema": schemas.get("input"),
                "output_schema": schemas.get("output"),
            }
        )
        return
    table(
        cap,
        ["field", "value"],
        [
            ("agents", ", ".join(f"{a.agent_id} ({a.state})" for a in agents)),
            ("routable", sum(a.routable for a in agents)),
            ("timeout", _seconds(timeout) or "(the caller's default)"),
            ("limit", str(limit) if limit else ""),
        ],
    )
    for kind in ("input", "output"):
        body = schemas.get(kind)
        print(f"{kind} schema:", json_line(body, indent=2) if body else "(none published)")


caps_app.command("split")(split)  # its own module: version canaries (reach.splits)

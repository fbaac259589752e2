"""``reach caps allow|deny|access``: who may call a capability (reach.authz).

The handlers declare it (``allow=``, ``security=``); an operator tightens it here, for the
whole namespace, and running agents apply a change within a second."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from reach.authz import (
    Declared,
    OperatorRules,
    change_rules,
    declared_of,
    read_rules,
    rules_json,
)
from reach.keys import Keys
from reach.registry import AgentInfo, Registry, normalize_capability

from .caps_cmd import caps_app
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
)
from .completion import complete_capability

ENTRIES_HELP = (
    "Entries: id:NAME (an identity, the name of its key in the trusted-keys file), "
    "role:NAME (a role that file gives, its third column), * (any verified signer)."
)

Capability = Annotated[
    str,
    typer.Argument(
        help="The capability, e.g. payments.refund.", autocompletion=complete_capability
    ),
]
Entries = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Argument(help=ENTRIES_HELP, show_default=False),
]
Clear = Annotated[bool, typer.Option("--clear", help="Empty this list of the capability.")]


def _declared(agents: list[AgentInfo], cap: str) -> Declared | None:
    """What the newest live registration of ``cap`` declares (None: none declares)."""
    live = [a for a in agents if a.state != "evicted" and cap in a.capabilities]
    for a in sorted(live, key=lambda a: a.registered_ms, reverse=True):
        d = declared_of(a.metadata, cap)
        if d is not None:
            return d
    return None


async def _change(
    kind: str, capability: str, entries: list[str] | None, clear: bool, url: str, ns: str
) -> OperatorRules:
    cap = normalize_capability(capability)
    if clear and entries:
        fail(f"give ENTRIES or --clear, not both (reach caps {kind} {cap} --clear)")
    if not clear and not entries:
        fail(f"give entries to {kind}, e.g. reach caps {kind} {cap} id:alice role:billing")
    r = await open_control(url)
    try:
        return await change_rules(r, Keys(ns), cap, kind, entries or (), clear=clear)
    finally:
        await r.aclose()


def _said(kind: str, cap: str, rules: OperatorRules, clear: bool, json_: bool) -> None:
    if json_:
        print_json({"capability": cap, "operator_allow": rules.allow, "operator_deny": rules.deny})
        return
    got = getattr(rules, kind)
    if clear:
        print(
            f"{cap}: the operator's {kind} list is empty; running agents apply it within a second"
        )
    else:
        print(
            f"{cap}: the operator's {kind} list is {', '.join(got)}; running agents apply it "
            "within a second"
        )


@caps_app.command("allow")
@command
async def allow_cmd(
    capability: Capability,
    entries: Entries = None,
    clear: Clear = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Let only these callers call a capability, on top of what its handler allows (an
    operator narrows, never widens: a caller needs both lists). Adds to the list; --clear
    empties it. Any rule makes the capability take verified (signed) callers only. Running
    agents apply a change within a second.

    Examples: reach caps allow payments.refund role:billing;  reach caps allow
    payments.refund --clear
    """
    rules = await _change("allow", capability, entries, clear, redis_url, namespace)
    _said("allow", normalize_capability(capability), rules, clear, json_)


@caps_app.command("deny")
@command
async def deny_cmd(
    capability: Capability,
    entries: Entries = None,
    clear: Clear = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Refuse these callers a capability, whatever its handler allows: their messages are
    dead-lettered `forbidden` without running and they get reach.Forbidden. Adds to the
    list; --clear empties it. `*` denies every caller (a capability switched off). Unsigned
    callers are refused too while any rule stands. Running agents apply a change within a
    second.

    Examples: reach caps deny payments.refund id:mallory;  reach caps deny payments.refund '*';
    reach caps deny payments.refund --clear
    """
    rules = await _change("deny", capability, entries, clear, redis_url, namespace)
    _said("deny", normalize_capability(capability), rules, clear, json_)


@caps_app.command("access")
@command
async def access_cmd(
    capability: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="One capability (left out: every one).", show_default=False),
    ] = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Show who may call each capability: its security level and allow list as its
    handlers declare them (the newest registration's), and the operator's allow and deny
    lists (reach caps allow / deny).

    Example: reach caps access payments.refund --json
    """
    r = await open_control(redis_url)
    try:
        reg = Registry(r, namespace)
        _, operator = await read_rules(r, Keys(namespace))
        if capability is not None:
            caps = [normalize_capability(capability)]
        else:
            caps = sorted({c for c, _ in await reg.capabilities()} | set(operator))
        rows = [
            rules_json(c, _declared(await reg.agents(c), c), operator.get(c, OperatorRules()))
            for c in caps
        ]
    finally:
        await r.aclose()
    if json_:
        print_json(rows[0] if capability is not None else rows)
        return
    table(
        f"who may call what in {namespace!r}",
        ["capability", "security", "allow (handler)", "allow (operator)", "deny (operator)"],
        [
            (
                row["capability"],
                row["security"],
                ", ".join(row["declared_allow"] or ()),
                ", ".join(row["operator_allow"]),
                ", ".join(row["operator_deny"]),
            )
            for row in rows
        ],
    )

"""``reach doctor``: check the Redis under a namespace and say what to fix."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.text import Text

from reach.acl import check_role
from reach.doctor import Finding, diagnose, worst

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    command,
    console,
    open_redis,
    print_json,
    safe_text,
)

MARK = {
    "ok": ("ok", "green"),
    "info": ("info", "cyan"),
    "warning": ("warn", "yellow"),
    "error": ("ERROR", "red"),
}


@command
async def doctor(
    acl_user: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--acl-user",
            metavar="USER",
            help="Check this ACL user's permissions (default: the user of the URL; checking "
            "needs a URL whose user may run ACL DRYRUN).",
        ),
    ] = None,
    acl_role: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--acl-role",
            metavar="ROLE",
            help="Check the ACL user against this role only: agent, caller or operator "
            "(default: every role; a user fit for one of them is fine).",
        ),
    ] = None,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Check the Redis under reach and say what to fix: version, eviction policy,
    persistence, memory headroom, replication, cluster slots, ACL permissions per role,
    clock skew, script cache, key scheme. Exit code 1 when a check finds an error.

    Example: reach doctor;  reach doctor --json
    """
    if acl_role is not None:
        check_role(acl_role)
    r = await open_redis(redis_url)
    try:
        findings = await diagnose(r, redis_url, namespace, acl_user=acl_user, acl_role=acl_role)
    finally:
        await r.aclose()
    level = worst(findings)
    if json_:
        print_json(
            {
                "redis_url": _redacted(redis_url),
                "namespace": namespace,
                "status": level,
                "findings": [f.as_dict() for f in findings],
            }
        )
    else:
        _print(findings, redis_url, namespace)
    if level == "error":
        raise typer.Exit(1)


def _redacted(url: str) -> str:
    from reach.connection import redact

    return redact(url)


def _print(findings: list[Finding], url: str, namespace: str) -> None:
    console.print(Text(f"reach doctor: {_redacted(url)}, namespace {namespace!r}"), highlight=False)
    for f in findings:
        word, color = MARK[f.level]
        line = Text()
        line.append(f"{word:>5}  ", style=color)
        line.append(f"{f.check:<17} {safe_text(f.message)}")
        console.print(line, highlight=False)
        if f.fix and f.level != "ok":
            console.print(Text(f"{'':>5}  {'':<17} fix: {safe_text(f.fix)}"), highlight=False)
    counts = {lv: sum(f.level == lv for f in findings) for lv in ("error", "warning")}
    console.print(
        Text(f"{counts['error']} error(s), {counts['warning']} warning(s)"), highlight=False
    )

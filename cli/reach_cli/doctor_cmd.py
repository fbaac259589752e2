"""``reach doctor``: check the Redis under a namespace and say what to fix."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.text import Text

from reach.acl import check_role
from reach.doctor import Finding, diagnose, worst
from reach.errors import ConfigError
from reach.tenants import Tenants

from .common import (
    DEFAULT_NS,
    DEFAULT_REDIS,
    Json,
    Namespace,
    RedisUrl,
    cli_errors,
    console,
    explain,
    fail,
    find_redis,
    open_redis,
    print_json,
    registry_url_for,
    require_text,
    run,
    safe_text,
)

MARK = {
    "ok": ("ok", "green"),
    "info": ("info", "cyan"),
    "warning": ("warn", "yellow"),
    "error": ("ERROR", "red"),
}


def doctor(
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
    all_tenants: Annotated[
        bool,
        typer.Option(
            "--all-tenants",
            help="Check the Redis and namespace of every tenant of the tenant map "
            "([tenants] in reach.toml), a section each (instead of --redis-url).",
        ),
    ] = False,
    redis_url: RedisUrl = DEFAULT_REDIS,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Check the Redis under reach and say what to fix: version, eviction policy,
    persistence, memory headroom, replication, cluster slots, ACL permissions per role,
    clock skew, script cache, key scheme. Exit code 1 when a check finds an error.

    Example: reach doctor;  reach doctor --json;  reach doctor --all-tenants
    """
    require_text({"redis_url": redis_url, "namespace": namespace, "acl_user": acl_user})
    if acl_role is not None:
        with cli_errors():
            check_role(acl_role)
    if all_tenants:
        if redis_url:
            fail("Give --all-tenants or --redis-url/--tenant, not both.")
        run(_each_tenant, acl_user, acl_role, json_)
        return
    redis_url = find_redis(redis_url)
    run(_one, acl_user, acl_role, redis_url, namespace, json_, url=redis_url)


async def _one(
    acl_user: str | None, acl_role: str | None, redis_url: str, namespace: str, json_: bool
) -> None:
    registry_url = registry_url_for(redis_url)
    findings: list[Finding] = []
    # The control plane apart (reach.planes): each Redis checked, its findings named by
    # the plane it holds.
    targets: list[tuple[str, str | None]] = [(redis_url, None)]
    if registry_url:
        targets = [(redis_url, "data"), (registry_url, "control")]
    for url, plane in targets:
        r = await open_redis(url)
        try:
            findings += await diagnose(
                r, url, namespace, acl_user=acl_user, acl_role=acl_role, plane=plane
            )
        finally:
            await r.aclose()
    level = worst(findings)
    if json_:
        out: dict[str, Any] = {"redis_url": _redacted(redis_url)}
        if registry_url:
            out["registry_url"] = _redacted(registry_url)
        out.update(namespace=namespace, status=level, findings=[f.as_dict() for f in findings])
        print_json(out)
    else:
        _print(findings, redis_url, namespace, registry_url)
    if level == "error":
        raise typer.Exit(1)


async def _each_tenant(acl_user: str | None, acl_role: str | None, json_: bool) -> None:
    """A section per entry of the tenant map (the default's Redis with the namespace the
    tenant id ``default`` gets); one Redis unreachable is that section's error."""
    found = Tenants.load()
    if found is None:
        raise ConfigError(
            "--all-tenants: no tenant map here: add [tenants.<id>] tables (redis_url, "
            "namespace) to reach.toml in this directory or a parent."
        )
    sections = []
    for tid in found.targets():
        t = found.resolve(tid)
        try:
            r = await open_redis(t.redis_url)
        except Exception as e:  # noqa: BLE001 (what explain() cannot say is shown as it is)
            why = explain(e, t.redis_url) or f"{type(e).__name__}: {e}"
            findings = [Finding("connection", "error", why, "start it or fix its URL in the map")]
        else:
            try:
                findings = await diagnose(
                    r, t.redis_url, t.namespace, acl_user=acl_user, acl_role=acl_role
                )
            finally:
                await r.aclose()
        sections.append((tid, t, findings))
    level = worst([f for _, _, fs in sections for f in fs])
    if json_:
        print_json(
            {
                "status": level,
                "tenants": [
                    {
                        "tenant": tid,
                        "redis_url": _redacted(t.redis_url),
                        "namespace": t.namespace,
                        "status": worst(fs),
                        "findings": [f.as_dict() for f in fs],
                    }
                    for tid, t, fs in sections
                ],
            }
        )
    else:
        for tid, t, fs in sections:
            console.print(Text(f"tenant {tid}"), style="bold", highlight=False)
            _print(fs, t.redis_url, t.namespace)
            console.print()
    if level == "error":
        raise typer.Exit(1)


def _redacted(url: str) -> str:
    from reach.connection import redact

    return redact(url)


def _print(
    findings: list[Finding], url: str, namespace: str, registry_url: str | None = None
) -> None:
    apart = f" (control plane on {_redacted(registry_url)})" if registry_url else ""
    console.print(
        Text(f"reach doctor: {_redacted(url)}{apart}, namespace {namespace!r}"), highlight=False
    )
    width = 17 if registry_url is None else 31  # "control plane: " before each check
    for f in findings:
        word, color = MARK[f.level]
        line = Text()
        line.append(f"{word:>5}  ", style=color)
        line.append(f"{f.check:<{width}} {safe_text(f.message)}")
        console.print(line, highlight=False)
        if f.fix and f.level != "ok":
            console.print(Text(f"{'':>5}  {'':<{width}} fix: {safe_text(f.fix)}"), highlight=False)
    counts = {lv: sum(f.level == lv for f in findings) for lv in ("error", "warning")}
    console.print(
        Text(f"{counts['error']} error(s), {counts['warning']} warning(s)"), highlight=False
    )

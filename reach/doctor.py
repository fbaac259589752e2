"""Checks of the Redis under a reach namespace, each with what to do about it.

:func:`diagnose` runs every check (``reach doctor``); :func:`risks` only the two a process
should warn about when it starts (eviction and persistence), and :func:`warn_once` logs
those once per process and Redis (``reach.Client`` and ``reach.Agent`` call it).

Every check reads; nothing here writes to Redis. A check that the user may not run (a
managed Redis refusing ``CONFIG``, a user without ``ACL``) says so and what to grant,
instead of failing the whole run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import anyio
from redis import exceptions as rexc

from .acl import key_patterns, role_probes
from .clock import skew_s
from .connection import AnyRedis, connect, is_cluster, is_sentinel_url, redact
from .embedded import THROWAWAY_PREFIX
from .keys import KEY_SCHEME, Keys, form_of, scan_patterns
from .scripts import all_scripts

log = logging.getLogger("reach.doctor")

Level = Literal["ok", "info", "warning", "error"]
LEVELS: tuple[Level, ...] = ("ok", "info", "warning", "error")

MIN_VERSION = (7, 0)
SKEW_WARN_S = 0.2
SKEW_ERROR_S = 2.0
HEADROOM_WARN = 0.75
HEADROOM_ERROR = 0.90

RESTART_LOSES = (
    "queued messages (inboxes, retries, parked), idempotency records (a handler may run "
    "again), task status, dead letters, reply streams, and the registry (agents "
    "re-register on their next heartbeat)"
)
PERSISTENCE_FIX = (
    "CONFIG SET appendonly yes; CONFIG SET appendfsync everysec; CONFIG REWRITE (or "
    "`appendonly yes` and `appendfsync everysec` in redis.conf); see docs/operations.md"
)
EVICTION_FIX = (
    "CONFIG SET maxmemory-policy noeviction; CONFIG REWRITE (or `maxmemory-policy "
    "noeviction` in redis.conf): at the memory limit Redis then refuses writes (senders "
    "get an error) instead of deleting data"
)


@dataclass(frozen=True)
class Finding:
    """One check's outcome: ``level`` ok / info / warning / error, what was found, and
    (unless ok) what to do about it."""

    check: str
    level: Level
    message: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def worst(findings: Sequence[Finding]) -> Level:
    return max((f.level for f in findings), key=LEVELS.index, default="ok")


# -- helpers --------------------------------------------------------------------------------
def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


async def _each(r: AnyRedis, *args: Any) -> list[tuple[str, Any]]:
    """``args`` run on every server that holds data: the one server, or each primary of a
    cluster; (server name, reply) pairs."""
    if is_cluster(r):
        out = []
        for node in r.get_primaries():  # type: ignore[attr-defined]
            out.append((node.name, await r.execute_command(*args, target_nodes=node)))
        return out
    return [("", await r.execute_command(*args))]


def _at(name: str) -> str:
    return f" ({name})" if name else ""


async def _info(r: AnyRedis, section: str) -> list[tuple[str, dict[str, Any]]]:
    return [(n, dict(v)) for n, v in await _each(r, "INFO", section)]


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, rexc.NoPermissionError) or (
        isinstance(exc, rexc.ResponseError)
        and any(s in str(exc).lower() for s in ("unknown command", "noperm", "no permissions"))
    )


# -- the checks ----------------------------------------------------------------------------
async def check_version(r: AnyRedis) -> list[Finding]:
    out = []
    for name, info in await _info(r, "server"):
        server = "valkey" if "valkey_version" in info else "redis"
        ver = _text(info.get("valkey_version") or info.get("redis_version", "0"))
        nums = tuple(int(x) for x in re.findall(r"\d+", ver)[:2]) or (0,)
        if server == "valkey" or nums >= MIN_VERSION:
            out.append(Finding("version", "ok", f"{server} {ver}{_at(name)}"))
        else:
            out.append(
                Finding(
                    "version",
                    "error",
                    f"{server} {ver}{_at(name)}: reach needs Redis >= 7.0 (streams, "
                    "scripts and the counters it uses)",
                    "upgrade to Redis >= 7.0 or Valkey >= 7.2",
                )
            )
    return out


async def check_eviction(r: AnyRedis) -> list[Finding]:
    out = []
    for name, info in await _info(r, "memory"):
        policy = _text(info.get("maxmemory_policy", "?"))
        if policy == "noeviction":
            out.append(Finding("maxmemory-policy", "ok", f"noeviction{_at(name)}"))
        else:
            out.append(
                Finding(
                    "maxmemory-policy",
                    "error",
                    f"maxmemory-policy is {policy}{_at(name)}: at the memory limit Redis "
                    "deletes keys, and inboxes, idempotency records and dead letters go "
                    "with them, silently",
                    EVICTION_FIX,
                )
            )
    return out


async def check_persistence(r: AnyRedis) -> list[Finding]:
    out = []
    for name, info in await _info(r, "persistence"):
        if int(info.get("aof_enabled", 0) or 0):
            out.append(Finding("persistence", "ok", f"AOF on{_at(name)}"))
            continue
        save: str | None = None
        try:
            reply = await _each(r, "CONFIG", "GET", "save")
            vals = dict(reply)[name] if name else reply[0][1]
            if isinstance(vals, dict):
                save = _text(next(iter(vals.values()), ""))
            elif isinstance(vals, (list, tuple)) and len(vals) >= 2:
                save = _text(vals[1])
        except rexc.ResponseError as e:
            if not _refused(e):
                raise
        if save is None:
            what = "AOF off, RDB snapshots unknown (CONFIG GET refused)"
            loses = f"a restart loses at least what was written since the last snapshot: {RESTART_LOSES}"
        elif save.strip():
            what = f"AOF off, RDB snapshots only (save {save})"
            changes = info.get("rdb_changes_since_last_save", "?")
            loses = (
                f"a restart loses everything written since the last snapshot ({changes} "
                f"changes now): {RESTART_LOSES}"
            )
        else:
            what = "no persistence (AOF off, no RDB snapshots)"
            loses = f"a restart loses everything: {RESTART_LOSES}"
        out.append(
            Finding("persistence", "warning", f"{what}{_at(name)}: {loses}", PERSISTENCE_FIX)
        )
    return out


async def check_memory(r: AnyRedis) -> list[Finding]:
    out = []
    for name, info in await _info(r, "memory"):
        used = int(info.get("used_memory", 0) or 0)
        limit = int(info.get("maxmemory", 0) or 0)
        if not limit:
            out.append(
                Finding(
                    "maxmemory",
                    "info",
                    f"no maxmemory{_at(name)} ({used / 2**20:.1f} MiB used): Redis may grow "
                    "until the machine runs out of memory",
                    "set maxmemory below the machine's memory (with noeviction) and alert on "
                    "used_memory well before it",
                )
            )
            continue
        share = used / limit
        level: Level = (
            "error" if share >= HEADROOM_ERROR else "warning" if share >= HEADROOM_WARN else "ok"
        )
        out.append(
            Finding(
                "maxmemory",
                level,
                f"{used / 2**20:.1f} MiB of {limit / 2**20:.1f} MiB used ({share:.0%}){_at(name)}",
                ""
                if level == "ok"
                else "raise maxmemory, drain the queues (reach queues, reach dlq purge) or add "
                "memory; at the limit writes are refused",
            )
        )
    return out


async def check_topology(r: AnyRedis, url: str) -> list[Finding]:
    out = []
    via = " via Sentinel" if is_sentinel_url(url) else ""
    for name, info in await _info(r, "replication"):
        role = _text(info.get("role", "?"))
        if role != "master":
            out.append(
                Finding(
                    "topology",
                    "error",
                    f"the server{_at(name)} is a {role}: writes are refused",
                    "point the URL at the primary, or use a redis+sentinel:// URL",
                )
            )
            continue
        n = int(info.get("connected_slaves", 0) or 0)
        if not n:
            out.append(
                Finding(
                    "topology",
                    "info",
                    f"primary{via}{_at(name)} without replicas: losing the machine loses the data",
                    "for production, add a replica and Sentinel (compose/ has a sentinel "
                    "profile), or accept it for development",
                )
            )
            continue
        lags = [
            int(v.get("lag", 0))
            for k, v in info.items()
            if k.startswith("slave") and isinstance(v, dict)
        ]
        lag = max(lags, default=0)
        out.append(
            Finding(
                "topology",
                "warning" if lag > 1 else "ok",
                f"primary{via}{_at(name)} with {n} replica(s), largest lag {lag} s",
                ""
                if lag <= 1
                else "a failover now would lose the writes of the last seconds: see "
                "docs/operations.md, 'What a failover can lose'",
            )
        )
    return out


async def check_cluster(r: AnyRedis) -> list[Finding]:
    if not is_cluster(r):
        return [Finding("cluster", "ok", "not a cluster")]
    # redis-py cannot route CLUSTER INFO by itself (it has no key): ask one primary
    node = r.get_primaries()[0]  # type: ignore[attr-defined]
    raw = await r.execute_command("CLUSTER", "INFO", target_nodes=node)
    info: dict[str, str] = {}
    text = raw if isinstance(raw, (str, bytes)) else next(iter(dict(raw).values()), "")
    for line in _text(text).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info[k.strip()] = v.strip()
    state = info.get("cluster_state", "?")
    assigned = int(info.get("cluster_slots_assigned", 0))
    bad = int(info.get("cluster_slots_pfail", 0)) + int(info.get("cluster_slots_fail", 0))
    if state == "ok" and assigned == 16384 and not bad:
        return [
            Finding(
                "cluster",
                "ok",
                f"all 16384 slots covered, state ok ({info.get('cluster_known_nodes', '?')} nodes)",
            )
        ]
    return [
        Finding(
            "cluster",
            "error",
            f"cluster state {state}: {assigned}/16384 slots assigned, {bad} failing: keys of "
            "uncovered slots (whole inboxes, a namespace's registry) cannot be read or written",
            "assign every slot (redis-cli --cluster fix HOST:PORT) and bring failed nodes back",
        )
    ]


async def check_acl(
    r: AnyRedis,
    keys: Keys,
    user: str | None = None,
    url: str = "",
    *,
    role: str | None = None,
) -> list[Finding]:
    """Whether ``user`` (default: the URL's) may run what each role runs (``role``: that
    one only), by ``ACL DRYRUN`` of the commands :mod:`reach.acl` grants. A user made for
    one role (``reach acl --role``) is fine when it passes that role: the roles it fails
    are info then, errors only when it can play no role."""
    try:
        who = user or _text((await _each(r, "ACL", "WHOAMI"))[0][1])
    except rexc.ResponseError as e:
        if not _refused(e):
            raise
        who = user or unquote(urlsplit(url).username or "") or "default"
    lacking: dict[str, list[str]] = {}
    for name, probes in role_probes(keys).items():
        if role is not None and name != role:
            continue
        missing: list[str] = []
        for command, call in probes:
            try:
                # ACL users are per server: on a Cluster, every primary must have this one
                replies = await _each(r, "ACL", "DRYRUN", who, *call)
                reply = next((_text(v) for _, v in replies if _text(v) != "OK"), "OK")
            except rexc.ResponseError as e:
                if "not found" in str(e).lower():
                    return [
                        Finding(
                            "acl",
                            "error",
                            f"user {who!r} does not exist on every server ({e})",
                            "run the user's ACL SETUSER line (reach acl) on every server, "
                            "every Cluster node included, and keep it in each one's ACL file",
                        )
                    ]
                if _refused(e):
                    return [
                        Finding(
                            "acl",
                            "info",
                            f"cannot check the permissions of user {who!r}: this user may not "
                            f"run ACL DRYRUN ({e})",
                            "run reach doctor with an admin user's URL and --acl-user "
                            f"{who if who != '?' else 'NAME'}",
                        )
                    ]
                raise
            if reply != "OK":
                if "key" in reply.lower():
                    command = f"keys of namespace {keys.namespace!r}"
                if command not in missing:
                    missing.append(command)
        lacking[name] = missing
    fits = [n for n, m in lacking.items() if not m]
    out: list[Finding] = []
    for name, missing in lacking.items():
        if not missing:
            out.append(Finding("acl", "ok", f"user {who!r} may run what {_as(name)} runs"))
            continue
        grant = " ".join(_grant(m, keys) for m in missing)
        out.append(
            Finding(
                "acl",
                "info" if fits else "error",
                f"user {who!r} lacks, as {_as(name)}: {', '.join(_shown(m) for m in missing)}",
                f"ACL SETUSER {who} {grant} (or the user `reach acl --namespace "
                f"{keys.namespace} --role {name}` prints; docs/security.md)",
            )
        )
    return out


def _shown(missing: str) -> str:
    return missing if missing.startswith("keys of") else missing.upper()


def _as(role: str) -> str:
    return {"agent": "an agent (worker)", "caller": "a caller (client)"}.get(role, f"an {role}")


def _grant(missing: str, keys: Keys) -> str:
    if missing.startswith("keys of"):
        return " ".join(f"~{p}" for p in key_patterns(keys.namespace))
    return "+" + missing


async def check_clock(r: AnyRedis) -> list[Finding]:
    out = []
    for name, reply in await _each(r, "TIME"):
        t1 = time.time()
        # the reply was made within the round trip, whose start this loop does not know:
        # taken at its end (the runtimes' own measurement, reach.clock, knows both ends)
        skew = skew_s(reply, t1, t1)
        level: Level = (
            "error"
            if abs(skew) >= SKEW_ERROR_S
            else "warning"
            if abs(skew) >= SKEW_WARN_S
            else "ok"
        )
        out.append(
            Finding(
                "clock",
                level,
                f"Redis's clock{_at(name)} is {skew * 1000:+.0f} ms from this host's",
                ""
                if level == "ok"
                else "sync both clocks (NTP: chrony or systemd-timesyncd): leases and "
                "deadlines compare times taken on different machines",
            )
        )
    return out


async def check_scripts(r: AnyRedis) -> list[Finding]:
    scripts = all_scripts()
    out = []
    for name, reply in await _each(r, "SCRIPT", "EXISTS", *(s.sha for s in scripts)):
        loaded = sum(int(x) for x in reply)
        out.append(
            Finding(
                "script cache",
                "ok" if loaded else "info",
                f"{loaded} of reach's {len(scripts)} scripts loaded{_at(name)}"
                + (
                    ""
                    if loaded
                    else ": none yet (normal before first use, after a restart "
                    "or a failover; reach loads them on NOSCRIPT)"
                ),
                "" if loaded else "nothing to do; SCRIPT FLUSH by others only costs a reload",
            )
        )
    return out


async def check_key_scheme(
    r: AnyRedis, keys: Keys, *, max_keys: int = 10_000, plane: str | None = None
) -> list[Finding]:
    """Whether every key under the namespace's prefixes has a form of
    :data:`reach.keys.LAYOUT` (the one list of the keys reach writes). ``plane`` (the
    namespace keeps its control plane apart, reach.planes): the plane this Redis holds;
    keys of the other plane found here are a warning (a process that does not know the
    split wrote them)."""
    seen = 0
    odd: list[str] = []
    by_plane: dict[str, int] = {}
    astray: list[str] = []
    for match in scan_patterns(keys.namespace):
        async for k in r.scan_iter(match=match, count=1000):
            seen += 1
            key = _text(k)
            form = form_of(key, keys.namespace)
            if form is None and len(odd) < 5:
                odd.append(key)
            if form is not None:
                by_plane[form.plane] = by_plane.get(form.plane, 0) + 1
                if plane is not None and form.plane != plane and len(astray) < 5:
                    astray.append(key)
            if seen >= max_keys:
                break
        if seen >= max_keys:
            break
    out: list[Finding] = []
    if astray:
        other = "data" if plane == "control" else "control"
        out.append(
            Finding(
                "planes",
                "warning",
                f"keys of the {other} plane on the {plane} plane's Redis: {', '.join(astray)}",
                "give every worker, client and CLI of the namespace the same registry_url "
                "(--registry-url, REACH_REGISTRY_URL or reach.toml); docs/operations.md, "
                "The control plane apart",
            )
        )
    if seen and not odd:
        planes = ", ".join(f"{n} {p}" for p, n in sorted(by_plane.items()))
        out.append(Finding("planes", "ok", f"keys of {keys.namespace!r} by plane: {planes}"))
    return out + _scheme_findings(keys, seen, odd, max_keys)


def _scheme_findings(keys: Keys, seen: int, odd: list[str], max_keys: int) -> list[Finding]:
    if not seen:
        return [
            Finding(
                "key scheme",
                "info",
                f"namespace {keys.namespace!r} has no keys yet (key scheme {KEY_SCHEME})",
                "nothing to do, unless you expected agents here: check --namespace",
            )
        ]
    if odd:
        return [
            Finding(
                "key scheme",
                "warning",
                f"keys of namespace {keys.namespace!r} that key scheme {KEY_SCHEME} does not "
                f"know: {', '.join(odd)}",
                "run workers, clients and the CLI of one reach version; see docs/protocol.md "
                "for the key scheme",
            )
        ]
    return [
        Finding(
            "key scheme",
            "ok",
            f"{seen}{'+' if seen >= max_keys else ''} keys of {keys.namespace!r} follow key "
            f"scheme {KEY_SCHEME}",
        )
    ]


async def diagnose(
    r: AnyRedis,
    url: str,
    namespace: str,
    *,
    acl_user: str | None = None,
    acl_role: str | None = None,
    plane: str | None = None,
) -> list[Finding]:
    """Every check, in order; a check that fails to run is an error finding of its own.
    ``plane`` (``control`` or ``data``: the namespace keeps its control plane apart): the
    plane this Redis holds, named in every finding, and checked against its keys."""
    keys = Keys(namespace)
    checks: list[tuple[str, Any]] = [
        ("version", check_version(r)),
        ("maxmemory-policy", check_eviction(r)),
        ("persistence", check_persistence(r)),
        ("maxmemory", check_memory(r)),
        ("topology", check_topology(r, url)),
        ("cluster", check_cluster(r)),
        ("acl", check_acl(r, keys, acl_user, url, role=acl_role)),
        ("clock", check_clock(r)),
        ("script cache", check_scripts(r)),
        ("key scheme", check_key_scheme(r, keys, plane=plane)),
    ]
    out: list[Finding] = []
    for name, coro in checks:
        try:
            out.extend(await coro)
        except (rexc.RedisError, rexc.RedisClusterException, OSError, ValueError, TypeError) as e:
            fix = (
                "grant the command to the user in the Redis URL"
                if _refused(e)
                else "see the message; run reach doctor again"
            )
            out.append(
                Finding(name, "error", f"the check could not run: {type(e).__name__}: {e}", fix)
            )
    if plane is not None:
        out = [dataclasses.replace(f, check=f"{plane} plane: {f.check}") for f in out]
    return out


# -- the warnings a process logs when it starts --------------------------------------------
async def risks(r: AnyRedis) -> list[Finding]:
    """The findings a process warns about at start: eviction, and persistence unless the
    server is a throwaway embedded one (`reach demo`'s: without persistence by design)."""
    found = [*await check_eviction(r)]
    if not await _throwaway(r):
        found += await check_persistence(r)
    return [f for f in found if f.level in ("warning", "error")]


async def _throwaway(r: AnyRedis) -> bool:
    """True when the server runs in a throwaway embedded data directory."""
    try:
        replies = await _each(r, "CONFIG", "GET", "dir")
    except Exception:  # noqa: BLE001 - CONFIG refused (ACL, a managed Redis): not known
        return False
    for _, reply in replies:
        pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
        for _key, value in pairs:
            name = os.path.basename(_text(value).rstrip("/"))
            if not name.startswith(THROWAWAY_PREFIX):
                return False
    return bool(replies)


_warned: set[str] = set()


async def warn_once(url: str, r: AnyRedis | None = None, *, timeout_s: float = 3.0) -> None:
    """Log :func:`risks` of the Redis at ``url`` as warnings, once per process and URL.
    Never raises: a Redis that cannot be asked is the caller's own error to meet."""
    if url in _warned:
        return
    _warned.add(url)
    own = r is None
    try:
        with anyio.move_on_after(timeout_s):
            if r is None:
                r = await connect(url)
            for f in await risks(r):
                log.warning("Redis at %s: %s. Fix: %s", redact(url), f.message, f.fix)
    except Exception as e:  # noqa: BLE001 - a warning must never stop a start
        log.debug("could not check the Redis at %s for risks: %s", redact(url), e)
    finally:
        if own and r is not None:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await r.aclose()

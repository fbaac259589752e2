"""The report of a chaos run: what was measured, what was checked, and its text form."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class KillRecord:
    """One worker SIGKILL: when, what it held, what became of it, and how fast its
    messages completed elsewhere (or after its restart)."""

    agent_id: str
    at_s: float  # since the start of sending
    kill_ms: int
    mid_handler: bool  # it had unsettled (pending) entries when killed
    inbox: int  # messages in its inbox at the kill (pending + unread)
    fate: str  # restart_quick | restart_after_eviction | never (replaced)
    back_after_s: float | None  # restart / replacement delay
    recovery_s: float | None = None  # kill -> last of those messages completed
    completed_by_same_id: int = 0  # of those, finished by its restarted self (resumed)
    completed_by_others: int = 0  # ... by other agents (the sweeper moved them)
    slowest_key: str = ""  # the last of them to complete (see `reach task`, the AOF...)


@dataclass
class ChaosReport:
    """What one run measured and checked; ``ok`` is False when any invariant failed
    (``violations`` says which)."""

    ok: bool
    violations: list[str]
    config: dict[str, Any]
    messages: int
    requests: int
    sends: int
    keys: int
    sent_twice: int
    deliveries: int  # msg_ids that reached an inbox (first sends and caller retries)
    kills: int
    kills_mid_handler: int
    restarts: int  # same agent_id
    never_back: int
    replacements: int
    stops: int
    redis_restarts: int
    redis_outage_s: list[float]
    redis_restart_at_s: list[float]  # since sending started
    lost: int
    duplicate_side_effects: int
    effects: int
    re_executions: int  # keys whose handler ran to its side effect more than once
    handler_restarts: int  # keys whose handler was started more than once (claims > 1)
    runs: int
    overlapping_runs: int  # two live workers in one key at once (a violation)
    zombie_runs: int  # overlaps where one run's worker was paused or evicted (fenced)
    evictions: int  # registry evictions (killed workers, the paused one, Redis outages)
    fenced_late_completions: int
    caller_errors: dict[str, int]
    untyped_errors: dict[str, int]
    wrong_results: int
    callers_gave_up: int
    not_succeeded: dict[str, int]  # task status of delivered msg_ids other than succeeded
    pending_left: int
    inbox_entries_left: int
    parked_left: int
    delayed_left: int
    reroute_left: int
    dead_letters: dict[str, int]  # by reason: attempts whose caller got a typed error
    dead_letters_unaccounted: int  # ... and any whose caller was never told (a violation)
    recovery_p50_s: float | None
    recovery_p99_s: float | None
    recovery_max_s: float | None
    recovery_target_s: float  # the target at test settings
    recovery_bound_s: float  # lease + evict_after + one sweep interval, as configured
    recovery_by_fate: dict[str, dict[str, float]]
    stop_recovery_s: list[float]
    send_phase_s: float
    quiet_s: float
    wall_s: float
    data_dir: str | None
    kill_log: list[dict[str, Any]] = field(default_factory=list)
    log_markers: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def format_report(r: ChaosReport) -> str:
    """The report as the aligned text `reach chaos` prints: one row per figure, then one
    line per violated invariant."""

    def sec(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} s"

    fates = Counter(k["fate"] for k in r.kill_log)
    inboxes = [k["inbox"] for k in r.kill_log]
    med = statistics.median(inboxes) if inboxes else 0
    errs = ", ".join(f"{k} {v}" for k, v in sorted(r.caller_errors.items())) or "none"
    by_fate = "; ".join(
        f"{f}: n={d['n']:.0f} p50 {d['p50']:.2f} s max {d['max']:.2f} s"
        for f, d in r.recovery_by_fate.items()
    )
    rows = [
        ("result", "PASS" if r.ok else "FAIL"),
        (
            "messages",
            (
                f"{r.messages} ({r.requests} requests, {r.sends} sends; {r.keys} keys, "
                f"{r.sent_twice} sent twice under one key)"
            ),
        ),
        ("deliveries", f"{r.deliveries} msg_ids reached an inbox (caller retries included)"),
        (
            "worker SIGKILLs",
            (
                f"{r.kills} ({r.kills_mid_handler} mid-handler; "
                f"{fates['restart_quick']} restarted at once, "
                f"{fates['restart_after_eviction']} restarted after eviction, "
                f"{fates['never']} never back)"
            ),
        ),
        ("messages in its inbox", f"at each kill: median {med:g}, max {max(inboxes, default=0)}"),
        ("restarts (same id)", str(r.restarts)),
        ("replacements", f"{r.replacements} (new agent ids for the ones never back)"),
        (
            "SIGSTOP/SIGCONT",
            (
                f"{r.stops} (stop recovery: "
                f"{', '.join(f'{x:.2f} s' for x in r.stop_recovery_s) or '-'})"
            ),
        ),
        (
            "Redis restarts",
            (
                f"{r.redis_restarts} (SIGKILL + AOF restart, outage "
                f"{', '.join(f'{x:.2f} s' for x in r.redis_outage_s) or '-'})"
            ),
        ),
        ("lost", str(r.lost)),
        (
            "duplicate side effects",
            (f"{r.duplicate_side_effects} ({r.effects} effects for {r.keys} keys)"),
        ),
        (
            "re-executions",
            (
                f"{r.re_executions} keys ran to their side effect more than once "
                f"({r.runs} runs in all); {r.handler_restarts} keys' handlers started "
                "more than once (killed mid-run, run again)"
            ),
        ),
        (
            "overlapping runs",
            (
                f"{r.overlapping_runs} by live workers; {r.zombie_runs} with a "
                "paused or evicted worker (its completion fenced)"
            ),
        ),
        ("evictions", f"{r.evictions} (killed workers, the paused one, Redis outages)"),
        ("fenced late completions", str(r.fenced_late_completions)),
        ("caller errors (typed)", f"{errs} — each retried under its key until answered"),
        ("untyped errors", str(sum(r.untyped_errors.values()))),
        ("wrong results", str(r.wrong_results)),
        ("callers without result", str(r.callers_gave_up)),
        ("pending left", str(r.pending_left)),
        ("inbox/parked/delayed left", f"{r.inbox_entries_left}/{r.parked_left}/{r.delayed_left}"),
        (
            "dead letters",
            (
                f"{sum(r.dead_letters.values())} ("
                + "".join(f"{k} {v}, " for k, v in sorted(r.dead_letters.items()))
                + f"{r.dead_letters_unaccounted} whose caller was not told)"
            ),
        ),
        (
            "recovery after a kill",
            (
                f"p50 {sec(r.recovery_p50_s)}, p99 {sec(r.recovery_p99_s)}, "
                f"max {sec(r.recovery_max_s)} (target <= "
                f"{r.recovery_target_s:.1f} s; lease + evict_after + sweep = "
                f"{r.recovery_bound_s:.1f} s)"
            ),
        ),
        ("  by fate", by_fate or "-"),
        (
            "  completed by",
            (
                f"{sum(k['completed_by_same_id'] for k in r.kill_log)} messages by "
                f"the restarted agent (same id), "
                f"{sum(k['completed_by_others'] for k in r.kill_log)} by other agents"
            ),
        ),
        (
            "wall time",
            (f"{r.wall_s:.1f} s (sending {r.send_phase_s:.0f} s, quiet {r.quiet_s:.2f} s)"),
        ),
    ]
    w = max(len(a) for a, _ in rows)
    lines = [f"{a:<{w}}  {b}" for a, b in rows]
    lines += [f"VIOLATION: {x}" for x in r.violations]
    if not r.ok:
        lines.append(f"data and worker logs kept in {r.data_dir}")
    return "\n".join(lines)

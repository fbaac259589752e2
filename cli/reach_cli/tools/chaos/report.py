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
    scenario: str = "crash"

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


# -- the rolling-deploy scenario ------------------------------------------------------------
@dataclass
class DrainRecord:
    """One worker replaced: its successor was started and ready, then it got SIGTERM; what
    it held then, and how its drain ended."""

    agent_id: str
    pid: int
    replaced_by: str
    round: int
    at_s: float  # since the load started
    sigterm_ms: int
    mid_handler: bool  # it had unsettled (pending) entries at the SIGTERM
    inbox: int  # messages in its inbox at the SIGTERM (pending + unread)
    exit_code: int | None = None  # None: it had not exited by the end of the run
    drain_s: float | None = None  # SIGTERM -> process exit
    runs_in_flight: int = 0  # handler runs of its pid going on at the SIGTERM
    longest_left_s: float = 0.0  # of those, the longest time still to run after it


@dataclass
class DeployReport:
    """What one rolling-deploy run measured and checked; ``ok`` is False when any pass
    criterion failed (``violations`` says which, with examples)."""

    ok: bool
    violations: list[str]
    scenario: str
    config: dict[str, Any]
    messages: int
    requests: int
    sends: int
    streams: int
    keys: int
    sent_twice: int
    deliveries: int
    replacements: int  # SIGTERMs, each after the successor was ready
    sigterms_mid_handler: int
    runs_in_flight_at_sigterm: int
    runs_started_after_sigterm: int  # by a worker after its own SIGTERM (read ahead)
    latest_start_after_sigterm_s: float  # ... the latest of them, after the SIGTERM
    drain_p50_s: float | None
    drain_max_s: float | None
    drain_exit_codes: dict[str, int]  # exit code (or "running") -> workers
    kills: int
    kills_mid_handler: int
    redis_restarts: int
    redis_outage_s: list[float]
    redis_restart_at_s: list[float]
    lost: int  # keys not done and succeeded, or without their side effect
    effects: int
    duplicate_side_effects: int
    runs: int  # handler runs started (the ledger's count)
    keys_run_more_than_once: int
    runs_cut_by_kill: int  # runs whose worker was SIGKILLed while they ran (re-run: fine)
    runs_failed: dict[str, int]  # runs ended by an exception (retried: fine), by its name
    runs_cancelled_by_drain: int  # runs cancelled after their worker's SIGTERM
    runs_again_after_redis_outage: int  # extra runs: the first ended while Redis was away
    runs_again_after_outage_in_drain: int  # ... of those, on a worker that was draining
    unexplained_runs: int  # a key's runs besides its completing one, not cut by a SIGKILL
    keys_completed_twice: int  # keys whose handler ran to its end more than once
    unfinished_runs: int  # runs that never ended, their worker not SIGKILLed
    overlapping_runs: int  # two runs of one message at once
    evictions: int
    fenced_late_completions: int
    callers_answered: int
    answered_first_try: int
    caller_errors: dict[str, int]
    deadline_exceeded: int
    untyped_errors: dict[str, int]
    wrong_results: int
    streams_chunks_wrong: int  # streams whose chunks were not 0..n-1, each once, in order
    callers_gave_up: int
    not_succeeded: dict[str, int]
    pending_left: int
    inbox_entries_left: int
    parked_left: int
    delayed_left: int
    reroute_left: int
    dead_letters: dict[str, int]
    dead_letters_unaccounted: int
    recovery_p50_s: float | None  # after a SIGKILL: until its inbox's messages completed
    recovery_max_s: float | None
    load_avg_max_1m: float  # the machine's load average, sampled during the run
    load_avg_end: list[float]  # 1, 5 and 15 minutes, at the end
    load_s: float  # how long the load ran
    quiet_s: float
    wall_s: float
    data_dir: str | None
    drain_log: list[dict[str, Any]] = field(default_factory=list)
    kill_log: list[dict[str, Any]] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)  # per violation kind
    log_markers: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def format_deploy_report(r: DeployReport) -> str:
    """The rolling-deploy report as aligned text: the pass criteria first, then the
    figures, then one line per violated criterion."""

    def sec(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} s"

    def ok(good: bool) -> str:
        return "ok" if good else "FAILED"

    errs = ", ".join(f"{k} {v}" for k, v in sorted(r.caller_errors.items())) or "none"
    codes = ", ".join(f"{k}: {v}" for k, v in sorted(r.drain_exit_codes.items())) or "-"
    fates = Counter(k["fate"] for k in r.kill_log)
    calls = r.requests + r.streams + r.sends
    once = not (
        r.unexplained_runs
        or r.unfinished_runs
        or r.runs_cancelled_by_drain
        or r.runs_again_after_redis_outage
    )
    rows = [
        ("result", "PASS" if r.ok else "FAIL"),
        (
            "0 lost",
            (
                f"{ok(r.lost == 0 and not r.not_succeeded)}: {r.lost} lost "
                f"({r.effects} side effects for {r.keys} keys)"
            ),
        ),
        (
            "every caller answered",
            (
                f"{ok(r.callers_gave_up == 0 and r.deadline_exceeded == 0 and not r.wrong_results)}:"
                f" {r.callers_answered} of {calls} ({r.answered_first_try} at the first try; "
                f"{r.deadline_exceeded} DeadlineExceeded, {r.wrong_results} wrong results, "
                f"{r.streams_chunks_wrong} streams with wrong chunks)"
            ),
        ),
        (
            "each key's handler run once",
            (
                f"{ok(once)}: {r.runs} runs for "
                f"{r.keys} keys; {r.unexplained_runs} run again for no reason, "
                f"{r.runs_again_after_redis_outage} run again after ending while Redis was away "
                f"({r.runs_again_after_outage_in_drain} in a drain), "
                f"{r.runs_cut_by_kill} cut by a SIGKILL and run again, "
                f"{sum(r.runs_failed.values())} failed and retried "
                f"({', '.join(f'{k} {v}' for k, v in sorted(r.runs_failed.items())) or '-'}), "
                f"{r.runs_cancelled_by_drain} "
                f"cancelled by a drain, {r.keys_completed_twice} "
                f"keys ran to their end twice, {r.unfinished_runs} runs never ended"
            ),
        ),
        (
            "no message on two agents at once",
            f"{ok(r.overlapping_runs == 0)}: {r.overlapping_runs} overlapping runs",
        ),
        (
            "messages",
            (
                f"{r.messages} ({r.requests} requests, {r.streams} streams, {r.sends} sends; "
                f"{r.keys} keys, {r.sent_twice} sent twice under one key) over {r.load_s:.0f} s"
            ),
        ),
        ("deliveries", f"{r.deliveries} msg_ids reached an inbox (caller retries included)"),
        (
            "replaced by SIGTERM",
            (
                f"{r.replacements} workers, each after its successor was ready "
                f"({r.sigterms_mid_handler} with entries in flight, {r.runs_in_flight_at_sigterm} "
                f"handler runs going on at their SIGTERM, {r.runs_started_after_sigterm} started "
                f"after it, the latest {r.latest_start_after_sigterm_s:.3f} s after)"
            ),
        ),
        (
            "drain (SIGTERM to exit)",
            f"p50 {sec(r.drain_p50_s)}, max {sec(r.drain_max_s)}; exit codes {codes}",
        ),
        (
            "worker SIGKILLs",
            (
                f"{r.kills} ({r.kills_mid_handler} mid-handler; {fates['same_id']} restarted with "
                f"their id, {fates['new_id']} replaced by a new id); recovery p50 "
                f"{sec(r.recovery_p50_s)}, max {sec(r.recovery_max_s)}"
            ),
        ),
        (
            "Redis restarts",
            (
                f"{r.redis_restarts} (SIGKILL + AOF restart, outage "
                f"{', '.join(f'{x:.2f} s' for x in r.redis_outage_s) or '-'})"
            ),
        ),
        ("evictions", f"{r.evictions}; fenced late completions {r.fenced_late_completions}"),
        ("caller errors (typed)", f"{errs} — each retried under its key until answered"),
        ("untyped errors", str(sum(r.untyped_errors.values()))),
        ("pending left", str(r.pending_left)),
        ("inbox/parked/delayed left", f"{r.inbox_entries_left}/{r.parked_left}/{r.delayed_left}"),
        (
            "dead letters",
            f"{sum(r.dead_letters.values())} ("
            + "".join(f"{k} {v}, " for k, v in sorted(r.dead_letters.items()))
            + f"{r.dead_letters_unaccounted} whose caller was not told)",
        ),
        (
            "load average",
            f"max {r.load_avg_max_1m:.2f} (1 min) during the run; at the end "
            + " / ".join(f"{x:.2f}" for x in r.load_avg_end),
        ),
        ("wall time", f"{r.wall_s:.1f} s (load {r.load_s:.0f} s, quiet {r.quiet_s:.2f} s)"),
    ]
    w = max(len(a) for a, _ in rows)
    lines = [f"{a:<{w}}  {b}" for a, b in rows]
    lines += [f"VIOLATION: {x}" for x in r.violations]
    if not r.ok:
        lines.append(f"data and worker logs kept in {r.data_dir}")
    return "\n".join(lines)

"""The command line of the chaos run (``reach chaos`` and ``bench/chaos.py``).

Options are parsed with argparse rather than typer so that both entry points share one
parser: ``reach chaos`` hands its arguments over untouched (``reach chaos --help`` lists
them).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from .agent import DEFAULT_AGENT, DEPLOY_AGENT
from .deploy import SCENARIO, run_deploy
from .harness import run_chaos
from .plan import ChaosConfig, DeployConfig
from .report import ChaosReport, DeployReport, format_deploy_report, format_report

SCENARIOS = ("crash", SCENARIO)

# Options whose default depends on the scenario: (crash, rolling-deploy). The crash
# defaults are those of a medium run (``--short``: the CI run, ChaosConfig's defaults);
# the rolling-deploy ones are DeployConfig's (``--short``: DeployConfig.short()).
_D = DeployConfig()
_C = ChaosConfig()
_BY_SCENARIO: dict[str, tuple[Any, Any]] = {
    "messages": (2000, None),
    "workers": (4, _D.workers),
    "kills": (6, _D.kills),
    "stops": (_C.stops, None),
    "rate": (0.0, _D.rate),
    "max_rate": (_C.max_rate, None),
    "event_gap_s": (_C.event_gap_s, None),
    "permanent_share": (_C.permanent_share, None),
    "max_sleep_ms": (_C.max_sleep_ms, _D.max_sleep_ms),
    "min_sleep_ms": (_C.min_sleep_ms, _D.min_sleep_ms),
    "deadline_s": (_C.deadline_s, _D.deadline_s),
    "heartbeat_s": (_C.heartbeat_s, _D.heartbeat_s),
    "lease_s": (_C.lease_s, _D.lease_s),
    "evict_after_s": (_C.evict_after_s, _D.evict_after_s),
    "sweep_interval_s": (_C.sweep_interval_s, _D.sweep_interval_s),
    "agent": (DEFAULT_AGENT, DEPLOY_AGENT),
    "rounds": (None, _D.rounds),
    "stream_share": (None, _D.stream_share),
    "gap_s": (None, _D.gap_s),
}


def _text(v: Any) -> str:
    return " ".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def _shown(dest: str) -> str:
    crash, deploy = (_text(v) if v is not None else None for v in _BY_SCENARIO[dest])
    if crash == deploy:
        return f"default {crash}"
    if deploy is None:
        return f"crash only; default {crash}"
    if crash is None:
        return f"rolling-deploy only; default {deploy}"
    return f"default {crash}; rolling-deploy {deploy}"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where there is one for every scenario (the others say theirs)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Every option of a run. Options whose default depends on the scenario default to
    None here (their help says each scenario's); :func:`config_from_args` fills them in."""
    d = ChaosConfig()
    p = argparse.ArgumentParser(
        prog=prog,
        formatter_class=_Formatter,
        description="Kill workers and Redis mid-stream (--scenario crash), or replace every "
        "worker by SIGTERM under load (--scenario rolling-deploy), then check that no message "
        "was lost, no caller left unanswered and no side effect ran twice.",
    )
    a = p.add_argument

    def per(flag: str, text: str, **kw: Any) -> None:
        dest = flag.removeprefix("--").replace("-", "_")
        a(flag, default=None, help=f"{text} ({_shown(dest)})", **kw)

    a(
        "--scenario",
        choices=SCENARIOS,
        default="crash",
        help="which run: crash (SIGKILLs mid-handler, a SIGSTOP past the lease, Redis "
        "restarts) or rolling-deploy (every worker replaced by SIGTERM once its successor is ready, "
        "--rounds times, with --kills SIGKILLs and --redis-restarts Redis restarts among them)",
    )
    a(
        "--short",
        action="store_true",
        help="the short run CI makes of the scenario (crash: 600 messages, 3 workers, 4 kills; "
        "rolling-deploy: 3 workers, 2 kills, 15 messages/s); options given still apply",
    )
    per("--messages", "messages to send", type=int)
    per("--workers", "worker processes", type=int)
    per("--kills", "worker SIGKILLs", type=int)
    per("--stops", "SIGSTOP/SIGCONT of a worker past its lease", type=int)
    a("--redis-restarts", type=int, default=d.redis_restarts, help="Redis SIGKILL + restarts")
    per("--rounds", "times every worker is replaced by SIGTERM", type=int)
    a("--seed", type=int, default=d.seed)
    per("--rate", "messages/s (crash: 0 spreads them over the chaos events)", type=float)
    per("--max-rate", "highest messages/s", type=float)
    per("--event-gap-s", "mean gap between chaos events", type=float)
    per("--gap-s", "pause after each deploy step", type=float)
    per("--permanent-share", "share of killed workers that never come back", type=float)
    a("--request-share", type=float, default=d.request_share)
    per("--stream-share", "share of messages sent with stream()", type=float)
    a("--concurrency", type=int, default=d.concurrency, help="handlers per worker")
    a("--callers", type=int, default=d.callers, help="caller clients")
    a("--inflight", type=int, default=d.inflight, help="caller calls at once")
    per("--min-sleep-ms", "shortest handler sleep", type=int)
    per("--max-sleep-ms", "longest handler sleep", type=int)
    per(
        "--deadline-s",
        "request deadlines, uniform in [MIN, MAX] seconds",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
    )
    per("--heartbeat-s", "workers' seconds between heartbeats", type=float)
    per("--lease-s", "workers' lease", type=float)
    per("--evict-after-s", "workers' seconds without a heartbeat before eviction", type=float)
    per("--sweep-interval-s", "workers' seconds between sweeps", type=float)
    a("--quiet-timeout-s", type=float, default=d.quiet_timeout_s)
    per("--agent", "MODULE:FACTORY of the worker agent")
    a("--dir", default=None, help="data dir (Redis AOF, worker logs); default a temp dir")
    a("--keep", action="store_true", help="keep the data dir after a passing run")
    a("--json", action="store_true", help="print the report as JSON")
    return p


def config_from_args(ns: argparse.Namespace) -> ChaosConfig | DeployConfig:
    """The configuration the parsed options describe: a :class:`ChaosConfig` for the crash
    scenario, a :class:`DeployConfig` for rolling-deploy. Raises ValueError for an option the
    scenario has no use for."""
    deploy = ns.scenario == SCENARIO
    given = {k: getattr(ns, k) for k in _BY_SCENARIO if getattr(ns, k) is not None}
    foreign = sorted(k for k in given if _BY_SCENARIO[k][1 if deploy else 0] is None)
    if foreign:
        flags = ", ".join("--" + k.replace("_", "-") for k in foreign)
        raise ValueError(f"{flags}: not an option of --scenario {ns.scenario}")
    if "deadline_s" in given:
        given["deadline_s"] = tuple(given["deadline_s"])
    common = {
        "redis_restarts": ns.redis_restarts,
        "seed": ns.seed,
        "request_share": ns.request_share,
        "concurrency": ns.concurrency,
        "callers": ns.callers,
        "inflight": ns.inflight,
        "quiet_timeout_s": ns.quiet_timeout_s,
        "dir": ns.dir,
        "keep": ns.keep,
    }
    if deploy:
        base = DeployConfig.short() if ns.short else DeployConfig()
        return replace(base, **common, **given)
    if not ns.short:  # the medium run; --short keeps ChaosConfig's (the CI run)
        given = {"messages": 2000, "workers": 4, "kills": 6, **given}
    return replace(ChaosConfig(), **common, **given)


def _progress_printer() -> Callable[[dict[str, Any]], None]:
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(s: dict[str, Any]) -> None:
        if s.get("scenario") == SCENARIO:
            line = (
                f"chaos {SCENARIO} [{s['phase']}] {s['elapsed_s']:.0f}s  sent {s['started']}"
                f"  answered {s['answered']}  replaced {s['replaced']}/"
                f"{s['replacements_planned']}  draining {s['draining']}  kills {s['kills']}"
                f"  redis restarts {s['redis_restarts']}  workers up {s['alive']}"
            )
        else:
            line = (
                f"chaos [{s['phase']}] {s['elapsed_s']:.0f}s  sent {s['started']}/{s['messages']}"
                f"  answered {s['answered']}  kills {s['kills']}/{s['kills_planned']}"
                f"  stops {s['stops']}  redis restarts {s['redis_restarts']}"
                f"  workers up {s['alive']}"
            )
        if tty:
            sys.stderr.write("\r\x1b[2K" + line)
            sys.stderr.flush()
        elif time.monotonic() - last[0] >= 10:  # piped: a plain line now and then
            last[0] = time.monotonic()
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    return show


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command line entry: returns 0 when every check passed, 1 otherwise (2: bad usage)."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    try:
        cfg = config_from_args(ns)
    except ValueError as e:
        parser.error(str(e))  # exits 2
    show = _progress_printer()
    report: ChaosReport | DeployReport
    try:
        if isinstance(cfg, DeployConfig):
            report = anyio.run(run_deploy, cfg, show)
        else:
            report = anyio.run(run_chaos, cfg, show)
    except KeyboardInterrupt:
        return 130
    finally:
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
    if report.data_dir and Path(report.data_dir).is_dir():  # kept: the report goes with it
        (Path(report.data_dir) / "report.json").write_text(report.to_json())
    if ns.json:
        print(report.to_json())
    elif isinstance(report, DeployReport):
        print(format_deploy_report(report))
    else:
        print(format_report(report))
    return 0 if report.ok else 1

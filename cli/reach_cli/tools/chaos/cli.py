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
from pathlib import Path
from typing import Any

import anyio

from .agent import DEFAULT_AGENT
from .harness import run_chaos
from .plan import ChaosConfig
from .report import format_report


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Every option of a run; the defaults are those of a medium run, not the CI one."""
    d = ChaosConfig()
    p = argparse.ArgumentParser(
        prog=prog,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Kill workers and Redis mid-stream, then check that no message was lost "
        "and no side effect ran twice.",
    )
    a = p.add_argument
    a("--messages", type=int, default=2000, help="messages to send")
    a("--workers", type=int, default=4, help="worker processes")
    a("--kills", type=int, default=6, help="worker SIGKILLs")
    a("--stops", type=int, default=d.stops, help="SIGSTOP/SIGCONT of a worker past its lease")
    a("--redis-restarts", type=int, default=d.redis_restarts, help="Redis SIGKILL + restarts")
    a("--seed", type=int, default=d.seed)
    a("--rate", type=float, default=0.0, help="messages/s (0: spread over the chaos events)")
    a("--max-rate", type=float, default=d.max_rate)
    a("--event-gap-s", type=float, default=d.event_gap_s, help="mean gap between chaos events")
    a(
        "--permanent-share",
        type=float,
        default=d.permanent_share,
        help="share of killed workers that never come back",
    )
    a("--request-share", type=float, default=d.request_share)
    a("--concurrency", type=int, default=d.concurrency, help="handlers per worker")
    a("--callers", type=int, default=d.callers, help="caller clients")
    a("--inflight", type=int, default=d.inflight, help="caller calls at once")
    a("--max-sleep-ms", type=int, default=d.max_sleep_ms, help="longest handler sleep")
    a(
        "--deadline-s",
        type=float,
        nargs=2,
        default=d.deadline_s,
        metavar=("MIN", "MAX"),
        help="request deadlines, uniform in [MIN, MAX] seconds",
    )
    a("--heartbeat-s", type=float, default=d.heartbeat_s)
    a("--lease-s", type=float, default=d.lease_s)
    a("--evict-after-s", type=float, default=d.evict_after_s)
    a("--sweep-interval-s", type=float, default=d.sweep_interval_s)
    a("--quiet-timeout-s", type=float, default=d.quiet_timeout_s)
    a("--agent", default=DEFAULT_AGENT, help="MODULE:FACTORY of the worker agent")
    a("--dir", default=None, help="data dir (Redis AOF, worker logs); default a temp dir")
    a("--keep", action="store_true", help="keep the data dir after a passing run")
    a("--json", action="store_true", help="print the report as JSON")
    return p


def config_from_args(ns: argparse.Namespace) -> ChaosConfig:
    """The :class:`ChaosConfig` the parsed options describe."""
    return ChaosConfig(
        messages=ns.messages,
        workers=ns.workers,
        kills=ns.kills,
        stops=ns.stops,
        redis_restarts=ns.redis_restarts,
        seed=ns.seed,
        rate=ns.rate,
        max_rate=ns.max_rate,
        event_gap_s=ns.event_gap_s,
        permanent_share=ns.permanent_share,
        request_share=ns.request_share,
        concurrency=ns.concurrency,
        callers=ns.callers,
        inflight=ns.inflight,
        max_sleep_ms=ns.max_sleep_ms,
        deadline_s=tuple(ns.deadline_s),
        heartbeat_s=ns.heartbeat_s,
        lease_s=ns.lease_s,
        evict_after_s=ns.evict_after_s,
        sweep_interval_s=ns.sweep_interval_s,
        quiet_timeout_s=ns.quiet_timeout_s,
        agent=ns.agent,
        dir=ns.dir,
        keep=ns.keep,
    )


def _progress_printer() -> Callable[[dict[str, Any]], None]:
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(s: dict[str, Any]) -> None:
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
    """Command line entry: returns 0 when every invariant held, 1 otherwise."""
    ns = build_parser(prog).parse_args(argv)
    cfg = config_from_args(ns)
    show = _progress_printer()
    try:
        report = anyio.run(run_chaos, cfg, show)
    except KeyboardInterrupt:
        return 130
    finally:
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
    if report.data_dir and Path(report.data_dir).is_dir():  # kept: the report goes with it
        (Path(report.data_dir) / "report.json").write_text(report.to_json())
    print(report.to_json() if ns.json else format_report(report))
    return 0 if report.ok else 1

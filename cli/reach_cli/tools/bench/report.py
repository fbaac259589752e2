"""The benchmark's report (text and JSON) and its command line (:func:`main`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from reach.errors import ConfigError

from .. import lean_floor
from .measure import _cpu_total
from .processes import Progress
from .rounds import (
    _RATIO_LABELS,
    LEAN_GOALS,
    run_bench,
)


def format_report(out: dict[str, Any]) -> str:
    tp, lat = out["throughput"], out["latency"]
    rounds = out.get("repeat", 1)
    med = f" (medians of {rounds} rounds)" if rounds > 1 else ""
    load = out.get("load_avg_1m")
    lines = [
        f"redis {out['redis']}, {out['cpus']} cpus, worker concurrency {out['concurrency']}"
        + (f", load average {load[0]} -> {load[1]}" if load else "")
        + (f", messages signed ({out['signed']}), signatures required" if out.get("signed") else "")
        + med,
        (
            f"fire-and-forget backlog of {tp['messages']} msgs processed in "
            f"{tp['seconds']:.2f}s = {tp['msgs_per_s']:,.0f} msgs/s "
            f"(loading it took {tp['load_seconds']:.2f}s)"
        ),
        (
            f"  per msg, worker: {tp['redis_commands_per_msg_worker']:.2f} Redis commands, "
            f"{tp['round_trips_per_msg_worker']:.3f} round trips"
        ),
        (
            f"request/reply, 1 sequential caller, {lat['requests']} requests: p50 "
            f"{lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms, mean {lat['mean_ms']:.3f} ms"
        ),
        (
            f"  per request, caller and worker: {lat['redis_commands_per_request']:.2f} Redis "
            f"commands, {lat['round_trips_per_request']:.2f} round trips"
        ),
    ]
    st = out.get("streaming")
    if st:
        lines.append(
            f"streaming, 1 caller (Client.send, {st['inflight']} in flight) and the worker at "
            f"once, {st['messages']} msgs: {st['msgs_per_s']:,.0f} msgs/s processed "
            f"({st['seconds']:.2f}s; sent in {st['send_seconds']:.2f}s)"
        )
        if "redis_cpu_us_per_msg" in st:
            lines.append(
                f"  per msg, Redis: {st['redis_cpu_us_per_msg']:.1f} µs of CPU, "
                f"{st['script_calls_per_msg']:.2f} script calls, "
                f"{st['redis_reads_per_msg']:.2f} requests read (caller and worker)"
            )
        lines += _cpu_line(st)
    many = out.get("send_many")
    if many:
        lines.append(
            f"streaming, 1 caller (Client.send_many, {many['batch']} per call) and the worker "
            f"at once, {many['messages']} msgs: {many['msgs_per_s']:,.0f} msgs/s processed "
            f"({many['seconds']:.2f}s; sent in {many['send_seconds']:.2f}s = "
            f"{many['sent_per_s']:,.0f} msgs/s enqueued)"
        )
        lines += _cpu_line(many)
    fl = out.get("floor")
    if fl:
        fs, flat, ra = fl["streaming"], fl["latency"], out["ratios"]
        lines += [
            "floor (bare redis-py on Streams, no guarantees; same Redis, same run):",
            (
                f"  streaming, XADD pipelined {fs['batch']} per batch, a reply XADD + XACK per "
                f"message, {fs['messages']} msgs: "
                f"{fs['msgs_per_s']:,.0f} msgs/s processed ({fs['seconds']:.2f}s)"
            ),
            *_cpu_line(fs),
            (
                f"  request/reply, {flat['requests']} requests: p50 {flat['p50_ms']:.3f} ms, "
                f"p99 {flat['p99_ms']:.3f} ms"
            ),
            (
                f"reach / floor: throughput {ra['throughput']:.2f}x (goal >= 0.90), p50 "
                f"{ra['p50']:.2f}x (goal <= 1.5), p99 {ra['p99']:.2f}x (goal <= 2)"
                + (" (medians of the rounds' ratios)" if rounds > 1 else "")
            ),
        ]
        ceiling = _cpu_ceiling(st, fs) if st else None
        if ceiling is not None:
            lines.append(
                f"CPU per processed msg, caller + worker + Redis: reach (Client.send) "
                f"{ceiling[0]:.1f} µs, floor {ceiling[1]:.1f} µs: with every core busy, reach "
                f"can do at most {ceiling[1] / ceiling[0]:.2f}x the floor's throughput"
            )
        mr = (many or {}).get("ratios")
        if mr:
            lines.append(
                f"send_many / floor: enqueue rate {mr['enqueue']:.2f}x (goal >= 0.80; floor "
                f"{fs['sent_per_s']:,.0f} msgs/s enqueued), throughput {mr['throughput']:.2f}x"
            )
    lean = out.get("lean_floor")
    if lean:
        lines += _lean_report(out, lean, st, fl, rounds)
    return "\n".join(lines)


def _lean_report(
    out: dict[str, Any],
    lean: dict[str, Any],
    st: dict[str, Any] | None,
    fl: dict[str, Any] | None,
    rounds: int,
) -> list[str]:
    """The lean floor's lines of the report: its figures, reach / lean floor with the
    goals, lean floor / bare floor, and the CPU table of the three systems."""
    ls, llat = lean["streaming"], lean["latency"]
    lr, gc = out["lean_ratios"], out["guarantee_cost"]
    med = " (medians of the rounds' ratios)" if rounds > 1 else ""
    lines = [
        (
            "lean floor (the simplest code keeping reach's core guarantees: an idempotency "
            "record per message claimed at send, a fenced completion storing the result "
            "with the reply, XACK and XDEL; same Redis, same run):"
        ),
        (
            f"  streaming, one send Lua call per {ls['batch']} msgs (XADD + record each), one "
            f"completion Lua call per XREADGROUP of {lean_floor.READ_COUNT}, "
            f"{ls['messages']} msgs: {ls['msgs_per_s']:,.0f} msgs/s processed "
            f"({ls['seconds']:.2f}s)"
        ),
        *_cpu_line(ls),
        (
            f"  request/reply, {llat['requests']} requests: p50 {llat['p50_ms']:.3f} ms, "
            f"p99 {llat['p99_ms']:.3f} ms"
        ),
    ]
    goals = []
    for name, way, goal in LEAN_GOALS:
        if name in lr:
            met = lr[name] >= goal if way == "min" else lr[name] <= goal
            sign = ">=" if way == "min" else "<="
            goals.append(
                f"{_RATIO_LABELS[name]} {lr[name]:.2f}x (goal {sign} {goal:g}"
                + (", met)" if met else ")")
            )
    half = 3  # throughput and latency, then the CPU of each process
    lines.append("reach / lean floor: " + ", ".join(goals[:half]) + med)
    if goals[half:]:
        lines.append(
            "  CPU per processed msg: "
            + ", ".join(goals[half:])
            + (f", sum {lr['cpu_sum']:.2f}x" if "cpu_sum" in lr else "")
        )
    cost = [
        f"{_RATIO_LABELS[k]} {gc[k]:.2f}x"
        for k in ("throughput", "p50", "p99", "cpu_sum")
        if k in gc
    ]
    lines.append("lean floor / bare floor (what the guarantees cost): " + ", ".join(cost) + med)
    table = [
        ("reach (Client.send)", st),
        ("bare floor", fl["streaming"] if fl else None),
        ("lean floor", ls),
    ]
    if all(fig is not None and _cpu_total(fig) is not None for _, fig in table):
        lines.append(
            f"  {'CPU µs per processed msg':<26}{'caller':>8}{'worker':>8}{'Redis':>8}{'sum':>8}"
        )
        for label, fig in table:
            assert fig is not None
            lines.append(
                f"  {label:<26}{fig['cpu_caller_us']:>8.1f}{fig['cpu_worker_us']:>8.1f}"
                f"{fig['cpu_redis_us']:>8.1f}{_cpu_total(fig) or 0.0:>8.1f}"
            )
    return lines


def _cpu_line(fig: dict[str, Any]) -> list[str]:
    """The CPU line of a streaming figure ([] when the worker's CPU is unknown)."""
    total = _cpu_total(fig)
    if total is None:
        return []
    line = (
        f"  CPU per msg: caller {fig['cpu_caller_us']:.1f} µs, worker "
        f"{fig['cpu_worker_us']:.1f} µs, Redis {fig['cpu_redis_us']:.1f} µs (sum {total:.1f} µs)"
    )
    return [line]


def _cpu_ceiling(reach: dict[str, Any], fl: dict[str, Any]) -> tuple[float, float] | None:
    """(reach's, the floor's) CPU per message of the three processes together, when known:
    on a machine whose cores all run the benchmark, throughput is at most cores / that sum,
    so the floor's sum / reach's bounds the throughput ratio however the work overlaps."""
    a, b = _cpu_total(reach), _cpu_total(fl)
    return None if a is None or b is None else (a, b)


HELP_EPILOG = """\
The floors (--floor): the same workloads on two redis-py loops on Redis Streams.
The bare floor, with none of reach's guarantees (reach_cli.tools.floor): the caller
pipelines XADD 500 per batch; its worker process reads XREADGROUP COUNT 100 and answers
each batch with one pipeline (a reply XADD per message, one XACK). The lean floor, the
simplest code keeping reach's core guarantees (reach_cli.tools.lean_floor): one Lua call
per 500 messages adds each inbox entry with its idempotency record (pending, claimed at
send, fence 1, 24 h TTL); its worker process reads XREADGROUP COUNT 100 and completes each
batch in one Lua call (fence check, result into the record, reply XADD with its TTL, XACK,
XDEL). All three systems run in the same invocation on the same Redis, each phase with a
fresh worker process, in alternating order between rounds, and reach's figures are
printed as ratios to each floor's: throughput = reach msgs/s / floor msgs/s (streaming
workload), p50 and p99 = reach's latency / the floor's, and against the lean floor the
CPU per processed message of each process (caller, worker, Redis) with the goals: throughput
>= 0.8, p50 <= 1.3, p99 <= 1.5, CPU caller <= 2, worker <= 1.5, Redis <= 1.25. Numbers
from separate runs are never compared.
"""


def progress_lines() -> Progress:
    """A progress callback for the plain scripts: a line on stderr at every tenth of a
    phase and at its end (phases that poll report the same count often)."""
    shown: dict[str, int] = {}  # phase -> the last count printed

    def progress(phase: str, done: int, total: int) -> None:
        before = shown.get(phase, -1)
        step = max(1, total // 10)
        if done != before and (done == total or done // step > max(before, 0) // step):
            shown[phase] = done
            print(f"{phase} {done}/{total}", file=sys.stderr, flush=True)

    return progress


def main(argv: Sequence[str] | None = None) -> int:
    """`python bench/messaging_bench.py` (plain progress lines on stderr)."""
    ap = argparse.ArgumentParser(
        prog="messaging_bench",
        description=__doc__,
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--messages", type=int, default=30_000, help="backlog messages")
    ap.add_argument("--requests", type=int, default=3_000, help="sequential request/replies")
    ap.add_argument(
        "--stream-messages",
        type=int,
        default=20_000,
        help="messages of the streaming workload (0: skip it; not with --floor)",
    )
    ap.add_argument("--concurrency", type=int, default=64, help="the reach worker's handlers")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also measure the bare floor (no guarantees) and the lean floor (the core "
        "guarantees kept)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="rounds; figures are medians")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--secret",
        default=None,
        help="sign every message with this secret (HMAC) and require signatures on the "
        "worker, to compare with a run without",
    )
    ap.add_argument(
        "--ed25519",
        action="store_true",
        help="the same with an Ed25519 key pair made for the run (needs cryptography)",
    )
    a = ap.parse_args(argv)

    progress = progress_lines()

    try:
        out = run_bench(
            messages=a.messages,
            requests=a.requests,
            stream_messages=a.stream_messages,
            concurrency=a.concurrency,
            floor=a.floor,
            repeat=a.repeat,
            progress=progress,
            secret=a.secret,
            ed25519=a.ed25519,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2) if a.json else format_report(out))
    return 0

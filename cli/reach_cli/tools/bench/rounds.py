"""Phases and rounds: each phase in a worker process of its own, the systems alternating
in each round, ratios within a round and their medians (:func:`run_bench`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from reach.embedded import RedisServer
from reach.errors import ConfigError
from reach.signing import Keyring, keygen

from .measure import (
    _cpu_total,
    _floor_latency,
    _floor_streaming,
    _latency,
    _lean_latency,
    _lean_streaming,
    _streaming,
    _streaming_many,
    _throughput,
)
from .processes import (
    NS,
    WARM_UP,
    Measure,
    Progress,
    _floor_worker_cmd,
    _lean_worker_cmd,
    _popen,
    _reach_worker_cmd,
    _wait_floor_ready,
    _wait_ready,
)

# -- phases and rounds -------------------------------------------------------------------


def _phase(
    url: str,
    cmd: list[str],
    ready: Callable[[], Awaitable[None]],
    log: Path,
    measure: Measure,
    n: int,
    progress: Progress | None,
    stats_prefix: str = "stats: ",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One phase with a worker process of its own: (figures, the worker's own stats, from
    the ``<stats_prefix>{...}`` line it logs when it stops)."""
    w = _popen(cmd, log)
    try:
        anyio.run(ready)
        out = anyio.run(measure, url, n, w, progress)
    except BaseException:
        # The worker's side of a failed phase, for the report (its log is a temporary file).
        tail = log.read_text(errors="replace").strip().splitlines()[-20:]
        print(f"worker log ({log.name}), last lines:", *tail, sep="\n", file=sys.stderr)
        raise
    finally:
        w.send_signal(signal.SIGCONT)
        w.send_signal(signal.SIGTERM)
        try:
            w.wait(timeout=60)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
    m = re.search(re.escape(stats_prefix) + r"(\{.*\})", log.read_text(errors="replace"))
    return out, (json.loads(m.group(1)) if m else {})


def _round(
    url: str,
    tmp: Path,
    k: int,
    *,
    messages: int,
    requests: int,
    stream_messages: int,
    concurrency: int,
    with_floor: bool,
    progress: Progress | None,
) -> dict[str, Any]:
    """Round ``k`` (0-based) of every phase. With the floors, each workload runs on reach,
    the bare floor and the lean floor in that order in even rounds and in the reverse
    order in odd ones, so that no system always runs first (or last) on a warm machine."""
    reach_cmd = _reach_worker_cmd(url, concurrency)

    def ready() -> Awaitable[None]:
        return _wait_ready(url)

    def reach_phase(name: str, measure: Measure, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        log = tmp / f"worker-{name}-{k}.log"
        return _phase(url, reach_cmd, ready, log, measure, n, progress)

    def floor_phase(name: str, make: Callable[[str], Measure], n: int) -> dict[str, Any]:
        stream = f"floor:{name}:{k}"  # a fresh stream (and group) for each run

        def floor_ready() -> Awaitable[None]:
            return _wait_floor_ready(url, stream)

        out, stats = _phase(
            url,
            _floor_worker_cmd(url, stream),
            floor_ready,
            tmp / f"floor-{name}-{k}.log",
            make(stream),
            n,
            progress,
            stats_prefix="floor stats: ",
        )
        return {**out, "worker_stats": stats}

    def lean_phase(name: str, make: Callable[[str], Measure], n: int) -> dict[str, Any]:
        stream = f"lean:{{{name}-{k}}}"  # fresh, its keys under one hash tag

        def lean_ready() -> Awaitable[None]:
            return _wait_floor_ready(url, stream)

        out, stats = _phase(
            url,
            _lean_worker_cmd(url, stream),
            lean_ready,
            tmp / f"lean-{name}-{k}.log",
            make(stream),
            n,
            progress,
            stats_prefix="lean floor stats: ",
        )
        return {**out, "worker_stats": stats}

    def in_order(steps: list[Callable[[], None]]) -> None:
        for step in steps[::-1] if k % 2 else steps:
            step()

    res: dict[str, Any] = {}
    res["throughput"], res["backlog_stats"] = reach_phase("backlog", _throughput, messages)
    if stream_messages:

        def reach_streaming() -> None:
            st, st_stats = reach_phase("streaming", _streaming, stream_messages)
            res["streaming"] = {**st, "worker_stats": st_stats}
            many, many_stats = reach_phase("streaming_many", _streaming_many, stream_messages)
            res["streaming_many"] = {**many, "worker_stats": many_stats}

        def floor_streaming() -> None:
            res["floor_streaming"] = floor_phase("streaming", _floor_streaming, stream_messages)

        def lean_streaming() -> None:
            res["lean_streaming"] = lean_phase("streaming", _lean_streaming, stream_messages)

        in_order([reach_streaming, *([floor_streaming, lean_streaming] if with_floor else [])])

    def reach_latency() -> None:
        res["latency"], res["requests_stats"] = reach_phase("requests", _latency, requests)

    def floor_latency() -> None:
        res["floor_latency"] = floor_phase("requests", _floor_latency, requests)

    def lean_latency() -> None:
        res["lean_latency"] = lean_phase("requests", _lean_latency, requests)

    in_order([reach_latency, *([floor_latency, lean_latency] if with_floor else [])])
    if with_floor:
        res["ratios"] = _ratios(res)
        res["lean_ratios"] = _lean_ratios(res)
        res["guarantee_cost"] = _guarantee_cost(res)
        if stream_messages:
            res["send_many_ratios"] = _send_many_ratios(res)
    return res


def _send_many_ratios(res: dict[str, Any]) -> dict[str, float]:
    """Client.send_many / floor for one round: ``enqueue`` = the callers' enqueue rates
    (messages sent per second of sending; goal >= 0.80), ``throughput`` = processed msgs/s."""
    many, fs = res["streaming_many"], res["floor_streaming"]
    return {
        "enqueue": many["sent_per_s"] / fs["sent_per_s"],
        "throughput": many["msgs_per_s"] / fs["msgs_per_s"],
    }


def _ratios(res: dict[str, Any]) -> dict[str, float]:
    """reach / floor for one round: throughput (higher is better for reach, 1.0 = the
    floor's), p50 and p99 (lower is better, 1.0 = the floor's)."""
    lat, flat = res["latency"], res["floor_latency"]
    out = {
        "p50": lat["p50_ms"] / flat["p50_ms"],
        "p99": lat["p99_ms"] / flat["p99_ms"],
    }
    if "streaming" in res:
        out["throughput"] = res["streaming"]["msgs_per_s"] / res["floor_streaming"]["msgs_per_s"]
    return out


# The goals for reach against the lean floor: (ratio, "min" or "max", goal). CPU
# ratios are per process, per processed message of the streaming workload.
LEAN_GOALS: tuple[tuple[str, str, float], ...] = (
    ("throughput", "min", 0.8),
    ("p50", "max", 1.3),
    ("p99", "max", 1.5),
    ("cpu_caller", "max", 2.0),
    ("cpu_worker", "max", 1.5),
    ("cpu_redis", "max", 1.25),
)


_RATIO_LABELS = {
    "throughput": "throughput",
    "p50": "p50",
    "p99": "p99",
    "cpu_caller": "caller",
    "cpu_worker": "worker",
    "cpu_redis": "Redis",
    "cpu_sum": "CPU sum",
}


def _ratio_set(
    streaming: dict[str, Any] | None,
    latency: dict[str, Any],
    base_streaming: dict[str, Any] | None,
    base_latency: dict[str, Any],
) -> dict[str, float]:
    """One system's figures over another's, for one round: ``throughput`` (processed
    msgs/s; higher is better), ``p50``, ``p99`` and, where both are known and the base is
    not 0, ``cpu_caller``, ``cpu_worker``, ``cpu_redis`` and ``cpu_sum`` (CPU per processed
    message; lower is better)."""
    out = {
        "p50": latency["p50_ms"] / base_latency["p50_ms"],
        "p99": latency["p99_ms"] / base_latency["p99_ms"],
    }
    if streaming is None or base_streaming is None:
        return out
    out["throughput"] = streaming["msgs_per_s"] / base_streaming["msgs_per_s"]
    for part in ("caller", "worker", "redis"):
        a, b = streaming.get(f"cpu_{part}_us"), base_streaming.get(f"cpu_{part}_us")
        if a is not None and b:
            out[f"cpu_{part}"] = a / b
    a_sum, b_sum = _cpu_total(streaming), _cpu_total(base_streaming)
    if a_sum is not None and b_sum:
        out["cpu_sum"] = a_sum / b_sum
    return out


def _lean_ratios(res: dict[str, Any]) -> dict[str, float]:
    """reach / the lean floor for one round (goals: :data:`LEAN_GOALS`)."""
    return _ratio_set(
        res.get("streaming"), res["latency"], res.get("lean_streaming"), res["lean_latency"]
    )


def _guarantee_cost(res: dict[str, Any]) -> dict[str, float]:
    """The lean floor / the bare floor for one round: what keeping the guarantees costs
    the simplest code that keeps them."""
    return _ratio_set(
        res.get("lean_streaming"),
        res["lean_latency"],
        res.get("floor_streaming"),
        res["floor_latency"],
    )


def _median_ratios(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The median of each ratio over the rounds that have it, and the rounds' own."""
    per_round = [r[key] for r in rounds]
    names = {name for x in per_round for name in x}
    return {
        **{
            name: statistics.median(x[name] for x in per_round if name in x)
            for name in sorted(names)
        },
        "rounds": per_round,
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key: the median of the runs' numbers; anything else (and ints that are counts
    the same in every run) as in the last run."""
    out: dict[str, Any] = {}
    for key, last in runs[-1].items():
        values = [r[key] for r in runs if key in r]
        if isinstance(last, float):
            out[key] = statistics.median(values)
        else:
            out[key] = last
    return out


@contextlib.contextmanager
def _signing_env(secret: str | None, ed25519: bool = False) -> Iterator[None]:
    """The signing variables for the run: ``REACH_SECRET`` (HMAC) or an Ed25519 identity
    made for the run (``REACH_IDENTITY_FILE``, ``REACH_TRUSTED_KEYS_FILE``; the worker and
    the callers share it), and ``REACH_REQUIRE_SIGNED``. All unset without either: a
    benchmark without them never signs, whatever the caller's environment."""
    names = (
        "REACH_SECRET",
        "REACH_REQUIRE_SIGNED",
        "REACH_IDENTITY_FILE",
        "REACH_TRUSTED_KEYS_FILE",
    )
    if secret and ed25519:
        raise ConfigError("--secret and --ed25519: choose one signing mode.")
    saved = {n: os.environ.pop(n, None) for n in names}
    tmp = tempfile.TemporaryDirectory(prefix="reach-bench-keys-")
    if secret:
        Keyring.from_option(NS, secret)  # its length checked before anything starts
        os.environ.update(REACH_SECRET=secret, REACH_REQUIRE_SIGNED="1")
    elif ed25519:
        private, line = keygen("bench")
        key, trusted = Path(tmp.name) / "bench.key", Path(tmp.name) / "trusted"
        key.write_text(private)
        key.chmod(0o600)
        trusted.write_text(line)
        os.environ.update(
            REACH_IDENTITY_FILE=str(key),
            REACH_TRUSTED_KEYS_FILE=str(trusted),
            REACH_REQUIRE_SIGNED="1",
        )
    try:
        yield
    finally:
        tmp.cleanup()
        for n, v in saved.items():
            os.environ.pop(n, None)
            if v is not None:
                os.environ[n] = v


def run_bench(
    *,
    messages: int = 30_000,
    requests: int = 3_000,
    concurrency: int = 64,
    stream_messages: int = 0,
    floor: bool = False,
    repeat: int = 1,
    progress: Progress | None = None,
    secret: str | None = None,
    ed25519: bool = False,
) -> dict[str, Any]:
    """Run the whole benchmark on an embedded Redis; returns the figures.

    ``secret``: sign every message with it (HMAC, reach.signing; ``ed25519``: with a key
    pair made for the run instead) and run the worker with
    signatures required (``REACH_SECRET`` and ``REACH_REQUIRE_SIGNED=1`` for the run: the
    worker processes and the clients read them).
    ``stream_messages``: the streaming workload's size (0: not run; needed by ``floor``,
    whose throughput ratio it is). ``floor``: the same workloads on the bare loop, and the
    ratios. ``repeat``: rounds; figures are medians of the rounds."""
    if messages < 1 or requests < 1:
        raise ConfigError("messages and requests must be >= 1")
    if stream_messages < 0:
        raise ConfigError("--stream-messages (stream_messages) must be >= 0 (0: no streaming).")
    if floor and stream_messages < 1:
        raise ConfigError(
            "The floor needs the streaming workload: --stream-messages (stream_messages) >= 1."
        )
    if repeat < 1:
        raise ConfigError("--repeat must be >= 1.")
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    with (
        _signing_env(secret, ed25519),
        RedisServer() as server,
        tempfile.TemporaryDirectory(prefix="reach-bench-") as tmp,
    ):
        for k in range(repeat):

            def tagged(phase: str, done: int, total: int, k: int = k) -> None:
                assert progress is not None
                progress(f"[{k + 1}/{repeat}] {phase}" if repeat > 1 else phase, done, total)

            rounds.append(
                _round(
                    server.url,
                    Path(tmp),
                    k,
                    messages=messages,
                    requests=requests,
                    stream_messages=stream_messages,
                    concurrency=concurrency,
                    with_floor=floor,
                    progress=tagged if progress else None,
                )
            )
    last = rounds[-1]
    tp = medians([r["throughput"] for r in rounds])
    lat = medians([r["latency"] for r in rounds])
    tp_stats, lat_stats = last["backlog_stats"], last["requests_stats"]
    if "round_trips" in tp_stats:
        tp["worker_own_round_trips_per_msg"] = tp_stats["round_trips"] / messages
    if "round_trips" in lat_stats:
        lat["worker_own_round_trips_per_request"] = lat_stats["round_trips"] / (requests + WARM_UP)
    out: dict[str, Any] = {
        "throughput": tp,
        "latency": lat,
        "worker_stats": {"backlog": tp_stats, "requests": lat_stats},
        "redis": f"{server.binary.origin} {server.binary.version_str}",
        "cpus": os.cpu_count(),
        "concurrency": concurrency,
        "repeat": repeat,
        # The 1-minute load average before and after: a loaded machine shows here.
        "load_avg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "signed": "hmac" if secret else "ed25519" if ed25519 else "",
    }
    if stream_messages:
        out["streaming"] = medians([r["streaming"] for r in rounds])
        out["send_many"] = medians([r["streaming_many"] for r in rounds])
        if floor:
            many_ratios = [r["send_many_ratios"] for r in rounds]
            out["send_many"]["ratios"] = {
                key: statistics.median(x[key] for x in many_ratios) for key in many_ratios[-1]
            }
    if floor:
        ratios = [r["ratios"] for r in rounds]
        out["floor"] = {
            "streaming": medians([r["floor_streaming"] for r in rounds]),
            "latency": medians([r["floor_latency"] for r in rounds]),
        }
        out["ratios"] = {
            **{key: statistics.median(x[key] for x in ratios) for key in ratios[-1]},
            "rounds": ratios,
        }
        out["lean_floor"] = {
            "streaming": medians([r["lean_streaming"] for r in rounds]),
            "latency": medians([r["lean_latency"] for r in rounds]),
        }
        out["lean_ratios"] = _median_ratios(rounds, "lean_ratios")
        out["guarantee_cost"] = _median_ratios(rounds, "guarantee_cost")
    if repeat > 1:
        out["rounds"] = [
            {
                key: {f: v for f, v in fig.items() if f != "worker_stats"}
                for key, fig in r.items()
                if key
                in (
                    "throughput",
                    "latency",
                    "streaming",
                    "streaming_many",
                    "floor_streaming",
                    "floor_latency",
                    "lean_streaming",
                    "lean_latency",
                )
            }
            for r in rounds
        ]
    return out

"""`reach bench` runs the messaging benchmark for real (a tiny one) and reports figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> tuple[dict[str, Any], str]:
    res = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", "bench", *args, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), res.stderr


def test_reach_bench_reports_throughput_latency_and_round_trips() -> None:
    out, err = _bench(
        "--messages", "500", "--requests", "50", "--stream-messages", "0", "--concurrency", "8"
    )
    tp, lat = out["throughput"], out["latency"]
    assert tp["messages"] == 500 and tp["msgs_per_s"] > 0 and tp["last_status"] == "succeeded"
    assert tp["redis_commands_per_msg_worker"] > 0
    # A backlog is read and settled in batches: well under one round trip per message.
    assert 0 < tp["round_trips_per_msg_worker"] < 1
    assert 0 < tp["worker_own_round_trips_per_msg"] < 1
    assert lat["requests"] == 50 and 0 < lat["p50_ms"] <= lat["p99_ms"]
    # A lone request costs the caller and the worker a few round trips each, never dozens.
    assert 2 <= lat["round_trips_per_request"] < 10
    assert lat["redis_commands_per_request"] > lat["round_trips_per_request"]
    # The backlog's worker handled exactly the backlog, each message once.
    assert out["worker_stats"]["backlog"]["handled"] == 500
    assert "streaming" not in out and "floor" not in out
    # Piped: progress as plain lines on stderr.
    assert "processing 500/500" in err and "requests 50/50" in err


def test_reach_bench_floor_runs_both_systems_in_one_run() -> None:
    """--floor: the streaming and latency workloads on reach and on the bare loop, every
    message processed by both (counts only: timings are not asserted), and the ratios."""
    out, err = _bench(
        "--messages", "300", "--requests", "50", "--stream-messages", "300",
        "--concurrency", "8", "--floor",
    )  # fmt: skip
    st, fl = out["streaming"], out["floor"]
    # reach: every message sent was added to the inbox once and acked by the group, and
    # the worker handled each exactly once.
    assert st["messages"] == st["processed"] == 300 and st["inflight"] == 50
    assert st["worker_stats"]["handled"] == 300
    # The floor: the same count through its stream and its worker, which replied to each.
    fs, flat = fl["streaming"], fl["latency"]
    assert fs["messages"] == fs["processed"] == 300 and fs["batch"] == 500
    assert fs["worker_stats"]["handled"] == fs["worker_stats"]["replies"] == 300
    # Its latency worker answered the warm-up and every measured request.
    assert flat["requests"] == 50 and flat["worker_stats"]["handled"] == 200 + 50
    assert flat["worker_stats"]["replies"] == 200 + 50
    assert 0 < flat["p50_ms"] <= flat["p99_ms"]
    assert out["worker_stats"]["requests"]["handled"] == 200 + 50
    ratios = out["ratios"]
    assert set(ratios) == {"throughput", "p50", "p99", "rounds"} and len(ratios["rounds"]) == 1
    assert all(ratios[k] > 0 for k in ("throughput", "p50", "p99"))
    assert "streaming floor: processed 300/300" in err and "floor requests 50/50" in err
    # The CPU each process spent per message, for both systems (the throughput ceiling's
    # model). /proc counts in clock ticks (10 ms), more than a worker may spend on 300
    # messages: its figure may be 0, the caller's and Redis's are finer.
    for fig in (st, out["send_many"], fs, out["lean_floor"]["streaming"]):
        assert fig["cpu_caller_us"] > 0 and fig["cpu_redis_us"] > 0 and fig["cpu_worker_us"] >= 0
    # The lean floor, in the same run: every message processed, each completed and replied
    # to once by its worker, none refused; its ratios to reach, and its cost over the bare.
    ls, llat = out["lean_floor"]["streaming"], out["lean_floor"]["latency"]
    assert ls["messages"] == ls["processed"] == 300 and ls["batch"] == 500
    assert ls["worker_stats"]["handled"] == ls["worker_stats"]["replies"] == 300
    assert ls["worker_stats"]["refused"] == 0
    assert llat["requests"] == 50 and llat["worker_stats"]["replies"] == 200 + 50
    assert 0 < llat["p50_ms"] <= llat["p99_ms"]
    for key in ("lean_ratios", "guarantee_cost"):
        assert {"throughput", "p50", "p99", "cpu_caller", "cpu_redis"} <= set(out[key])
        # a worker's CPU comes in 10 ms ticks: over 300 messages it may count 0
        assert all(
            v >= 0 if k == "cpu_worker" else v > 0 for k, v in out[key].items() if k != "rounds"
        )
    assert "streaming lean floor: processed 300/300" in err and "lean floor requests 50/50" in err


def test_reach_bench_floor_needs_the_streaming_workload() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", "bench", "--floor", "--stream-messages", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and "stream_messages" in res.stderr

"""`reach bench` runs the messaging benchmark for real (a tiny one) and reports figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reach_bench_reports_throughput_latency_and_round_trips() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "reach_cli.app",
            "bench",
            "--messages",
            "500",
            "--requests",
            "50",
            "--concurrency",
            "8",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
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
    # Piped: progress as plain lines on stderr.
    assert "processing 500/500" in res.stderr and "requests 50/50" in res.stderr

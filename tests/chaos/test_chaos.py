"""Chaos, CI size: real `reach worker` processes SIGKILLed mid-handler (some restarted with
their agent_id, some never back), one SIGSTOP/SIGCONT past the lease, one Redis SIGKILL +
restart from its AOF, while callers send requests (with deadlines) and fire-and-forget
messages. Afterwards: nothing lost, one side effect per key, every caller answered, no
pending entries, inbox memory back to zero. The engine is reach_cli.tools.chaos (also
`reach chaos` and bench/chaos.py for long runs); the workers run its chaos_agent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from reach_cli.tools.chaos import ChaosConfig, format_report, plan_events, plan_messages, run_chaos

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.anyio


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_kill_stop_and_restart_redis_mid_stream(tmp_path: Path) -> None:
    cfg = ChaosConfig(
        messages=600,
        workers=3,
        kills=4,
        stops=1,
        redis_restarts=1,
        seed=7,
        deadline_s=(0.5, 20.0),  # a few short ones expire around a kill: told, then retried
        cwd=str(ROOT),
        dir=str(tmp_path / "chaos"),
        quiet_timeout_s=60,
        caller_give_up_s=120,
    )
    r = await run_chaos(cfg)
    text = format_report(r)
    print(text)  # shown with -s, or on failure
    assert r.ok, text
    # The chaos really happened, mid-stream.
    assert r.kills == 4 and r.kills_mid_handler >= 3, text
    fates = {k["fate"] for k in r.kill_log}
    assert "never" in fates and fates & {"restart_quick", "restart_after_eviction"}, text
    assert r.restarts >= 1 and r.never_back >= 1 and r.replacements == r.never_back
    assert r.stops == 1 and r.redis_restarts == 1
    # 0 messages lost: every key done with its result stored, every delivered msg_id succeeded.
    assert r.lost == 0 and r.not_succeeded == {}
    assert r.deliveries >= r.messages
    # Exactly one side effect per key.
    assert r.effects == r.keys and r.duplicate_side_effects == 0
    # No two live workers ran one key at once (only the paused one, whose completion is fenced).
    assert r.overlapping_runs == 0
    # Every caller got its own result, or a typed error and then, retrying under the same
    # idempotency key, its result.
    assert r.untyped_errors == {} and r.wrong_results == 0 and r.callers_gave_up == 0
    # No stuck pending entries; inbox memory back to zero; nothing parked or delayed; every
    # dead letter (an expired attempt) was reported to its caller, who retried the key.
    assert r.pending_left == 0 and r.inbox_entries_left == 0
    assert r.parked_left == 0 and r.delayed_left == 0 and r.reroute_left == 0
    assert r.dead_letters_unaccounted == 0
    # In-flight recovery after a SIGKILL within lease + evict_after + a sweep (<= 3 s).
    assert r.recovery_max_s is not None and r.recovery_max_s <= r.recovery_target_s, text
    assert all(k["recovery_s"] is not None for k in r.kill_log)


def test_plan_is_deterministic() -> None:
    import random

    cfg = ChaosConfig(messages=300, kills=5, stops=1, redis_restarts=1, seed=3)
    a = plan_messages(cfg, random.Random(3)), plan_events(cfg, random.Random(4), 20.0)
    b = plan_messages(cfg, random.Random(3)), plan_events(cfg, random.Random(4), 20.0)
    assert a == b
    specs, events = a
    assert {s.kind for s in specs} == {"request", "send"}
    assert {s.priority for s in specs} == {"high", "normal", "low"}
    assert any(s.session for s in specs) and any(s.dup for s in specs)
    kills = [e for e in events if e.kind == "kill"]
    assert len(kills) == 5 and [e.kind for e in events].count("stop") == 1
    assert {e.fate for e in kills} >= {"never", "restart_quick"}
    assert [e.at for e in events] == sorted(e.at for e in events)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_reach_chaos_command(tmp_path: Path) -> None:
    """`reach chaos` runs the same engine and prints the report (here as JSON)."""
    cmd = [
        sys.executable,
        "-m",
        "reach_cli.app",
        "chaos",
        "--messages",
        "80",
        "--workers",
        "2",
        "--kills",
        "1",
        "--stops",
        "0",
        "--redis-restarts",
        "0",
        "--event-gap-s",
        "2",
        "--dir",
        str(tmp_path / "run"),
        "--json",
    ]
    p = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout)
    assert r["ok"] and r["messages"] == 80 and r["kills"] == 1 and r["lost"] == 0
    assert r["effects"] == r["keys"]

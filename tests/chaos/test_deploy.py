"""The rolling-deploy scenario, CI size: `reach chaos --scenario rolling-deploy --short`.

Real `reach worker` processes under continuous load (requests, streams and sends; handlers
of 0.05-5 s) are replaced one after another by SIGTERM once their successors are ready,
twice over, with two SIGKILLs and one Redis SIGKILL + AOF restart among the replacements.
The pass criteria are checked by the harness from a ledger the handlers write in a Redis
of its own (every run's start and end): 0 lost, every caller answered, each completed
key's handler run once (another run only when a SIGKILL cut the first), no message on two
agents at once, every drained worker exited 0. The engine is reach_cli.tools.chaos.deploy.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from reach_cli.tools.chaos import DeployConfig, plan_deploy
from reach_cli.tools.chaos.plan import deploy_message

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rolling_deploy_short(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "reach_cli.app",
        "chaos",
        "--scenario",
        "rolling-deploy",
        "--short",
        "--dir",
        str(tmp_path / "run"),
        "--json",
    ]
    p = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert p.stdout.startswith("{"), p.stdout + p.stderr
    r = json.loads(p.stdout)
    text = "\n".join(r["violations"]) + f"\n(data in {r['data_dir']})"
    # The deploy really happened, mid-stream: every worker replaced twice while it had
    # work in flight, the kills and the Redis restart, and streams among the messages.
    assert r["replacements"] == 6 and r["sigterms_mid_handler"] >= 4, text
    assert r["runs_in_flight_at_sigterm"] >= 6, text
    assert r["kills"] == 2 and r["redis_restarts"] == 1, text
    assert r["streams"] > 0 and r["sends"] > 0 and r["requests"] > 0, text
    # The pass criteria.
    assert r["lost"] == 0 and r["not_succeeded"] == {}, text
    assert r["effects"] == r["keys"] and r["duplicate_side_effects"] == 0, text
    assert r["callers_gave_up"] == 0 and r["deadline_exceeded"] == 0, text
    assert r["wrong_results"] == 0 and r["streams_chunks_wrong"] == 0, text
    assert r["untyped_errors"] == {}, text
    assert r["unexplained_runs"] == 0, text
    assert r["unfinished_runs"] == 0 and r["runs_cancelled_by_drain"] == 0, text
    assert r["overlapping_runs"] == 0, text
    assert r["drain_exit_codes"] == {"0": 6}, text
    assert r["pending_left"] == 0 and r["inbox_entries_left"] == 0 and r["parked_left"] == 0
    assert r["dead_letters_unaccounted"] == 0, text
    # A handler that ended while Redis was away is not run again: its worker keeps the
    # outcome and writes it once Redis is back.
    assert r["runs_again_after_redis_outage"] == 0, text
    assert r["runs_again_after_outage_in_drain"] == 0, text
    assert r["ok"] and p.returncode == 0, text


def test_deploy_plan() -> None:
    cfg = DeployConfig(workers=3, rounds=2, kills=3, redis_restarts=2, seed=5)
    a = plan_deploy(cfg, random.Random(5))
    assert a == plan_deploy(cfg, random.Random(5))
    kinds = [s.kind for s in a]
    assert kinds.count("replace") == 6 and kinds.count("kill") == 3 and kinds.count("redis") == 2
    # Every slot replaced once per round, in order; the deploy is under way before a kill.
    replaces = [(s.round, s.slot) for s in a if s.kind == "replace"]
    assert replaces == [(r, w) for r in range(2) for w in range(3)]
    assert kinds[0] == "replace"
    # Each Redis restart comes right after a replacement: while that worker drains.
    assert all(kinds[i - 1] == "replace" for i, k in enumerate(kinds) if k == "redis")
    assert {s.fate for s in a if s.kind == "kill"} == {"same_id", "new_id"}


def test_deploy_messages() -> None:
    cfg = DeployConfig()
    rng = random.Random(3)
    specs: list = []
    for i in range(2000):
        specs.append(deploy_message(cfg, rng, i, specs))
    assert {s.kind for s in specs} == {"request", "stream", "send"}
    sleeps = [s.sleep_ms for s in specs]
    assert min(sleeps) >= 50 and max(sleeps) <= 5000
    # Log-uniform: most are short, a good share run for seconds.
    assert sum(x < 500 for x in sleeps) > 900 and sum(x > 2000 for x in sleeps) > 200
    streams = [s for s in specs if s.kind == "stream"]
    assert all(2 <= s.chunks <= cfg.max_chunks for s in streams)
    dups = [s for s in specs if s.dup]
    assert dups and all(any(o.key == d.key and not o.dup for o in specs) for d in dups)
    assert all(s.key == f"k{s.i}" for s in specs if not s.dup)


def test_the_runs_are_judged_case_by_case(tmp_path: Path) -> None:
    """The checks of "run once" and "not on two agents at once" can fail, and tell each
    case apart: a ledger made by hand, one key per case, judged as the harness judges a
    run's ledger."""
    from reach_cli.tools.chaos.deploy import _DeployRun, _Run1
    from reach_cli.tools.chaos.harness import _Rec
    from reach_cli.tools.chaos.report import DrainRecord

    run = _DeployRun(DeployConfig(dir=str(tmp_path)), None)
    t = 1_000_000
    run.killed_pids = {20: t + 500}  # pid 20 SIGKILLed at +0.5 s
    run.drain_log = [DrainRecord("w0-g0", 10, "w0-g1", 0, 0.0, t + 1000, True, 1)]  # pid 10
    run.redis_windows = [(t + 10_000, t + 10_300)]  # Redis away from +10 s to +10.3 s

    def r(key: str, n: int, pid: int, fence: int, start: int, end: int | None, how: str) -> _Run1:
        return _Run1(
            key, n, f"a{pid}", pid, fence, t + start, None if end is None else t + end, how
        )

    runs = {
        "once": [r("once", 1, 30, 1, 0, 900, "ok")],
        # Killed mid-run, run again elsewhere: fine.
        "killed": [r("killed", 1, 20, 1, 0, None, ""), r("killed", 2, 30, 2, 3000, 3400, "ok")],
        # SIGTERMed mid-run, ran to its end, then ran again on another agent: the drain bug.
        "drained": [
            r("drained", 1, 10, 1, 500, 2500, "ok"),
            r("drained", 2, 30, 2, 4000, 6000, "ok"),
        ],
        # A stream the runtime closed, retried: fine.
        "closed": [
            r("closed", 1, 30, 1, 100, 200, "GeneratorExit"),
            r("closed", 2, 30, 2, 700, 800, "ok"),
        ],
        # Cancelled after its worker's SIGTERM, run again: cut by the drain.
        "cancelled": [
            r("cancelled", 1, 10, 1, 0, 1500, "CancelledError"),
            r("cancelled", 2, 30, 2, 3000, 3100, "ok"),
        ],
        # Ended while Redis was away, run again by the same worker: the outage case.
        "outage": [
            r("outage", 1, 30, 1, 9000, 10_100, "ok"),
            r("outage", 2, 30, 2, 10_500, 11_600, "ok"),
        ],
        # Two runs at once on two live agents.
        "overlap": [
            r("overlap", 1, 30, 1, 0, 2000, "ok"),
            r("overlap", 2, 40, 2, 1000, 3000, "ok"),
        ],
        # Started, never ended, its worker not killed.
        "hung": [r("hung", 1, 40, 1, 0, None, ""), r("hung", 2, 30, 2, 5000, 5100, "ok")],
    }
    recs = {
        k: _Rec(True, "succeeded", t, len(rs), rs[-1].agent, rs[-1].fence) for k, rs in runs.items()
    }
    fx = {f"ends:{k}": str(sum(x.how == "ok" for x in rs)) for k, rs in runs.items()}
    seen: dict[str, list[str]] = {}
    j = run.judge_runs(
        sorted(runs), recs, runs, fx, t + 60_000, lambda k, x: seen.setdefault(k, []).append(x)
    )
    assert (j.cut, j.failed, j.by_drain) == (1, {"GeneratorExit": 1}, 1)
    assert (j.again_outage, j.again_outage_drain) == (1, 0)
    assert (j.unexplained, j.unfinished, j.overlapping, j.unmatched) == (3, 1, 2, 0)
    assert j.twice == 3  # drained, outage, overlap ran to their end twice
    # The examples name the keys: drained (its first run, SIGTERMed while it ran, ended and
    # the key ran again elsewhere), overlap and hung are run again for no reason; overlap
    # and hung (its run never ended) overlap their second runs.
    assert {x.split(" ")[0] for x in seen["run again"]} == {"drained", "overlap", "hung"}
    assert {x.split(" ")[0] for x in seen["overlap"]} == {"overlap", "hung"}
    assert [x.split(" ")[0] for x in seen["unfinished"]] == ["hung"]
    assert [x.split(" ")[0] for x in seen["cancelled by the drain"]] == ["cancelled"]
    assert [x.split(" ")[0] for x in seen["run again: ended while Redis was away"]] == ["outage"]

"""Pick benchmark: time per ``Router.pick`` with 10 / 100 / 1,000 eligible agents per policy.

Pure CPU, no Redis. Each cell is the median over ``--repeats`` runs of up to ``--picks``
picks (µs per pick; a run is cut to ~25 ms for the slow rows), after a warm-up that builds
the cached structures (the round-robin heaps, the ketama ring). Agents have weights 1-3 and
random queue depths; 10 % of them have some of this client's in-flight work. Rows:

* ``weighted_rr``, ``least_conn``, ``consistent_hash``, ``direct``: the cached path, with
  ``version=`` passed as the client's registry view does (same version = same membership);
* ``consistent_hash c=1.25``: bounded loads; with outstanding work on most agents, so most
  picks pay the O(N) load total;
* ``* (no version)``: the same call without ``version=``, so the static eligibility filter runs
  on every pick (what a caller without a change counter pays);
* ``eligible()``: the full diagnostic filter, for reference.

Target: < 20 µs per pick at 1,000 agents for weighted_rr and consistent_hash.

    python bench/pick_bench.py
    python bench/pick_bench.py --json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reach.registry import AgentInfo
from reach.routing import Inflight, Router, eligible
from reach.routing.split import Split

CAP = "text.summarize"
SIZES = (10, 100, 1000)
TARGET_US = 20.0


def make_pool(n: int, rnd: random.Random) -> list[AgentInfo]:
    return [
        AgentInfo(
            agent_id=f"agent-{i:05d}",
            weight=float(rnd.choice((1, 2, 3))),
            capabilities=[CAP],
            metadata={"region": rnd.choice(("eu", "us"))},
            ready=True,
            ready_ms=1,
            queue_depth=rnd.randrange(0, 5),
            max_queue=1000,
        )
        for i in range(n)
    ]


def time_per_call(fn: Callable[[int], object], picks: int, repeats: int) -> float:
    """Median µs per call over ``repeats`` runs of up to ``picks`` calls (~25 ms per run)."""
    t0 = time.perf_counter()
    for i in range(50):  # warm-up: builds the caches
        fn(i)
    warm = (time.perf_counter() - t0) / 50
    calls = max(50, min(picks, int(0.025 / max(warm, 1e-9))))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def bench_size(n: int, picks: int, repeats: int, seed: int) -> dict[str, float]:
    rnd = random.Random(seed)
    pool = make_pool(n, rnd)
    sessions = [f"session-{i}" for i in range(picks)]
    targets = [pool[rnd.randrange(n)].agent_id for _ in range(picks)]
    out: dict[str, float] = {}

    def router(**kw: Any) -> Router:
        inflight = Inflight({a.agent_id: 1 for a in pool if rnd.random() < 0.1})
        return Router(rng=random.Random(seed), inflight=inflight, **kw)

    def cell(name: str, fn: Callable[[int], object]) -> None:
        out[name] = time_per_call(fn, picks, repeats)

    for version in (1, None):
        sfx = "" if version == 1 else " (no version)"
        r_wrr, r_lc, r_ch, r_d = router(), router(), router(), router()

        def wrr(i: int, r: Router = r_wrr, v: int | None = version) -> object:
            return r.pick(CAP, pool, version=v)

        def least(i: int, r: Router = r_lc, v: int | None = version) -> object:
            return r.pick(CAP, pool, policy="least_conn", version=v)

        def chash(i: int, r: Router = r_ch, v: int | None = version) -> object:
            s = sessions[i % picks]
            return r.pick(CAP, pool, policy="consistent_hash", session_id=s, version=v)

        def direct(i: int, r: Router = r_d, v: int | None = version) -> object:
            return r.pick(CAP, pool, policy="direct", target=targets[i % picks], version=v)

        cell("weighted_rr" + sfx, wrr)
        cell("least_conn" + sfx, least)
        cell("consistent_hash" + sfx, chash)
        cell("direct" + sfx, direct)

    r_b = Router(
        rng=random.Random(seed),
        inflight=Inflight({a.agent_id: 2 for a in pool}),
        hash_load_factor=1.25,
    )
    r_m = router()

    def bounded(i: int) -> object:
        s = sessions[i % picks]
        return r_b.pick(CAP, pool, policy="consistent_hash", session_id=s, version=1)

    cell("consistent_hash c=1.25", bounded)

    # A capability split between application versions (docs/routing.md, *Version
    # canaries*): the same pool, its agents running 1.4 or 1.5, a 90/10 split; the version
    # drawn by share per message as for a message without a session.
    versioned = [msgspec.structs.replace(a, app_version=rnd.choice(("1.4", "1.5"))) for a in pool]
    split, r_s, r_v = Split.parse("1.4=90 1.5=10"), router(), router()
    cell("weighted_rr, versioned pool", lambda i: r_v.pick(CAP, versioned, version=2))
    cell(
        "weighted_rr, split 1.4=90 1.5=10",
        lambda i: r_s.pick(CAP, versioned, version=2, split=split),
    )
    cell("pick_many (broadcast)", lambda i: r_m.pick_many(CAP, pool, version=1))
    cell("eligible()", lambda i: eligible(pool, capability=CAP, where={"region": "eu"}))
    return out


def bench(picks: int, repeats: int, seed: int) -> dict[str, dict[int, float]]:
    rows: dict[str, dict[int, float]] = {}
    for n in SIZES:
        for name, us in bench_size(n, picks, repeats, seed).items():
            rows.setdefault(name, {})[n] = us
    order = [
        "weighted_rr",
        "least_conn",
        "consistent_hash",
        "direct",
        "consistent_hash c=1.25",
        "pick_many (broadcast)",
        "weighted_rr (no version)",
        "least_conn (no version)",
        "consistent_hash (no version)",
        "direct (no version)",
        "eligible()",
        "weighted_rr, versioned pool",
        "weighted_rr, split 1.4=90 1.5=10",
    ]
    return {k: rows[k] for k in order}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--picks", type=int, default=2000, help="picks per run")
    ap.add_argument("--repeats", type=int, default=7, help="runs per cell (median taken)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    rows = bench(args.picks, args.repeats, args.seed)
    ok = all(rows[p][1000] < TARGET_US for p in ("weighted_rr", "consistent_hash"))
    if args.json:
        out = {
            "unit": "us_per_pick",
            "median_of": args.repeats,
            "picks_per_run": args.picks,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "target_us_at_1000": TARGET_US,
            "target_met": ok,
            "results": {k: {str(n): round(v, 2) for n, v in r.items()} for k, r in rows.items()},
        }
        print(json.dumps(out, indent=2))
    else:
        w = max(map(len, rows)) + 2
        print(
            f"µs per pick (median of {args.repeats} runs of <= {args.picks} picks), "
            f"Python {platform.python_version()}"
        )
        print("policy".ljust(w) + "".join(f"{n:>10}" for n in SIZES))
        for name, r in rows.items():
            print(name.ljust(w) + "".join(f"{r[n]:>10.2f}" for n in SIZES))
        print(
            f"target < {TARGET_US:g} µs at 1,000 agents (weighted_rr, consistent_hash): "
            + ("met" if ok else "NOT met")
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""How each routing policy spreads traffic (deterministic: fixed seeds, no Redis).

* weighted_rr: share and longest run of one agent over 10,000 picks, weights 4:1 and 3:2:1;
* least_conn: a discrete-event simulation, one fast agent (service 1 ms) and one slow
  (service 5 ms), both weight 1, 16 callers in a closed loop: share of each;
* consistent_hash: 10 agents, 10,000 sessions: load spread (max / mean), the fraction of
  sessions that move when one agent leaves and when one joins (ideal 1/N), and the same
  spread with bounded load c = 1.25 under concurrent load.

Run:  python bench/routing_distribution.py [--json]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reach.registry import AgentInfo
from reach.routing import Router

CAP = "bench.route"


def agent(i: str, weight: float = 1.0) -> AgentInfo:
    return AgentInfo(agent_id=i, weight=weight, capabilities=[CAP], state="active", ready=True)


def wrr(weights: dict[str, float], picks: int = 10_000) -> dict[str, Any]:
    r = Router(slow_start_s=0, rng=random.Random(1))
    agents = [agent(i, w) for i, w in weights.items()]
    seq = [r.pick(CAP, agents, policy="weighted_rr", version=1).agent_id for _ in range(picks)]
    longest, run = 1, 1
    for a, b in itertools.pairwise(seq):
        run = run + 1 if a == b else 1
        longest = max(longest, run)
    total = sum(weights.values())
    c = Counter(seq)
    return {
        "weights": weights,
        "share": {k: c[k] / picks for k in weights},
        "ideal": {k: w / total for k, w in weights.items()},
        "longest_run": longest,
    }


def least_conn(requests: int = 20_000, callers: int = 16) -> dict[str, Any]:
    service = {"fast": 1.0, "slow": 5.0}
    r = Router(slow_start_s=0, rng=random.Random(2))
    agents = [agent("fast"), agent("slow")]
    busy_until = {"fast": 0.0, "slow": 0.0}
    events: list[tuple[float, int, str]] = []  # (done at, caller, agent)
    got: Counter[str] = Counter()

    def send(caller: int, now: float) -> None:
        a = r.pick(CAP, agents, policy="least_conn", version=1).agent_id
        r.inflight.add(a)
        busy_until[a] = max(busy_until[a], now) + service[a]
        heapq.heappush(events, (busy_until[a], caller, a))
        got[a] += 1

    for caller in range(callers):
        send(caller, 0.0)
    while events and got.total() < requests:
        now, caller, done = heapq.heappop(events)
        r.inflight.done(done)
        send(caller, now)
    sent = got.total()
    return {"service_ms": service, "callers": callers, "share": {k: got[k] / sent for k in got}}


def consistent_hash(n: int = 10, sessions: int = 10_000) -> dict[str, Any]:
    keys = [f"session-{i}" for i in range(sessions)]
    agents = [agent(f"agent-{i}") for i in range(n)]

    def owners(ags: list[AgentInfo], version: int) -> dict[str, str]:
        r = Router(slow_start_s=0)
        return {
            k: r.pick(CAP, ags, policy="consistent_hash", session_id=k, version=version).agent_id
            for k in keys
        }

    base = owners(agents, 1)
    load = Counter(base.values())
    left = owners(agents[:-1], 2)
    joined = owners([*agents, agent(f"agent-{n}")], 3)
    moved_leave = sum(base[k] != left[k] for k in keys) / sessions
    moved_join = sum(base[k] != joined[k] for k in keys) / sessions
    # Bounded load: every session stays in flight, so the load cap matters.
    rb = Router(slow_start_s=0, hash_load_factor=1.25)
    bounded: Counter[str] = Counter()
    for k in keys:
        a = rb.pick(CAP, agents, policy="consistent_hash", session_id=k, version=1).agent_id
        rb.inflight.add(a)
        bounded[a] += 1
    mean = sessions / n
    return {
        "agents": n,
        "sessions": sessions,
        "max_over_mean": max(load.values()) / mean,
        "min_over_mean": min(load.values()) / mean,
        "moved_when_one_leaves": moved_leave,
        "moved_when_one_joins": moved_join,
        "ideal_leave": 1 / n,
        "ideal_join": 1 / (n + 1),
        "bounded_c": 1.25,
        "bounded_max_over_mean": max(bounded.values()) / mean,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {
        "weighted_rr_4_1": wrr({"a": 4, "b": 1}),
        "weighted_rr_3_2_1": wrr({"a": 3, "b": 2, "c": 1}),
        "least_conn": least_conn(),
        "consistent_hash": consistent_hash(),
    }
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for name in ("weighted_rr_4_1", "weighted_rr_3_2_1"):
        w = out[name]
        shares = ", ".join(
            f"{k} {v:.2%} (ideal {w['ideal'][k]:.2%})" for k, v in w["share"].items()
        )
        print(f"{name}: {shares}; longest run of one agent: {w['longest_run']}")
    lc = out["least_conn"]
    print(
        f"least_conn, fast 1 ms vs slow 5 ms, {lc['callers']} callers: "
        + ", ".join(f"{k} {v:.1%}" for k, v in sorted(lc["share"].items()))
    )
    ch = out["consistent_hash"]
    print(
        f"consistent_hash, {ch['agents']} agents, {ch['sessions']} sessions: load max/mean "
        f"{ch['max_over_mean']:.2f}, min/mean {ch['min_over_mean']:.2f}; moved when one leaves "
        f"{ch['moved_when_one_leaves']:.2%} (ideal {ch['ideal_leave']:.2%}), when one joins "
        f"{ch['moved_when_one_joins']:.2%} (ideal {ch['ideal_join']:.2%}); bounded load "
        f"c={ch['bounded_c']}: max/mean {ch['bounded_max_over_mean']:.2f}"
    )


if __name__ == "__main__":
    main()

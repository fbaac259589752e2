"""Routing: eligibility reasons, the four policies, slow start, back-pressure, breakers."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from uhashring import HashRing

from reach.breaker import Breakers
from reach.errors import ConfigError, NoAgentAvailable, Overloaded
from reach.registry import AgentInfo
from reach.routing import (
    MIN_WEIGHT,
    Inflight,
    Router,
    eligible,
    ketama_points,
    over_bound,
    slow_start_factor,
)
from reach.routing import ring as ketama

CAP = "text.summarize"
NOW = 1_700_000_000.0  # epoch seconds of the fake clock


class FakeClock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def agent(agent_id: str, **kw: Any) -> AgentInfo:
    kw.setdefault("capabilities", [CAP])
    kw.setdefault("ready", True)
    return AgentInfo(agent_id=agent_id, **kw)


def agents(weights: Sequence[float], **kw: Any) -> list[AgentInfo]:
    return [agent(f"a{i}", weight=w, **kw) for i, w in enumerate(weights)]


def router(seed: int = 7, **kw: Any) -> Router:
    kw.setdefault("clock", FakeClock())
    return Router(rng=random.Random(seed), **kw)


def max_run(seq: Sequence[object]) -> int:
    best = run = 1
    for prev, cur in pairwise(seq):
        run = run + 1 if cur == prev else 1
        best = max(best, run)
    return best


def nginx_swrr(weights: Sequence[float], picks: int) -> list[int]:
    """The reference O(N) smooth weighted round-robin of nginx."""
    cur = [0.0] * len(weights)
    total = sum(weights)
    out = []
    for _ in range(picks):
        for i, w in enumerate(weights):
            cur[i] += w
        best = max(range(len(weights)), key=cur.__getitem__)
        cur[best] -= total
        out.append(best)
    return out


# -- eligibility reasons ------------------------------------------------------------------
def reason_of(fn: Any) -> str:
    with pytest.raises(NoAgentAvailable) as ei:
        fn()
    assert ei.value.capability == CAP
    assert str(ei.value)
    return ei.value.reason


def test_eligible_keeps_order_and_filters() -> None:
    pool = [
        agent("eu1", metadata={"region": "eu"}),
        agent("us1", metadata={"region": "us"}),
        agent("eu2", metadata={"region": "eu"}, draining=True),
        agent("eu3", metadata={"region": "eu"}, ready=False),
        agent("eu4", metadata={"region": "eu"}, state="probation"),
        agent("eu5", metadata={"region": "eu"}, capabilities=["other"]),
        agent("eu6", metadata={"region": "eu"}, max_queue=2, queue_depth=1),
        agent("eu7", metadata={"region": "eu"}),
    ]
    got = eligible(
        pool,
        capability=CAP,
        where={"region": "eu"},
        is_open=lambda a: a == "eu7",
        local_inflight={"eu6": 1},
    )
    assert [a.agent_id for a in got] == ["eu1"]
    assert [a.agent_id for a in eligible(pool, capability=CAP)] == ["eu1", "us1", "eu6", "eu7"]


def test_reason_no_agent_with_hint() -> None:
    pool = [agent("a", capabilities=["text.summarise"])]
    with pytest.raises(NoAgentAvailable) as ei:
        eligible(pool, capability="text.summarize")
    assert ei.value.reason == "no_agent"
    assert "text.summarise" in str(ei.value)  # did you mean
    assert reason_of(lambda: eligible([], capability=CAP)) == "no_agent"


def test_reason_no_live_agent() -> None:
    pool = [agent("a", state="probation"), agent("b", state="evicted")]
    with pytest.raises(NoAgentAvailable) as ei:
        eligible(pool, capability=CAP)
    assert ei.value.reason == "no_agent"
    assert "1 probation" in str(ei.value) and "1 evicted" in str(ei.value)


def test_reason_filter() -> None:
    pool = [agent("a", metadata={"region": "us"}), agent("b", metadata={"region": "ap"})]
    with pytest.raises(NoAgentAvailable) as ei:
        eligible(pool, capability=CAP, where={"region": "eu"})
    assert ei.value.reason == "filter"
    assert "ap, us" in str(ei.value)


def test_reason_filter_names_the_real_cause() -> None:
    # the agents that match are draining: that is the cause, not the filter
    pool = [
        agent("a", metadata={"region": "eu"}, draining=True),
        agent("b", metadata={"region": "us"}),
    ]
    assert reason_of(lambda: eligible(pool, capability=CAP, where={"region": "eu"})) == "draining"
    # nothing matches, and the others are draining: the filter is the cause
    pool = [agent("a", metadata={"region": "us"}, draining=True)]
    assert reason_of(lambda: eligible(pool, capability=CAP, where={"region": "eu"})) == "filter"


def test_reason_draining() -> None:
    pool = [agent("a", draining=True), agent("b", draining=True, ready=False)]
    assert reason_of(lambda: eligible(pool, capability=CAP)) == "draining"


def test_reason_not_ready() -> None:
    pool = [agent("a", ready=False), agent("b", ready=False)]
    assert reason_of(lambda: eligible(pool, capability=CAP)) == "not_ready"
    # one starting, one draining: "retry soon" is the useful answer
    pool = [agent("a", ready=False), agent("b", draining=True)]
    assert reason_of(lambda: eligible(pool, capability=CAP)) == "not_ready"


def test_reason_breaker_open() -> None:
    pool = agents([1, 1])
    assert reason_of(lambda: eligible(pool, capability=CAP, is_open=lambda a: True)) == (
        "breaker_open"
    )


def test_reason_overloaded() -> None:
    pool = [agent("a", max_queue=3, queue_depth=3), agent("b", max_queue=5, queue_depth=2)]
    with pytest.raises(Overloaded) as ei:
        eligible(pool, capability=CAP, local_inflight={"b": 3})
    assert ei.value.reason == "overloaded"
    assert "a 3+0/3" in str(ei.value)
    # open breakers and full queues: the usable ones are full, so it is back-pressure
    pool = [agent("a", max_queue=1, queue_depth=1), agent("b")]
    with pytest.raises(Overloaded):
        eligible(pool, capability=CAP, is_open=lambda a: a == "b")


def test_over_bound() -> None:
    assert not over_bound(agent("a", queue_depth=10**6))  # max_queue 0: unbounded
    assert over_bound(agent("a", max_queue=2, queue_depth=2))
    assert over_bound(agent("a", max_queue=2, queue_depth=1), {"a": 1})
    assert not over_bound(agent("a", max_queue=2, queue_depth=1), {"b": 5})


@pytest.mark.parametrize("policy", ["weighted_rr", "least_conn", "consistent_hash"])
@pytest.mark.parametrize(
    ("pool", "kw", "reason"),
    [
        ([], {}, "no_agent"),
        ([agent("a", state="probation")], {}, "no_agent"),
        ([agent("a", metadata={"region": "us"})], {"where": {"region": "eu"}}, "filter"),
        ([agent("a", draining=True)], {}, "draining"),
        ([agent("a", ready=False)], {}, "not_ready"),
        ([agent("a", max_queue=1, queue_depth=1)], {}, "overloaded"),
    ],
)
def test_router_raises_each_reason(
    policy: str, pool: list[AgentInfo], kw: dict[str, Any], reason: str
) -> None:
    r = router()
    for version in (None, 1):

        def call(v: int | None = version) -> AgentInfo:
            return r.pick(CAP, pool, policy=policy, session_id="s", version=v, **kw)

        assert reason_of(call) == reason


@pytest.mark.parametrize("policy", ["weighted_rr", "least_conn", "consistent_hash"])
def test_router_breaker_open_reason(policy: str) -> None:
    br = Breakers(min_requests=1, clock=FakeClock())
    r = router(breakers=br)
    pool = agents([1, 1, 1])
    for a in pool:
        br.record(a.agent_id, ok=False)
    assert reason_of(lambda: r.pick(CAP, pool, policy=policy, session_id="s")) == "breaker_open"
    assert reason_of(lambda: r.pick_many(CAP, pool)) == "breaker_open"


def test_bad_calls() -> None:
    r = router()
    pool = agents([1])
    with pytest.raises(ConfigError, match="Unknown routing policy"):
        r.pick(CAP, pool, policy="random")
    with pytest.raises(ConfigError, match="session_id"):
        r.pick(CAP, pool, policy="consistent_hash")
    with pytest.raises(ConfigError, match="target"):
        r.pick(CAP, pool, policy="direct")
    with pytest.raises(ConfigError, match="pick_many"):
        r.pick(CAP, pool, policy="broadcast")
    with pytest.raises(ConfigError):
        Router(hash_load_factor=1.0)
    with pytest.raises(ConfigError):
        Router(slow_start_floor=0)


# -- weighted round-robin -----------------------------------------------------------------
def test_wrr_four_to_one_is_proportional_and_interleaved() -> None:
    r = router()
    pool = agents([4, 1])
    seq = [r.pick(CAP, pool, version=1).agent_id for _ in range(10_000)]
    counts = Counter(seq)
    assert abs(counts["a0"] / 10_000 - 0.8) <= 0.01
    assert abs(counts["a1"] / 10_000 - 0.2) <= 0.01
    assert max_run(seq) <= 4  # A A A A B is the longest a 4:1 split can avoid
    # never two B in a row
    assert "a1,a1" not in ",".join(seq)


def test_wrr_heavy_agent_is_interleaved_with_light_ones() -> None:
    # plain deadline/stride scheduling would give the heavy agent 10 picks in a row
    r = router()
    pool = agents([10] + [1] * 10)
    seq = [r.pick(CAP, pool).agent_id for _ in range(2000)]
    assert Counter(seq)["a0"] == 1000
    assert max_run(seq) <= 3
    assert max_run(nginx_swrr([10] + [1] * 10, 2000)) <= 3


def test_wrr_equal_weights_is_round_robin() -> None:
    r = router()
    pool = agents([1] * 5)
    seq = [r.pick(CAP, pool, version=3).agent_id for _ in range(50)]
    for i in range(0, 50, 5):
        assert sorted(seq[i : i + 5]) == [f"a{j}" for j in range(5)]


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.integers(min_value=1, max_value=10), min_size=2, max_size=8),
    seed=st.integers(min_value=0, max_value=10**6),
)
def test_wrr_lag_stays_within_two_picks(weights: list[int], seed: int) -> None:
    r = router(seed)
    pool = agents(weights)
    total = sum(weights)
    counts = [0] * len(weights)
    picks = 40 * total
    seq = []
    for t in range(1, picks + 1):
        i = int(r.pick(CAP, pool, version=1).agent_id[1:])
        counts[i] += 1
        seq.append(i)
        if t % 7 == 0 or t == picks:
            for j, w in enumerate(weights):
                assert abs(counts[j] - w * t / total) < 2
    # as smooth as nginx's reference algorithm, give or take one
    assert max_run(seq) <= max_run(nginx_swrr(weights, picks)) + 1


def test_wrr_membership_change_keeps_proportions() -> None:
    r = router()
    pool = agents([1, 1, 1])
    seq = [r.pick(CAP, pool, version=1).agent_id for _ in range(300)]
    assert Counter(seq) == {"a0": 100, "a1": 100, "a2": 100}
    pool2 = [*pool, agent("a3", weight=3)]
    seq = [r.pick(CAP, pool2, version=2).agent_id for _ in range(600)]
    c = Counter(seq)
    assert c["a3"] in range(298, 303)
    assert all(c[f"a{i}"] in range(98, 103) for i in range(3))
    seq = [r.pick(CAP, pool2[1:], version=3).agent_id for _ in range(500)]
    c = Counter(seq)
    assert "a0" not in c
    assert c["a3"] in range(298, 303)


def test_wrr_random_start_differs_between_clients() -> None:
    pool = agents([1] * 10)
    firsts = {router(seed).pick(CAP, pool).agent_id for seed in range(30)}
    assert len(firsts) > 5


def test_wrr_zero_weight_is_standby() -> None:
    r = router()
    pool = [agent("main", weight=1), agent("standby", weight=0)]
    assert Counter(r.pick(CAP, pool, version=1).agent_id for _ in range(1000))["standby"] <= 1
    pool[0].draining = True
    assert r.pick(CAP, pool).agent_id == "standby"
    assert MIN_WEIGHT > 0


def test_wrr_skips_full_and_open_agents() -> None:
    br = Breakers(min_requests=1, clock=FakeClock())
    r = router(breakers=br)
    inflight = r.inflight
    pool = [agent("a"), agent("b", max_queue=2), agent("c")]
    inflight.add("b", 2)
    br.record("c", ok=False)
    assert {r.pick(CAP, pool, version=1).agent_id for _ in range(30)} == {"a"}
    inflight.done("b")
    assert {r.pick(CAP, pool, version=1).agent_id for _ in range(30)} == {"a", "b"}
    # load fields may change under the same version: they are read on each pick
    pool[0].max_queue = 1
    pool[0].queue_depth = 1
    assert {r.pick(CAP, pool, version=1).agent_id for _ in range(30)} == {"b"}
    inflight.add("b")
    with pytest.raises(Overloaded):
        r.pick(CAP, pool, version=1)


@pytest.mark.parametrize("policy", ["weighted_rr", "least_conn", "consistent_hash"])
def test_many_blocked_agents_fall_back_to_the_usable_ones(policy: str) -> None:
    br = Breakers(min_requests=1, clock=FakeClock())
    r = router(breakers=br)
    pool = agents([5] * 40 + [1, 1])
    for a in pool[:40]:
        br.record(a.agent_id, ok=False)
    got = {
        r.pick(CAP, pool, policy=policy, session_id=f"s{i}", version=1).agent_id for i in range(40)
    }
    assert got == {"a40", "a41"}
    if policy == "consistent_hash":  # still sticky
        again = [r.pick(CAP, pool, policy=policy, session_id=f"s{i}") for i in range(40)]
        assert again == [r.pick(CAP, pool, policy=policy, session_id=f"s{i}") for i in range(40)]
    for a in pool[40:]:
        a.max_queue = a.queue_depth = 1
    with pytest.raises(Overloaded):
        r.pick(CAP, pool, policy=policy, session_id="s", version=1)
    with pytest.raises(NoAgentAvailable):
        r.pick_many(CAP, pool, version=1)


def test_policy_none_is_the_default() -> None:
    r = router()
    assert r.pick(CAP, agents([1]), policy=None).agent_id == "a0"


def test_avoid_prefers_another_agent_but_is_soft() -> None:
    for policy in ("weighted_rr", "least_conn", "consistent_hash"):
        r = router()
        pool = agents([1, 1, 1])
        for i in range(30):
            got = r.pick(CAP, pool, policy=policy, session_id=f"s{i}", avoid={"a0", "a1"})
            assert got.agent_id == "a2"
        assert r.pick(CAP, pool[:1], policy=policy, session_id="s", avoid={"a0"}).agent_id == "a0"
    r = router()
    pool = [agent("agent-1"), agent("agent-10")]
    assert {r.pick(CAP, pool, avoid="agent-10").agent_id for _ in range(10)} == {"agent-1"}


def test_candidates_may_hold_other_capabilities_and_filters() -> None:
    r = router()
    pool = [
        agent("x", capabilities=["other"]),
        agent("eu", metadata={"region": "eu"}),
        agent("us", metadata={"region": "us"}),
    ]
    for _ in range(5):
        assert r.pick(CAP, pool, where={"region": "eu"}, version=1).agent_id == "eu"
        assert r.pick(CAP, pool, where={"region": "us"}, version=1).agent_id == "us"
    assert r.pick("other", pool, version=1).agent_id == "x"


def test_same_version_with_a_changed_list_is_detected() -> None:
    r = router()
    pool = agents([1, 1])
    r.pick(CAP, pool, version=5)
    other = [agent("b0"), agent("b1")]
    assert {r.pick(CAP, other, version=5).agent_id for _ in range(4)} == {"b0", "b1"}


def test_without_version_changes_are_seen_at_once() -> None:
    r = router()
    pool = agents([1, 1])
    r.pick(CAP, pool)
    pool[0].draining = True
    assert {r.pick(CAP, pool).agent_id for _ in range(6)} == {"a1"}
    pool[0].draining = False
    pool[1].ready = False
    assert {r.pick(CAP, pool).agent_id for _ in range(6)} == {"a0"}


def test_forget_drops_cached_state() -> None:
    r = router()
    pool = agents([1, 1])
    r.pick(CAP, pool, version=1)
    r.pick("other.cap", agents([1], capabilities=["other.cap"]), version=1)
    assert {k[0] for k in r._states} == {CAP, "other.cap"}
    r.forget(CAP)
    assert {k[0] for k in r._states} == {"other.cap"}
    r.forget()
    assert not r._states and not r._points
    assert r.pick(CAP, pool, version=1).agent_id in {"a0", "a1"}  # rebuilt from scratch


# -- slow start ---------------------------------------------------------------------------
def test_slow_start_factor_ramps_linearly_in_steps() -> None:
    ms = 10_000.0
    assert slow_start_factor(0, 5.0, ms) == (1.0, math.inf)  # unknown ready time
    assert slow_start_factor(1000, 5000.0, 0) == (1.0, math.inf)  # disabled
    f, until = slow_start_factor(1000, 1000.0, ms)
    assert f == pytest.approx(0.1) and until == 1500.0
    f, _ = slow_start_factor(1000, 6000.0, ms)
    assert f == pytest.approx(0.55)
    f, until = slow_start_factor(1000, 10_999.0, ms)
    assert f == pytest.approx(0.1 + 0.9 * 19 / 20) and until == 11_000.0
    assert slow_start_factor(1000, 11_000.0, ms) == (1.0, math.inf)
    assert slow_start_factor(5000, 1000.0, ms)[0] == pytest.approx(0.1)  # clock skew


def test_slow_start_ramps_a_fresh_agent_in_wrr() -> None:
    clock = FakeClock()
    r = router(clock=clock, slow_start_s=10.0)
    now_ms = int(clock.t * 1000)
    pool = [agent("old", ready_ms=now_ms - 60_000), agent("new", ready_ms=now_ms)]

    def share() -> float:
        return Counter(r.pick(CAP, pool, version=1).agent_id for _ in range(2000))["new"] / 2000

    shares = []
    for t in (0.0, 2.5, 5.0, 7.5, 10.0):
        clock.t = NOW + t
        shares.append(share())
    expected = [0.1 / 1.1, 0.325 / 1.325, 0.55 / 1.55, 0.775 / 1.775, 0.5]
    for got, want in zip(shares, expected, strict=True):
        assert got == pytest.approx(want, abs=0.01)
    assert shares == sorted(shares)


def test_slow_start_in_least_conn() -> None:
    clock = FakeClock()
    r = router(clock=clock, slow_start_s=10.0)
    now_ms = int(clock.t * 1000)
    pool = [agent("old", queue_depth=5), agent("new", ready_ms=now_ms)]
    # (5+1)/1 = 6 for old vs (0+1)/0.1 = 10 for new: the fresh agent is spared
    assert r.pick(CAP, pool, policy="least_conn").agent_id == "old"
    clock.t = NOW + 10.0
    assert r.pick(CAP, pool, policy="least_conn").agent_id == "new"


def test_slow_start_does_not_move_sessions() -> None:
    clock = FakeClock()
    r = router(clock=clock, slow_start_s=10.0)
    now_ms = int(clock.t * 1000)
    pool = [agent(f"a{i}", ready_ms=now_ms if i == 0 else 1) for i in range(5)]
    before = [r.pick(CAP, pool, policy="consistent_hash", session_id=f"s{i}") for i in range(500)]
    clock.t += 20
    after = [r.pick(CAP, pool, policy="consistent_hash", session_id=f"s{i}") for i in range(500)]
    assert before == after


# -- least connections --------------------------------------------------------------------
def test_least_conn_prefers_lower_outstanding_per_weight() -> None:
    r = router()
    pool = [agent("busy", queue_depth=4), agent("idle")]
    assert r.pick(CAP, pool, policy="least_conn").agent_id == "idle"
    r.inflight["idle"] = 5
    assert r.pick(CAP, pool, policy="least_conn").agent_id == "busy"
    pool = [agent("big", weight=4, queue_depth=6), agent("small", weight=1, queue_depth=1)]
    # (6+1)/4 = 1.75 < (1+1)/1 = 2
    assert r.pick(CAP, pool, policy="least_conn").agent_id == "big"


def test_least_conn_ties_are_random_with_a_seed() -> None:
    pool = agents([1, 1, 1, 1])
    seq = [router(3).pick(CAP, pool, policy="least_conn").agent_id for _ in range(1)]
    assert seq == [router(3).pick(CAP, pool, policy="least_conn").agent_id]
    r = router(11)
    c = Counter(r.pick(CAP, pool, policy="least_conn", version=1).agent_id for _ in range(4000))
    assert set(c) == {"a0", "a1", "a2", "a3"}
    assert all(850 < n < 1150 for n in c.values())


def test_least_conn_slow_agent_gets_fewer_messages() -> None:
    """A simulation: each agent finishes work at its own rate; the slow one gets less."""
    r = router(5)
    pool = [agent("fast"), agent("slow")]
    rate = {"fast": 4, "slow": 1}  # completions per tick
    inflight = r.inflight
    got: Counter[str] = Counter()
    for _tick in range(2000):
        for _ in range(4):  # 4 new messages per tick
            a = r.pick(CAP, pool, policy="least_conn", version=1).agent_id
            inflight.add(a)
            got[a] += 1
        for aid, n in rate.items():
            inflight.done(aid, n)
    assert got["slow"] < got["fast"] / 2
    assert got["slow"] > 0


def test_least_conn_follows_weights_under_load() -> None:
    r = router()
    pool = [agent("w3", weight=3), agent("w1", weight=1)]
    inflight = r.inflight
    for _ in range(400):
        inflight.add(r.pick(CAP, pool, policy="least_conn", version=1).agent_id)
    assert inflight["w3"] == pytest.approx(300, abs=2)


def test_least_conn_skips_full_agents() -> None:
    r = router()
    pool = [agent("full", max_queue=1, queue_depth=1), agent("busy", queue_depth=50)]
    assert r.pick(CAP, pool, policy="least_conn").agent_id == "busy"


def test_inflight_counter() -> None:
    f = Inflight()
    f.add("a")
    f.add("a", 2)
    f.done("a")
    assert f == {"a": 2}
    f.done("a", 5)
    assert f == {}
    f.done("b")
    assert f.get("b", 0) == 0


def test_the_inflight_map_may_be_shared() -> None:
    counts = Inflight({"a0": 3})
    r = Router(inflight=counts, rng=random.Random(1), clock=FakeClock())
    assert r.pick(CAP, agents([1, 1]), policy="least_conn").agent_id == "a1"


# -- consistent hashing -------------------------------------------------------------------
def mapping(r: Router, pool: list[AgentInfo], n: int, **kw: Any) -> list[str]:
    return [
        r.pick(CAP, pool, policy="consistent_hash", session_id=f"session-{i}", **kw).agent_id
        for i in range(n)
    ]


def test_hash_same_session_same_agent() -> None:
    r = router()
    pool = agents([1] * 8)
    first = mapping(r, pool, 200, version=1)
    assert mapping(r, pool, 200, version=1) == first
    assert mapping(router(99), list(reversed(pool)), 200) == first  # any client, any order
    assert len(set(first)) == 8


def test_hash_points_and_mapping_match_uhashring() -> None:
    ring = HashRing(hash_fn="ketama")
    assert ketama_points("agent-x", 3) == [
        ring.hashi(f"agent-x-{v}", replica=i) for v in range(3) for i in range(4)
    ]
    ids = [f"agent-{i}" for i in range(7)]
    ref = HashRing({a: {"vnodes": 40, "weight": 1} for a in ids}, hash_fn="ketama")
    r = router()
    pool = [agent(a) for a in ids]
    sessions = [f"user-{i}" for i in range(3000)]
    got = [r.pick(CAP, pool, policy="consistent_hash", session_id=s).agent_id for s in sessions]
    assert got == [ref.get_node(s) for s in sessions]


def test_hash_weight_sets_virtual_nodes() -> None:
    r = router()
    pool = [agent("w2", weight=2), agent("w1a"), agent("w1b")]
    c = Counter(mapping(r, pool, 10_000))
    assert c["w2"] / 10_000 == pytest.approx(0.5, abs=0.06)


def test_hash_leave_moves_only_that_agents_sessions() -> None:
    n, sessions = 10, 10_000
    r = router()
    pool = agents([1] * n)
    before = mapping(r, pool, sessions, version=1)
    gone = "a3"
    after = mapping(r, [a for a in pool if a.agent_id != gone], sessions, version=2)
    moved = [i for i in range(sessions) if before[i] != after[i]]
    assert all(before[i] == gone for i in moved)
    assert len(moved) == before.count(gone)
    assert len(moved) / sessions == pytest.approx(1 / n, abs=0.04)


def test_hash_join_moves_about_one_in_n_plus_one() -> None:
    n, sessions = 10, 10_000
    r = router()
    pool = agents([1] * n)
    before = mapping(r, pool, sessions, version=1)
    after = mapping(r, [*pool, agent("new")], sessions, version=2)
    moved = [i for i in range(sessions) if before[i] != after[i]]
    assert all(after[i] == "new" for i in moved)
    assert len(moved) / sessions == pytest.approx(1 / (n + 1), abs=0.04)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=12),
    data=st.data(),
)
def test_hash_leave_property(n: int, data: st.DataObject) -> None:
    weights = data.draw(st.lists(st.sampled_from([0.5, 1, 2]), min_size=n, max_size=n))
    gone = data.draw(st.integers(min_value=0, max_value=n - 1))
    pool = agents(weights)
    r = router()
    before = mapping(r, pool, 1000)
    after = mapping(r, pool[:gone] + pool[gone + 1 :], 1000)
    for b, a in zip(before, after, strict=True):
        assert b == a or b == f"a{gone}"


def test_hash_unusable_owner_falls_through_the_ring() -> None:
    br = Breakers(min_requests=1, clock=FakeClock())
    r = router(breakers=br)
    pool = agents([1] * 5)
    before = mapping(r, pool, 1000, version=1)
    br.record("a2", ok=False)
    after = mapping(r, pool, 1000, version=1)
    for b, a in zip(before, after, strict=True):
        assert a != "a2"
        assert b == a or b == "a2"
    assert len({a for b, a in zip(before, after, strict=True) if b == "a2"}) > 1  # spread out


def test_hash_bounded_load_caps_each_agent() -> None:
    c = 1.25
    r = router(hash_load_factor=c)
    unbounded = router()
    pool = agents([1] * 10)
    inflight = r.inflight
    other = unbounded.inflight
    # the same hot session over and over, as multi-turn traffic from one user does
    for i in range(1000):
        s = f"s{i % 13}"
        got = r.pick(CAP, pool, policy="consistent_hash", session_id=s, version=1)
        inflight.add(got.agent_id)
        other.add(unbounded.pick(CAP, pool, policy="consistent_hash", session_id=s).agent_id)
        avg = (i + 1) / 10
        assert max(inflight.values()) <= math.ceil(c * avg)
    assert max(other.values()) > math.ceil(c * 100)  # without the bound it is far worse


def test_hash_bounded_load_keeps_sessions_sticky_when_load_is_even() -> None:
    r = router(hash_load_factor=1.25)
    plain = router()
    pool = agents([1] * 6)
    inflight = r.inflight
    for a in pool:
        inflight.add(a.agent_id, 10)
    assert mapping(r, pool, 500) == mapping(plain, pool, 500)


def test_hash_bounded_load_counts_queue_depth() -> None:
    r = router(hash_load_factor=1.5)
    pool = agents([1, 1])
    owner = r.pick(CAP, pool, policy="consistent_hash", session_id="s").agent_id
    for a in pool:
        if a.agent_id == owner:
            a.queue_depth = 30
    assert r.pick(CAP, pool, policy="consistent_hash", session_id="s").agent_id != owner


# -- direct and broadcast -----------------------------------------------------------------
def test_direct() -> None:
    br = Breakers(min_requests=1, clock=FakeClock())
    r = router(breakers=br)
    pool = [
        agent("ok"),
        agent("drain", draining=True),
        agent("slow", ready=False),
        agent("full", max_queue=1, queue_depth=1),
        agent("bad"),
        agent("other", capabilities=["x"]),
        agent("us", metadata={"region": "us"}),
    ]
    br.record("bad", ok=False)
    for version in (None, 1):
        assert r.pick(CAP, pool, policy="direct", target="ok", version=version).agent_id == "ok"
    for target, words in [
        ("ghost", "not registered"),
        ("drain", "draining"),
        ("slow", "not ready"),
        ("bad", "breaker"),
        ("other", "does not declare"),
    ]:
        with pytest.raises(NoAgentAvailable) as ei:
            r.pick(CAP, pool, policy="direct", target=target)
        assert ei.value.reason == "target_unavailable"
        assert words in str(ei.value)
    with pytest.raises(NoAgentAvailable, match="does not match") as ei:
        r.pick(CAP, pool, policy="direct", target="us", where={"region": "eu"})
    assert ei.value.reason == "target_unavailable"
    with pytest.raises(Overloaded):
        r.pick(CAP, pool, policy="direct", target="full")
    # nothing else is eligible: the target's own cause is still reported
    with pytest.raises(NoAgentAvailable) as ei:
        r.pick(CAP, [agent("drain", draining=True)], policy="direct", target="drain")
    assert ei.value.reason == "target_unavailable"


def test_pick_many_returns_every_eligible_agent() -> None:
    br = Breakers(min_requests=1, clock=FakeClock())
    r = router(breakers=br)
    pool = [
        agent("a"),
        agent("b", draining=True),
        agent("c", max_queue=2, queue_depth=2),
        agent("d"),
        agent("e"),
    ]
    br.record("e", ok=False)
    for version in (None, 1):
        assert [a.agent_id for a in r.pick_many(CAP, pool, version=version)] == ["a", "d"]
    with pytest.raises(Overloaded):
        r.pick_many(CAP, [pool[2]])


def test_broadcast_to_a_half_open_agent_leaves_its_probe_to_the_copy() -> None:
    # broadcast lists agents with pick_many, then sends each copy with target=: the probe
    # slot of a half-open agent must be taken once, by the copy's own pick.
    clock = FakeClock(0.0)
    br = Breakers(min_requests=1, cooldown_s=5.0, clock=clock)
    r = router(breakers=br)
    pool = [agent("a"), agent("b")]
    br.record("b", ok=False)
    clock.t = 6.0  # cool-down over: b is half-open, one probe allowed
    assert [a.agent_id for a in r.pick_many(CAP, pool)] == ["a", "b"]
    assert r.pick(CAP, pool, policy="direct", target="b").agent_id == "b"
    # That probe is now out: a second copy has nowhere to go until it reports back.
    with pytest.raises(NoAgentAvailable):
        r.pick(CAP, pool, policy="direct", target="b")


# -- breaker integration ------------------------------------------------------------------
def test_breaker_opens_on_real_failures_then_probes_and_closes() -> None:
    clock = FakeClock(0.0)
    br = Breakers(min_requests=5, error_rate=0.5, cooldown_s=5.0, clock=clock)
    r = router(breakers=br)
    pool = agents([1, 1, 1])
    failing = {"a1"}
    sent: Counter[str] = Counter()
    for _ in range(60):
        a = r.pick(CAP, pool, version=1).agent_id
        sent[a] += 1
        br.record(a, ok=a not in failing)
    assert br.state("a1") == "open"
    assert sent["a1"] == 5  # opened after min_requests failures, then skipped
    clock.t += 5.0
    failing.clear()
    picks = [r.pick(CAP, pool, version=1).agent_id for _ in range(3)]
    assert picks.count("a1") == 1  # the half-open probe
    assert br.state("a1") == "half_open"
    br.record("a1", ok=True)
    assert br.state("a1") == "closed"
    assert "a1" in {r.pick(CAP, pool, version=1).agent_id for _ in range(6)}


def test_a_closed_breaker_ramps_its_agent_back_in_wrr_and_least_conn() -> None:
    clock = FakeClock(0.0)  # the breakers' clock (the router keeps its own)
    br = Breakers(min_requests=4, error_rate=0.5, cooldown_s=5.0, ramp_s=10.0, clock=clock)
    r = router(breakers=br)
    pool = agents([1, 1])
    r.pick(CAP, pool, version=1)  # the routing state is cached before the breaker moves
    for _ in range(4):
        br.record("a1", ok=False)
    assert {r.pick(CAP, pool, version=1).agent_id for _ in range(20)} == {"a0"}  # open
    clock.t += 5.0
    assert br.allow("a1")  # the half-open probe
    br.record("a1", ok=True)

    def share() -> float:
        return Counter(r.pick(CAP, pool, version=1).agent_id for _ in range(2000))["a1"] / 2000

    shares = []
    for t in (0.0, 2.5, 5.0, 7.5, 10.0):  # seconds since the close
        clock.t = 5.0 + t
        shares.append(share())
    # its weight times the ramp factor (0.1 -> 1 over 10 s), against the other's whole 1
    expected = [0.1 / 1.1, 0.325 / 1.325, 0.55 / 1.55, 0.775 / 1.775, 0.5]
    for got, want in zip(shares, expected, strict=True):
        assert got == pytest.approx(want, abs=0.01)
    assert shares == sorted(shares)

    # least_conn scales by the same factor: a ramping agent is spared extra work
    for _ in range(4):
        br.record("a0", ok=False)
    clock.t += 5.0
    assert br.allow("a0")
    br.record("a0", ok=True)  # a0 closed now: its ramp starts at 0.1
    busy = [agent("a0"), agent("a1", queue_depth=5)]
    # (0+1)/0.1 = 10 for a0 vs (5+1)/1 = 6 for a1
    assert r.pick(CAP, busy, policy="least_conn").agent_id == "a1"
    clock.t += 10.0
    assert r.pick(CAP, busy, policy="least_conn").agent_id == "a0"


# -- the continuum itself -------------------------------------------------------------------
def test_ring_incremental_updates_equal_a_fresh_build() -> None:
    rnd = random.Random(3)
    cache: dict[tuple[str, int, int], list[int]] = {}
    members = {f"a{i}": 40 for i in range(40)}
    ring = ketama.Ring(dict(members), cache)
    for step in range(30):
        change = rnd.choice(["join", "leave", "weight"])
        if change == "join":
            members[f"n{step}"] = rnd.choice([20, 40, 80])
        elif change == "leave":
            members.pop(rnd.choice(sorted(members)))
        else:
            members[rnd.choice(sorted(members))] = rnd.choice([20, 40, 80])
        ring = ketama.Ring(dict(members), cache, ring)
        assert ring.codes == ketama.Ring(dict(members), {}).codes


def test_ring_survives_a_tag_collision(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [f"agent-{i}" for i in range(5)]
    ref = HashRing({a: {"vnodes": 40, "weight": 1} for a in ids}, hash_fn="ketama")
    monkeypatch.setattr(ketama, "_tag", lambda agent_id: 7)
    ring = ketama.Ring({a: 40 for a in ids}, {})
    assert not ring.hashed
    r = router()
    pool = [agent(a) for a in ids]
    sessions = [f"user-{i}" for i in range(500)]
    got = [r.pick(CAP, pool, policy="consistent_hash", session_id=s).agent_id for s in sessions]
    assert got == [ref.get_node(s) for s in sessions]
    got = [r.pick(CAP, pool[1:], policy="consistent_hash", session_id=s).agent_id for s in sessions]
    assert "agent-0" not in got


@pytest.mark.parametrize("policy", ["weighted_rr", "least_conn", "consistent_hash", "direct"])
def test_picker_picks_as_pick_does_message_by_message(policy: str) -> None:
    """Router.picker (send_many's routing): the same agents, in the same order, as one
    pick() per message, in-flight counts and an agent's bound moving between picks."""
    cands = agents([1.0, 2.0, 3.0], max_queue=5)
    kw: dict[str, Any] = {"policy": policy, "avoid": "a0"}
    if policy == "consistent_hash":
        kw["session_id"] = "s-1"
    if policy == "direct":
        kw["target"] = "a2"
    one, many = router(3), router(3)
    want: list[str] = []
    for _ in range(12):
        try:
            a = one.pick(CAP, cands, **kw)
        except (NoAgentAvailable, Overloaded) as e:
            want.append(type(e).__name__)
            continue
        one.inflight.add(a.agent_id)
        want.append(a.agent_id)
    pick = many.picker(CAP, cands, **kw)
    got: list[str] = []
    for _ in range(12):
        try:
            a = pick()
        except (NoAgentAvailable, Overloaded) as e:
            got.append(type(e).__name__)
            continue
        many.inflight.add(a.agent_id)
        got.append(a.agent_id)
    assert got == want
    assert len(set(want)) > 1 or policy in ("consistent_hash", "direct")

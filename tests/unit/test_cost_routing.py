"""Cost-aware routing (no Redis): ``least_conn`` picks by the expected time to finish the
message (queued and in flight x mean run time / slots, plus its own cost x mean), with the
mean each agent reports per capability; ``cost=`` changes the pick."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from reach.envelope import Envelope, checked_cost, decode_envelope, encode
from reach.errors import ConfigError
from reach.registry import AgentInfo
from reach.routing import Router
from reach.routing.least_conn import factors

CAP = "c.x"


def agent(aid: str, slots: int, *, qd: int = 0, mean_us: int = 0, handler_us: int = 0) -> AgentInfo:
    return AgentInfo(
        agent_id=aid,
        capabilities=[CAP, "c.other"],
        ready=True,
        slots=slots,
        queue_depth=qd,
        last_heartbeat_ms=1,
        handler_us=handler_us,
        cap_us={CAP: mean_us} if mean_us else {},
    )


def shares(agents: list[AgentInfo], n: int, *, policy: str = "least_conn") -> Counter[str]:
    """Place ``n`` requests one after another, none answered (each stays in flight)."""
    router = Router(slow_start_s=0, rng=random.Random(7))
    got: Counter[str] = Counter()
    for _ in range(n):
        a = router.pick(CAP, agents, policy=policy, version=1)
        router.inflight.add(a.agent_id)
        got[a.agent_id] += 1
    return got


def test_an_agent_twice_as_slow_gets_half_the_share_once_its_mean_is_known() -> None:
    unknown = shares([agent("fast", 4), agent("slow", 4)], 300)
    assert abs(unknown["fast"] - unknown["slow"]) <= 1  # blind: the same share each
    known = shares([agent("fast", 4, mean_us=100_000), agent("slow", 4, mean_us=200_000)], 300)
    assert 1.8 <= known["fast"] / known["slow"] <= 2.3, known


def test_the_capabilitys_own_mean_wins_over_the_agents_overall_one() -> None:
    # 'slow' is slow at c.x but its overall mean (other capabilities) says fast
    a = [agent("fast", 4, mean_us=100_000), agent("slow", 4, mean_us=300_000, handler_us=1)]
    got = shares(a, 200)
    assert got["fast"] > 2.5 * got["slow"], got
    assert a[1].mean_us(CAP) == 300_000 and a[1].mean_us("c.other") == 1


def test_an_agent_without_a_mean_counts_as_the_mean_of_the_others() -> None:
    per_entry, per_cost = factors(
        [agent("a", 2, mean_us=100), agent("b", 1, mean_us=300), agent("new", 1)], CAP, [1, 1, 1]
    )
    assert per_cost == [100, 300, 200] and per_entry == [50, 300, 200]


@pytest.mark.parametrize("policy", ["least_conn", "weighted_rr"])
def test_cost_changes_the_pick(policy: str) -> None:
    """A fast agent with a queue beside an idle agent three times as slow (one slot each):
    a short answer goes to the idle one (it ends sooner there), a long report waits for
    the fast one."""
    agents = [agent("fast", 1, qd=8, mean_us=100_000), agent("slow", 1, mean_us=300_000)]
    if policy == "weighted_rr":  # both full: where the message ends first
        agents[1] = agent("slow", 1, qd=1, mean_us=300_000)
    for cost, want in [(1.0, "slow"), (0.1, "slow"), (10.0, "fast")]:
        router = Router(slow_start_s=0, rng=random.Random(3))
        got = {router.pick(CAP, agents, policy=policy, version=1, cost=cost).agent_id}
        assert got == {want}, (cost, got)


def test_cost_travels_in_the_envelope_only_when_not_1() -> None:
    plain = Envelope(msg_id="m", capability=CAP)
    assert b"cost" not in encode(plain)
    costly = Envelope(msg_id="m", capability=CAP, cost=10)
    assert decode_envelope(encode(costly)).cost == 10.0
    assert checked_cost(None) == 1.0 and checked_cost(0.5) == 0.5
    for bad in (0, 0.001, 1001, float("nan"), float("inf"), True, "2"):
        with pytest.raises(ConfigError, match="cost"):
            checked_cost(bad)  # type: ignore[arg-type]

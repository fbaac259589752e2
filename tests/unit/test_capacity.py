"""reach.routing.capacity and the router's use of it (no Redis): a full agent is passed
over while another has room; when all are full the backlog splits by capacity; this
client's own messages are not counted twice."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from reach.registry import AgentInfo
from reach.routing import Router
from reach.routing.capacity import Capacity, expected_wait_us

CAP = "c.x"


def agent(aid: str, slots: int, *, qd: int = 0, hb_ms: int = 1, handler_us: int = 0) -> AgentInfo:
    return AgentInfo(
        agent_id=aid,
        capabilities=[CAP],
        ready=True,
        slots=slots,
        queue_depth=qd,
        last_heartbeat_ms=hb_ms,
        handler_us=handler_us,
    )


def test_expected_wait() -> None:
    assert expected_wait_us(1, 2, 400_000) == 0.0  # a free slot
    assert expected_wait_us(2, 2, 400_000) == 200_000  # itself, shared by 2 slots
    assert expected_wait_us(17, 16, 400_000) == 50_000


def test_own_messages_are_not_counted_twice() -> None:
    inflight: dict[str, int] = {"a": 3}
    cap = Capacity(inflight)
    a = agent("a", 4, qd=5, hb_ms=10)  # the report counts our 3 and 2 of others
    assert cap.load(a) == 5
    inflight["a"] = 1  # two of ours answered since
    assert cap.load(a) == 3
    cap.sent(a)  # an untracked send
    assert cap.load(a) == 4
    newer = agent("a", 4, qd=1, hb_ms=20)  # a new report: it counts what we had out
    assert cap.load(newer) == 1


@pytest.mark.parametrize("policy", ["weighted_rr", "least_conn"])
def test_a_full_agent_is_passed_over_then_the_backlog_splits_by_capacity(policy: str) -> None:
    router = Router(slow_start_s=0, rng=random.Random(1))
    agents = [agent("small", 2), agent("big", 16)]
    got: Counter[str] = Counter()
    for _ in range(18):  # every slot, no queue yet: the small one takes exactly its 2
        a = router.pick(CAP, agents, policy=policy, version=1)
        router.inflight.add(a.agent_id)
        got[a.agent_id] += 1
    assert got == {"small": 2, "big": 16}
    for _ in range(102):  # all full: where the wait is least, i.e. 2:16
        a = router.pick(CAP, agents, policy=policy, version=1)
        router.inflight.add(a.agent_id)
        got[a.agent_id] += 1
    assert 12 <= got["small"] <= 15, got
    # a slot frees on the small agent: the next pick goes there
    router.inflight.done("small", got["small"])
    assert router.pick(CAP, agents, policy=policy, version=1).agent_id == "small"


def test_the_slower_handler_waits_longer() -> None:
    router = Router(slow_start_s=0, rng=random.Random(2))
    agents = [agent("fast", 4, handler_us=100_000), agent("slow", 4, handler_us=400_000)]
    got: Counter[str] = Counter()
    for _ in range(48):
        a = router.pick(CAP, agents, version=1)
        router.inflight.add(a.agent_id)
        got[a.agent_id] += 1
    # 4 each fill the slots; then queued x 0.1 s vs x 0.4 s: ~4:1 of the 40 queued
    assert got["fast"] >= 3 * got["slow"] - 4, got


def test_an_agent_without_reported_slots_is_never_full() -> None:
    router = Router(slow_start_s=0, rng=random.Random(3))
    agents = [agent("old", 0), agent("new", 1)]
    got: Counter[str] = Counter()
    for _ in range(10):
        a = router.pick(CAP, agents, version=1)
        router.inflight.add(a.agent_id)
        got[a.agent_id] += 1
    assert got == {"new": 1, "old": 9}

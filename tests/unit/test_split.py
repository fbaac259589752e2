"""Version splits, pure: parsing and checking a split, the choice of a version (by share,
by a session's hash), and the router's picks within the chosen version under every
policy, its fallback, share 0 and the reason ``version``."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from reach.errors import ConfigError, NoAgentAvailable
from reach.registry import AgentInfo
from reach.routing import Router
from reach.routing.split import Split, unit_of

CAP = "text.summarize"


def agent(agent_id: str, version: str, **kw: Any) -> AgentInfo:
    kw.setdefault("capabilities", [CAP])
    kw.setdefault("ready", True)
    return AgentInfo(agent_id=agent_id, app_version=version, **kw)


FLEET = [agent("old-1", "1.4"), agent("old-2", "1.4"), agent("new-1", "1.5"), agent("bare", "")]


def test_parse_and_print() -> None:
    s = Split.parse("1.4=90 1.5=10")
    assert str(s) == "1.4=90 1.5=10" and s.live == ("1.4", "1.5")
    assert Split.parse(["1.4=90", "1.5=10"]) == s
    assert s.share("1.4") == 90 and s.share("1.6") == 0 and s.percent("1.5") == 10
    assert Split.parse("=3 2.0-rc1=1").shares == (("", 3.0), ("2.0-rc1", 1.0))
    assert Split.parse("a=0 b=2.5").live == ("b",)


@pytest.mark.parametrize(
    "bad",
    ["", "1.4", "1.4=x", "1.4=-1", "1.4=nan", "1.4=inf", "1.4=1 1.4=2", "a b=1", "1,4=1",
     "1.4=0", "v=1e9", " ".join(f"v{i}=1" for i in range(33))],
)  # fmt: skip
def test_bad_splits_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        Split.parse(bad)


def test_draws_follow_the_shares_and_skip_share_zero() -> None:
    s = Split.parse("1.4=90 1.5=10 1.6=0")
    rng = random.Random(3)
    got = Counter(s.draw(rng) for _ in range(20_000))
    assert got["1.6"] == 0
    assert abs(got["1.5"] / 20_000 - 0.10) < 0.01
    # narrowed to the versions that have agents: the shares renormalised over them
    assert {s.draw(rng, among=["1.5"]) for _ in range(100)} == {"1.5"}
    assert s.draw(rng, among=["1.6"]) is None


def test_a_session_hash_is_stable_and_follows_the_shares() -> None:
    s = Split.parse("1.4=70 1.5=30")
    assert unit_of("s-1") == unit_of("s-1") and 0 <= unit_of("s-1") < 1
    assert s.for_session("s-1") == s.for_session("s-1")
    got = Counter(s.for_session(f"s-{i}") for i in range(10_000))
    assert abs(got["1.5"] / 10_000 - 0.30) < 0.02


def test_fallbacks_largest_share_first() -> None:
    s = Split.parse("a=10 b=50 c=30 d=0")
    assert s.fallbacks("a", ["a", "b", "c", "d"]) == ["b", "c"]
    assert s.fallbacks("b", ["a", "b"]) == ["a"]


@pytest.mark.parametrize("policy", ["weighted_rr", "least_conn", "consistent_hash"])
def test_every_policy_picks_within_the_chosen_version(policy: str) -> None:
    r = Router(rng=random.Random(1))
    s = Split.parse("1.4=0 1.5=100")
    for i in range(200):
        a = r.pick(CAP, FLEET, policy=policy, session_id=f"s{i}", split=s, version=1)
        assert a.app_version == "1.5"
    # the pinned version first
    s2 = Split.parse("1.4=50 1.5=50")
    for i in range(50):
        a = r.pick(CAP, FLEET, policy=policy, session_id=f"s{i}", split=s2, app_version="1.4")
        assert a.app_version == "1.4"


def test_direct_ignores_the_split() -> None:
    r = Router()
    a = r.pick(CAP, FLEET, policy="direct", target="old-1", split=Split.parse("1.5=1"))
    assert a.agent_id == "old-1"


def test_a_version_without_a_usable_agent_falls_back_to_the_others_with_a_share() -> None:
    r = Router(rng=random.Random(2))
    fleet = [*FLEET, agent("new-2", "1.6", ready=False)]
    s = Split.parse("1.6=90 1.4=10")
    got = Counter(r.pick(CAP, fleet, split=s).app_version for _ in range(100))
    assert got == {"1.4": 100}
    # a session pinned to a version without agents too
    assert r.pick(CAP, fleet, split=s, app_version="1.6").app_version == "1.4"


def test_no_agent_of_any_version_with_a_share() -> None:
    r = Router()
    with pytest.raises(NoAgentAvailable) as e:
        r.pick(CAP, FLEET, split=Split.parse("2.0=1"))
    assert e.value.reason == "version" and "'2.0'" in str(e.value)
    # the agents of the versions are there but not ready: that is the reason given
    starting = [agent("x", "2.0", ready=False), *FLEET]
    with pytest.raises(NoAgentAvailable) as e:
        r.pick(CAP, starting, split=Split.parse("2.0=1"))
    assert e.value.reason == "not_ready"
    # an unknown capability stays the usual error
    with pytest.raises(NoAgentAvailable) as e:
        r.pick("other.cap", FLEET, split=Split.parse("2.0=1"))
    assert e.value.reason == "no_agent"


def test_a_full_proposal_does_not_leave_the_version() -> None:
    """The degraded walk (a full agent, many refusals) looks only at the chosen version's
    agents: every agent here is full by this client's estimate."""
    r = Router(rng=random.Random(5))
    fleet = [agent(f"{v}-{i}", v, slots=1, queue_depth=5) for v in ("1.4", "1.5") for i in (1, 2)]
    s = Split.parse("1.4=0 1.5=1")
    for _ in range(100):
        assert r.pick(CAP, fleet, split=s, version=1).app_version == "1.5"


def test_a_split_written_behind_reachs_back_counts_as_none() -> None:
    from reach.splits import parse_splits

    got = parse_splits(
        {b"a.b": b"1.4=90 1.5=10", b"c.d": b"garbage", b"e.f": b"\xff=1", "g.h": "1=0"}
    )
    assert got == {"a.b": Split.parse("1.4=90 1.5=10")}
    assert parse_splits(None) == {}


def test_an_agents_version_from_its_argument_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reach import Agent

    monkeypatch.delenv("REACH_AGENT_VERSION", raising=False)
    assert Agent("a", capabilities=["c"]).version == ""
    assert Agent("a", capabilities=["c"], version="1.5").version == "1.5"
    monkeypatch.setenv("REACH_AGENT_VERSION", "2.0")
    assert Agent("a", capabilities=["c"]).version == "2.0"
    assert Agent("a", capabilities=["c"], version="1.5").renamed("b").version == "1.5"
    monkeypatch.setenv("REACH_AGENT_VERSION", "2 0")
    with pytest.raises(ConfigError, match="REACH_AGENT_VERSION"):
        Agent("a", capabilities=["c"])
    with pytest.raises(ConfigError, match="Invalid version"):
        Agent("a", capabilities=["c"], version="1=5")

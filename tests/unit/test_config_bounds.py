"""Settings and registry data that would make every later call fail are refused (or
ignored) up front, with words (issue 9: nothing may stop a worker or a client)."""

from __future__ import annotations

from typing import Any

import pytest

from reach import Agent, Client, ConfigError, RuntimeOptions
from reach.registry import AgentInfo


@pytest.mark.parametrize("weight", [0, -1, 1001, float("nan"), float("inf")])
def test_agent_weight_out_of_range(weight: float) -> None:
    with pytest.raises(ConfigError, match="weight"):
        Agent("a1", capabilities=["x.y"], weight=weight)


def test_agent_id_too_long() -> None:
    with pytest.raises(ConfigError, match="at most"):
        Agent("a" * 300, capabilities=["x.y"])


@pytest.mark.parametrize(
    "kw",
    [
        {"lease_s": 9, "evict_after_s": 100_000},
        {"shadow_ttl_s": 0},
        {"shadow_ttl_s": 1e9},
        {"claim_lease_s": 0},
        {"batch": 0},
        {"batch": 20_000},
        {"dlq_maxlen": 0},
    ],
)
def test_runtime_options_the_scripts_would_refuse(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        RuntimeOptions(**kw)


@pytest.mark.parametrize("advertised", ["bogus", "direct", "broadcast", 7, None])
def test_a_bad_advertised_policy_is_ignored(advertised: object) -> None:
    """One agent advertising a policy no router can use made every send of the
    capability raise ConfigError; the others' advice (or the default) applies instead."""
    c = Client(redis_url="redis://127.0.0.1:1/0")
    env = c.build("x.y", {})
    bad = AgentInfo(agent_id="bad", metadata={"policies": {"x.y": advertised}})
    good = AgentInfo(agent_id="good", metadata={"policies": {"x.y": "least_conn"}})
    assert c._policy_for(env, [bad]) == "weighted_rr"
    assert c._policy_for(env, [bad, good]) == "least_conn"

"""What a call gets when its caller does not say (reach._defaults): a child's deadline and
its margin, the advertised timeouts as agents store and readers read them, the fallback's
kinds, and how an agent's card shows an advertised timeout."""

from __future__ import annotations

import math
from typing import Any

import pytest

from reach import Agent
from reach._defaults import (
    CHILD_MARGIN_MAX_MS,
    DEFAULT_SEND_TIMEOUT_S,
    AdvertisedTimeouts,
    check_send_timeout,
    child_deadline,
    fallback_kind,
    fallback_kinds,
)
from reach.card import agent_card
from reach.client import Client
from reach.errors import (
    ConfigError,
    DeadlineExceeded,
    NoAgentAvailable,
    Overloaded,
    Rejected,
    RemoteError,
)
from reach.registry import AgentInfo, advertised_timeout


def test_a_child_ends_a_tenth_of_the_parents_time_left_before_it_at_most_a_second() -> None:
    now = 1_000_000
    assert child_deadline(now + 30_000, now) == now + 30_000 - CHILD_MARGIN_MAX_MS
    assert child_deadline(now + 10_000, now) == now + 9_000  # 10 % = the cap
    assert child_deadline(now + 300, now) == now + 270  # short deadlines stay usable
    assert child_deadline(now + 5, now) == now + 5  # under 10 ms left: nothing to take
    assert child_deadline(now - 50, now) == now - 50  # passed already: the parent's own


def test_send_timeout_default_and_bad_values() -> None:
    assert DEFAULT_SEND_TIMEOUT_S == 3600.0
    assert Client(redis_url="redis://x").default_send_timeout_s == 3600.0
    assert check_send_timeout(None) is None and check_send_timeout(2) == 2.0
    for bad in (0, -1, math.inf, math.nan, True, "10"):
        with pytest.raises(ConfigError, match="default_send_timeout_s"):
            Client(redis_url="redis://x", default_send_timeout_s=bad)  # type: ignore[arg-type]


def test_fallback_kinds_are_checked_and_errors_sorted_into_them() -> None:
    assert Client(redis_url="redis://x").fallback_on == {"no_agent"}  # today's behaviour
    assert fallback_kinds("deadline") == {"deadline"}
    assert fallback_kinds(["no_agent", "remote_error"]) == {"no_agent", "remote_error"}
    with pytest.raises(ConfigError, match="'timeout'.*'no_agent', 'deadline', 'remote_error'"):
        Client(redis_url="redis://x", fallback_on={"timeout"})
    assert fallback_kind(NoAgentAvailable("x")) == "no_agent"
    assert fallback_kind(Overloaded("x")) == "no_agent"  # a NoAgentAvailable
    assert fallback_kind(DeadlineExceeded("x")) == "deadline"
    assert fallback_kind(RemoteError("x")) == "remote_error"
    assert fallback_kind(Rejected("x")) is None  # refused for good: no fallback kind
    assert fallback_kind(ValueError("x")) is None


def info(agent_id: str, timeouts: Any, **kw: Any) -> AgentInfo:
    return AgentInfo(
        agent_id=agent_id,
        capabilities=["text.summarize", "code.review"],
        metadata={"timeouts": timeouts},
        **kw,
    )


def test_advertised_timeouts_are_read_never_trusted_and_the_longest_wins() -> None:
    assert info("a", {"text.summarize": 15}).timeout_s("text.summarize") == 15.0
    assert info("a", {"text.summarize": 15}).timeout_s("code.review") is None
    for hostile in ([15], "15", None, {"text.summarize": "15"}, {"text.summarize": True},
                    {"text.summarize": -1}, {"text.summarize": 0}, {"text.summarize": 1e9},
                    {"text.summarize": math.nan}):  # fmt: skip
        assert info("a", hostile).timeout_s("text.summarize") is None, hostile
    assert AgentInfo(agent_id="old").timeout_s("text.summarize") is None  # an older record
    agents = [
        info("a", {"text.summarize": 15}),
        info("b", {"text.summarize": 40}),
        info("c", {}),  # advertises none: it does not pull the value down
        info("d", {"text.summarize": 90}, state="evicted"),  # gone: not counted
    ]
    assert advertised_timeout(agents, "text.summarize") == 40.0
    assert advertised_timeout(agents, "code.review") is None
    assert advertised_timeout([], "text.summarize") is None


def test_the_client_cache_of_advertised_timeouts_follows_the_view_version() -> None:
    cache = AdvertisedTimeouts()
    assert cache.last("text.summarize") is None
    assert cache.get("text.summarize", [info("a", {"text.summarize": 15})], 1) == 15.0
    # the same version vouches for the same agents: not read again
    assert cache.get("text.summarize", [info("a", {"text.summarize": 99})], 1) == 15.0
    assert cache.get("text.summarize", [info("a", {"text.summarize": 99})], 2) == 99.0
    assert cache.last("text.summarize") == 99.0


def test_a_handler_advertises_its_timeout_in_the_registration() -> None:
    app = Agent("sum-1", capabilities=["text.summarize", "code.review"], metadata={"x": 1})

    @app.handler("text.summarize", timeout_s=15)
    async def summarize(payload: Any, ctx: Any) -> Any:
        return payload

    @app.handler("code.review")
    async def review(payload: Any, ctx: Any) -> Any:
        return payload

    assert app.metadata == {"x": 1, "timeouts": {"text.summarize": 15.0}}
    assert app.renamed("sum-2").metadata == app.metadata
    for bad in (0, -1, 86_401, math.nan, True, "15"):
        with pytest.raises(ConfigError, match="timeout_s"):
            app.handler("code.review", timeout_s=bad)  # type: ignore[arg-type]


def test_the_card_shows_an_advertised_timeout() -> None:
    card = agent_card(info("sum-1", {"text.summarize": 15}), namespace="prod")
    skills = {s["id"]: s for s in card["skills"]}
    assert "gets 15 s" in skills["text.summarize"]["description"]
    assert "timeout" not in skills["code.review"]["description"]
    [ext] = card["capabilities"]["extensions"]
    assert ext["params"]["timeouts"] == {"text.summarize": 15.0}
    bare = agent_card(AgentInfo(agent_id="old", capabilities=["code.review"]), namespace="p")
    assert "timeouts" not in bare["capabilities"]["extensions"][0]["params"]

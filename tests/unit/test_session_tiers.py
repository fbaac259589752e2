"""Session tiers without Redis: the tier a handler declares, and a cached copy taking a
run's writes as session_write.lua applies them."""

from __future__ import annotations

import pytest

import reach
from reach._sessions.cache import apply_ops
from reach._sessions.tiers import DEFAULT_TIER, SessionTier, parse_tier


def test_the_tier_of_a_handler() -> None:
    app = reach.Agent("a-1", capabilities=["t.a", "t.b", "t.c"])
    app.handler("t.a")(lambda p, ctx: p)
    app.handler("t.b", session="cached")(lambda p, ctx: p)
    tier = SessionTier("best_effort", timeout_s=0.2)
    app.handler("t.c", session=tier)(lambda p, ctx: p)
    assert app.handlers["t.a"].session == DEFAULT_TIER
    assert app.handlers["t.b"].session == SessionTier("cached", cache_ttl_s=300.0)
    assert app.handlers["t.c"].session is tier
    assert parse_tier("strong") == DEFAULT_TIER


@pytest.mark.parametrize("bad", ["eventual", "", 3, None])
def test_a_bad_tier_is_refused(bad: object) -> None:
    with pytest.raises(reach.ConfigError, match="strong"):
        parse_tier(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["cache_ttl_s", "timeout_s"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_bad_duration_is_refused(field: str, value: object) -> None:
    with pytest.raises(reach.ConfigError, match=field):
        SessionTier("cached", **{field: value})  # type: ignore[arg-type]


def test_a_copy_takes_the_ops_in_order() -> None:
    values = {"a": b"1", "b": b"2"}
    history = [b"x", b"y"]
    ops = ["S", "c", b"3", "D", "a", "A", b"z", 3, "A", b"w", 3]
    apply_ops(values, history, ops)
    assert values == {"b": b"2", "c": b"3"} and history == [b"y", b"z", b"w"]
    apply_ops(values, history, ["C", "A", b"v", 0, "S", "d", b"4"])
    assert values == {"d": b"4"} and history == [b"v"]
    apply_ops(None, history, ["S", "e", b"5", "A", b"u", 1])  # values not held: left alone
    assert history == [b"u"]


def test_announcements_reach_did_not_write_are_ignored() -> None:
    """Anyone allowed to publish on the channel can send bytes: a garbled announcement is
    dropped, never raised (it would end the subscription, and the copies with it)."""
    from reach._sessions.cache import SessionCache
    from reach.keys import Keys

    cache = SessionCache(None, None, Keys("ns"))  # type: ignore[arg-type]
    for junk in (b"", b"no-colon", b"x:s1", b"12:\xff\xfe", b"-1:s1"):
        cache.heard(junk)
    assert cache._gen == 0  # none counted as an announcement
    cache.heard(b"3:s1")
    assert cache._gen == 1

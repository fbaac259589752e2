"""The HTTP faces' IP lists (reach._access.IpRules): deny wins, an allow list holds the
only addresses served, X-Forwarded-For only behind a trusted proxy."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from reach._access import IpRules
from reach.errors import ConfigError


def scope(peer: str, xff: str | None = None) -> dict[str, Any]:
    headers = [(b"x-forwarded-for", xff.encode())] if xff is not None else []
    return {"type": "http", "client": (peer, 5555), "headers": headers}


def refusal(rules: IpRules, peer: str, xff: str | None = None) -> str | None:
    return rules.refusal(rules.address(scope(peer, xff)))


def test_deny_wins_over_allow() -> None:
    rules = IpRules(allow=["127.0.0.0/8"], deny=["127.0.0.1"])
    assert "denied" in (refusal(rules, "127.0.0.1") or "")
    assert refusal(rules, "127.0.0.2") is None
    assert "allow list" in (refusal(rules, "10.1.2.3") or "")


def test_no_lists_allow_all_and_ipv6_is_matched() -> None:
    assert refusal(IpRules(), "203.0.113.9") is None
    assert not IpRules().active
    rules = IpRules(deny=["2001:db8::/32"])
    assert refusal(rules, "2001:db8::1") is not None
    assert refusal(rules, "::1") is None


def test_forwarded_for_only_behind_a_trusted_proxy() -> None:
    deny = ["203.0.113.7"]
    # not trusted: the header is the caller's to write, the peer is what counts
    assert refusal(IpRules(deny=deny), "127.0.0.1", "203.0.113.7") is None
    trusted = IpRules(deny=deny, trust_proxy=True)
    assert refusal(trusted, "127.0.0.1", "203.0.113.7") is not None
    # the last entry is the one the proxy wrote; those before it are the caller's
    assert refusal(trusted, "127.0.0.1", "203.0.113.7, 198.51.100.1") is None
    assert refusal(trusted, "127.0.0.1", "198.51.100.1, 203.0.113.7") is not None
    assert trusted.address(scope("127.0.0.1")) == ipaddress.ip_address("127.0.0.1")
    # a header that is not an address: unknown, refused where a list is set
    assert "unknown" in (refusal(trusted, "127.0.0.1", "not-an-ip") or "")


def test_bad_rules_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="--allow-ip"):
        IpRules(allow=["10.0.0.0/33"])
    with pytest.raises(ConfigError, match="--deny-ip"):
        IpRules(deny=["nope"])

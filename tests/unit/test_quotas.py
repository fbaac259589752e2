"""reach.quotas without Redis: what the quotas hash parses to (garbage is no quota), whom
a send-rate quota counts, the bound a new send meets, and the cache's refresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reach._sending.delivery import inbox_bound
from reach.errors import ConfigError
from reach.keys import Keys
from reach.limits import parse_limit
from reach.quotas import (
    MAX_INBOX,
    NO_QUOTAS,
    QuotaCache,
    Quotas,
    check_max_inbox,
    identity_of,
    parse_quotas,
)
from reach.registry import AgentInfo
from reach.signing import IdentityKeys, Keyring, keygen


def test_the_stored_form_parses_back() -> None:
    rate = parse_limit("100/s", burst=20)
    q = parse_quotas({b"max_inbox": b"1000", b"send_rate": rate.stored().encode()})
    assert q == Quotas(1000, rate)
    assert q.as_dict() == {
        "max_inbox": 1000,
        "send_rate": "100/s",
        "send_rate_per_s": 100.0,
        "burst": 20,
    }
    assert NO_QUOTAS.as_dict() == dict.fromkeys(q.as_dict())


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        {},
        {b"max_inbox": b"-3", b"send_rate": b"fast"},
        {b"max_inbox": b"0", b"send_rate": b"0/s"},
        {b"max_inbox": b"1e9", b"send_rate": b"\xff\xfe"},
        {b"max_inbox": str(MAX_INBOX + 1).encode(), b"other": b"x"},
        {b"\xff": b"1"},
        {b"max_inbox": "²".encode()},  # a digit to str.isdigit(), not to int()
    ],
)
def test_garbage_is_no_quota(raw: Any) -> None:
    assert parse_quotas(raw) == NO_QUOTAS and not parse_quotas(raw).any


@pytest.mark.parametrize("n", [0, -1, MAX_INBOX + 1, True, 2.0, "5"])
def test_max_inbox_out_of_range_is_refused(n: Any) -> None:
    with pytest.raises(ConfigError, match="max_inbox"):
        check_max_inbox(n)


def test_the_identity_is_the_ed25519_name_else_the_client_id(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    private, public = keygen("alice")
    (tmp_path / "alice.key").write_text(private)
    (tmp_path / "trusted").write_text(public)
    ident = IdentityKeys.from_files("ns", str(tmp_path / "alice.key"), str(tmp_path / "trusted"))
    assert identity_of(ident, "c-123") == "alice"
    # a shared secret names no one: every holder may send under any source
    assert identity_of(Keyring.from_option("ns", "a-shared-secret-0123456789"), "c-123") == "c-123"
    assert identity_of(None, "c-123") == "c-123"


def test_each_identity_has_a_bucket_in_a_slot_of_its_own() -> None:
    keys = Keys("prod")
    assert keys.send_rate_state("alice") == "reach:prod:{q:alice}:rate"
    assert keys.send_rate_state("{bob}") == "reach:prod:{q:bob}:rate"  # no tag break-out
    assert keys.quotas == "reach:{prod}:quotas"


@pytest.mark.parametrize(
    "max_queue,max_inbox,bound",
    [(0, 0, 0), (10, 0, 10), (0, 7, 7), (10, 7, 7), (5, 7, 5)],
)
def test_the_lower_bound_applies(max_queue: int, max_inbox: int, bound: int) -> None:
    agent = AgentInfo(agent_id="a", capabilities=["x"], max_queue=max_queue)
    assert inbox_bound(agent, max_inbox) == bound


class FakeRedis:
    def __init__(self) -> None:
        self.value: dict[bytes, bytes] = {b"max_inbox": b"5"}
        self.reads = 0
        self.fail = False

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        self.reads += 1
        if self.fail:
            raise ConnectionError("down")
        return dict(self.value)


@pytest.mark.anyio
async def test_the_cache_serves_a_stale_copy_while_it_refreshes() -> None:
    r = FakeRedis()
    cache = QuotaCache(Keys("ns"), refresh_s=0.0)  # always stale: each get refreshes
    assert (await cache.get(r)).max_inbox == 5  # type: ignore[arg-type]
    r.value = {b"max_inbox": b"9"}
    # the stale copy at once; the refresh it started lands for the next send
    assert (await cache.get(r)).max_inbox == 5  # type: ignore[arg-type]
    assert cache._reading is not None
    await cache._reading
    assert (await cache.get(r)).max_inbox == 9  # type: ignore[arg-type]
    # a failed refresh keeps the copy (the send meets the same Redis and reports it)
    r.fail = True
    await cache.get(r)  # type: ignore[arg-type]
    await cache._reading
    assert (await cache.get(r)).max_inbox == 9  # type: ignore[arg-type]
    # with no copy, the failure is the caller's
    cache.invalidate()
    with pytest.raises(ConnectionError):
        await cache.get(r)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_fresh_copy_costs_no_read() -> None:
    r = FakeRedis()
    cache = QuotaCache(Keys("ns"), refresh_s=60.0)
    for _ in range(100):
        await cache.get(r)  # type: ignore[arg-type]
    assert r.reads == 1


@pytest.mark.parametrize("text", ["1000000/s", "1/m", "0.5/s", "3/10s", "12345678.25/h", "0.001/s"])
def test_a_rate_is_stored_as_text_that_parses_back_to_it(text: str) -> None:
    # a million a second used to be stored as '1e+06/1s', which no reader parsed: no limit
    rate = parse_limit(text, burst=7)
    assert parse_limit(rate.stored()) == rate
    assert "e" not in rate.stored() and "e" not in str(rate)
    assert parse_limit(str(rate).split(" ")[0], burst=7) == rate

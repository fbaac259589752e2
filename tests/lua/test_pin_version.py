"""pin_version.lua through reach.splits.pin_call: a session's first message pins the
version chosen, later ones get the pin while it keeps a share, a pin whose version lost
its share is replaced, the TTL is renewed, refusals write nothing."""

from __future__ import annotations

import pytest
import redis

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.splits import Split, pin_call

pytestmark = pytest.mark.anyio


async def pin(r: AnyRedis, keys: Keys, chosen: str, split: str, sid: str = "s1") -> str:
    return await pin_call(keys, sid, "c.x", chosen=chosen, split=Split.parse(split)).run(r)


async def test_first_pin_then_kept_while_its_version_has_a_share(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    assert await pin(r, k, "1.5", "1.4=50 1.5=50") == "1.5"
    # another caller chose otherwise (another split, another process): the pin wins
    assert await pin(r, k, "1.4", "1.4=90 1.5=10") == "1.5"
    assert await r.hget(k.version_pins("s1"), "c.x") == b"1.5"
    # its version lost its share: the caller's choice replaces it
    assert await pin(r, k, "1.4", "1.4=100 1.5=0") == "1.4"
    assert await pin(r, k, "1.4", "1.4=1 1.5=1") == "1.4"
    # per capability, and per session
    assert await pin(r, k, "", "=1 1.4=1", sid="s2") == ""
    assert await pin(r, k, "1.4", "=1 1.4=1", sid="s2") == ""


async def test_each_call_renews_the_ttl(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await pin_call(k, "s1", "c.x", chosen="1", split=Split.parse("1=1"), ttl_s=5).run(r)
    assert 0 < await r.pttl(k.version_pins("s1")) <= 5000
    await pin_call(k, "s1", "c.x", chosen="1", split=Split.parse("1=1"), ttl_s=500).run(r)
    assert 5000 < await r.pttl(k.version_pins("s1")) <= 500_000


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["c", "1", "1000"], "arguments"),
        (["", "1", "1000", "1"], "capability"),
        (["c", "1 2", "1000", "1 2"], "version"),
        (["c", "1", "0", "1"], "ttl_ms"),
        (["c", "1", "1000", "2"], "version"),  # the choice is not among the live versions
        (["c", "1", "1000", "1", "x=y"], "version"),
    ],
)
async def test_refusals_write_nothing(r: AnyRedis, ns: str, args: list[str], why: str) -> None:
    key = Keys(ns).version_pins("s1")
    with pytest.raises(redis.ResponseError, match=f"^reach: bad {why}"):
        await scripts.call(r, "pin_version", [key], args)
    assert not await r.exists(key)
    await r.set(key, "a string")
    with pytest.raises(redis.ResponseError, match="^reach: bad KEYS.1.: holds a string"):
        await scripts.call(r, "pin_version", [key], ["c", "1", "1000", "1"])

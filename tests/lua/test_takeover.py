"""takeover.lua: a claim is ended only if the owner judged gone still holds the key."""

from __future__ import annotations

import pytest

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys

pytestmark = pytest.mark.anyio


async def test_takeover_only_from_the_owner_judged_gone(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k1")
    await r.hset(rec, mapping={"owner": "w-1/old", "lease_until": 10**13, "fence": 1})
    # Another runtime took the key over after this one read "w-1/old": its claim stands.
    await r.hset(rec, mapping={"owner": "w-2/i2", "lease_until": 10**13, "fence": 2})
    assert await scripts.call(r, "takeover", [rec], ["w-1/old"]) == 0
    assert int(await r.hget(rec, "lease_until")) == 10**13
    # The owner that is still there, judged gone: its lease ends (claim.lua may claim it).
    assert await scripts.call(r, "takeover", [rec], ["w-2/i2"]) == 1
    assert int(await r.hget(rec, "lease_until")) == 0
    assert await scripts.call(r, "takeover", [Keys(ns).idem("none")], ["w-2/i2"]) == 0

"""takeover.lua: a claim is ended only if the owner judged gone still holds the key."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.lua.snapshot import assert_unchanged, snapshot

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


@pytest.mark.parametrize(
    ("keys", "args"), [(1, []), (1, ["w-1/old", "x"]), (2, ["w-1/old"]), (0, ["w-1/old"])]
)
async def test_wrong_counts_are_refused_before_any_write(
    r: AnyRedis, ns: str, keys: int, args: list[str]
) -> None:
    recs = [Keys(ns).idem(f"k{i}") for i in range(keys)]
    for rec in recs:
        await r.hset(rec, mapping={"owner": "w-1/old", "lease_until": 10**13, "fence": 1})
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match="^reach: bad arguments: want 1 KEYS and 1 ARGV"):
        await scripts.call(r, "takeover", recs, args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_key_that_is_not_a_hash_is_refused(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k1")
    await r.set(rec, "w-1/old")
    with pytest.raises(rexc.ResponseError, match=r"^reach: bad KEYS\[1\]: holds a string"):
        await scripts.call(r, "takeover", [rec], ["w-1/old"])
    assert await r.get(rec) == b"w-1/old"


async def test_no_owner_matches_a_record_without_one(r: AnyRedis, ns: str) -> None:
    # The runtime passes '' when it read no owner (the key was completed meanwhile).
    rec = Keys(ns).idem("k1")
    await r.hset(rec, mapping={"owner": "", "lease_until": 0, "fence": 3, "done": "1"})
    assert await scripts.call(r, "takeover", [rec], [""]) == 1
    assert await scripts.call(r, "takeover", [Keys(ns).idem("none")], [""]) == 0

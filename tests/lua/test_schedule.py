"""schedule.lua: a sealed envelope is kept by msg_id until its due time, written once; bad
arguments and keys of the wrong type are refused before any write."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio


async def _schedule(r: AnyRedis, k: Keys, msg_id: str, due: object, env: bytes = b"E") -> object:
    keys = [k.scheduled, k.scheduled_envelopes]
    return await scripts.call(r, "schedule", keys, [msg_id, due, env])


async def test_kept_once_by_msg_id(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    assert await _schedule(r, k, "m2", 2000, b"two") == 1
    assert await _schedule(r, k, "m1", 1000, b"one") == 1
    assert await _schedule(r, k, "m2", 5, b"other") == 0  # written once
    assert await r.zrange(k.scheduled, 0, -1, withscores=True) == [
        (b"m1", 1000.0),
        (b"m2", 2000.0),
    ]
    assert await r.hgetall(k.scheduled_envelopes) == {b"m1": b"one", b"m2": b"two"}


@pytest.mark.parametrize(
    "args",
    [["", 1, b"e"], ["m", -1, b"e"], ["m", "01", b"e"], ["m", "1.5", b"e"], ["m", 1, b""]],
    ids=repr,
)
async def test_bad_arguments_write_nothing(r: AnyRedis, ns: str, args: list[object]) -> None:
    k = Keys(ns)
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match="reach: bad"):
        await scripts.call(r, "schedule", [k.scheduled, k.scheduled_envelopes], args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_key_of_another_type_is_refused(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.set(k.scheduled_envelopes, "x")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match="KEYS\\[2\\]: holds a string"):
        await _schedule(r, k, "m", 1)
    assert_unchanged(before, await snapshot(r, ns))

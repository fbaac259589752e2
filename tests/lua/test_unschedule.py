"""unschedule.lua: msg_ids leave the scheduled set and their envelopes together; the answer
counts the ones that were there; bad arguments write nothing."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts.scheduling import unschedule_call
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio


async def test_removes_entries_and_envelopes(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.zadd(k.scheduled, {"a": 1, "b": 2, "c": 3})
    await r.hset(k.scheduled_envelopes, mapping={"a": b"A", "b": b"B", "c": b"C"})
    assert await unschedule_call(k, ["a", "c", "nope"]).run(r) == 2
    assert await r.zrange(k.scheduled, 0, -1) == [b"b"]
    assert await r.hkeys(k.scheduled_envelopes) == [b"b"]


@pytest.mark.parametrize("args", [[], [""], ["m"] * 1001], ids=lambda a: f"{len(a)} ids")
async def test_bad_arguments_write_nothing(r: AnyRedis, ns: str, args: list[object]) -> None:
    k = Keys(ns)
    await r.zadd(k.scheduled, {"m": 1})
    await r.hset(k.scheduled_envelopes, "m", b"M")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match="reach: bad"):
        await scripts.call(r, "unschedule", [k.scheduled, k.scheduled_envelopes], args)
    assert_unchanged(before, await snapshot(r, ns))

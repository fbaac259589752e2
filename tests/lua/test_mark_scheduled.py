"""mark_scheduled.lua: a scheduled send's task record is written 'scheduled' with its due
time when it does not exist; an existing record (a caller's key used before) is left as it
is; bad arguments write nothing."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


async def _mark(r: AnyRedis, k: Keys, key: str, msg_id: str) -> object:
    return await scripts.call(r, "mark_scheduled", [k.idem(key)], ["c.x", msg_id, 1234, TTL_MS])


async def test_a_new_record_is_scheduled(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    assert await _mark(r, k, "m", "m") == 1
    h = await r.hgetall(k.idem("m"))
    fields = (b"status", b"capability", b"attempt", b"sent_msg_id", b"due_ms")
    assert {f: h[f] for f in fields} == {
        b"status": b"scheduled",
        b"capability": b"c.x",
        b"attempt": b"0",
        b"sent_msg_id": b"m",
        b"due_ms": b"1234",
    }
    assert int(h[b"updated_ms"]) > 0
    assert 0 < await r.pttl(k.idem("m")) <= TTL_MS


async def test_an_existing_record_is_kept(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.hset(k.idem("c.x||key"), mapping={"status": "succeeded", "done": "1"})
    assert await _mark(r, k, "c.x||key", "m2") == 0
    assert await r.hgetall(k.idem("c.x||key")) == {b"status": b"succeeded", b"done": b"1"}
    assert await r.pttl(k.idem("c.x||key")) == -1  # its TTL untouched too


@pytest.mark.parametrize(
    "args", [["", "m", 1, 1], ["c", "", 1, 1], ["c", "m", "x", 1], ["c", "m", 1, 0]], ids=repr
)
async def test_bad_arguments_write_nothing(r: AnyRedis, ns: str, args: list[object]) -> None:
    k = Keys(ns)
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match="reach: bad"):
        await scripts.call(r, "mark_scheduled", [k.idem("m")], args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_key_of_another_type_is_refused(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.set(k.idem("m"), "x")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match="KEYS\\[1\\]: holds a string"):
        await _mark(r, k, "m", "m")
    assert_unchanged(before, await snapshot(r, ns))

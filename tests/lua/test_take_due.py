"""take_due.lua: the due scheduled sends are taken, each leased (its score pushed to the
server time + lease) so a second mover does not take it; the answer carries the server
time and the next due time; a due id without an envelope is dropped; bad arguments write
nothing."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts.scheduling import take_due_call
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

FAR = 10**14  # epoch ms far ahead


async def test_due_entries_are_taken_once_under_a_lease(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.zadd(k.scheduled, {"a": 1, "b": 2, "c": FAR})
    await r.hset(k.scheduled_envelopes, mapping={"a": b"A", "b": b"B", "c": b"C"})
    taken = await take_due_call(k, limit=10, lease_ms=60_000).run(r)
    assert taken.entries == (("a", b"A"), ("b", b"B"))
    assert taken.next_ms == taken.now_ms + 60_000  # the leased ones come first
    scores = dict(await r.zrange(k.scheduled, 0, -1, withscores=True))
    assert scores == {b"a": taken.now_ms + 60_000, b"b": taken.now_ms + 60_000, b"c": FAR}
    again = await take_due_call(k, limit=10, lease_ms=60_000).run(r)
    assert again.entries == ()  # a second mover gets nothing while the lease holds
    assert await r.hlen(k.scheduled_envelopes) == 3  # kept until unschedule.lua


async def test_the_limit(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.zadd(k.scheduled, {f"m{i}": i + 1 for i in range(5)})
    await r.hset(k.scheduled_envelopes, mapping={f"m{i}": b"e" for i in range(5)})
    taken = await take_due_call(k, limit=2, lease_ms=1000).run(r)
    assert [m for m, _ in taken.entries] == ["m0", "m1"]
    assert taken.next_ms == 3  # m2 is still due: the caller takes again at once


async def test_an_empty_set_and_an_id_without_envelope(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    empty = await take_due_call(k, limit=1, lease_ms=1).run(r)
    assert (empty.next_ms, empty.entries) == (-1, ())
    await r.zadd(k.scheduled, {"ghost": 1})
    assert (await take_due_call(k, limit=1, lease_ms=1).run(r)).entries == ()
    assert await r.exists(k.scheduled) == 0


@pytest.mark.parametrize("args", [[0, 1], [10001, 1], [1, 0], [1, "x"]], ids=repr)
async def test_bad_arguments_write_nothing(r: AnyRedis, ns: str, args: list[object]) -> None:
    k = Keys(ns)
    await r.zadd(k.scheduled, {"a": 1})
    await r.hset(k.scheduled_envelopes, "a", b"A")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match="reach: bad"):
        await scripts.call(r, "take_due", [k.scheduled, k.scheduled_envelopes], args)
    assert_unchanged(before, await snapshot(r, ns))

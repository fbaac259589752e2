"""settle.lua: per item, store the outcome if the fence holds, then reply, run the follow-ups
and ack + delete the entry; a fenced item writes nothing at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import GROUP, Keys

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


class Batch:
    """Builds settle.lua's KEYS (deduplicated, 1-based indexes) and ARGV as the runtime does."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.items: list[Any] = []
        self.n = 0

    def ki(self, key: str | None) -> int:
        if key is None:
            return 0
        if key not in self.keys:
            self.keys.append(key)
        return self.keys.index(key) + 1

    def add(self, *, idem: str | None, fence: Any, status: str, reply: bytes, mode: str,
            reply_key: str | None, inbox: str | None, entry: str,
            ops: Sequence[tuple[Any, ...]] = ()) -> None:  # fmt: skip
        self.n += 1
        self.items += [self.ki(idem), fence, status, reply, mode, "", self.ki(reply_key),
                       self.ki(inbox), entry, len(ops)]  # fmt: skip
        for name, key, *rest in ops:
            self.items += [name, self.ki(key), len(rest), *rest]

    async def run(self, r: AnyRedis) -> Any:
        return await scripts.call(r, "settle", self.keys, [TTL_MS, GROUP, self.n, *self.items])


async def _delivered(r: AnyRedis, inbox: str, n: int) -> list[str]:
    await r.xgroup_create(inbox, GROUP, id="0", mkstream=True)
    for i in range(n):
        await r.xadd(inbox, {"e": f"m{i}"})
    got = await r.xreadgroup(GROUP, "w-1", {inbox: ">"}, count=n)
    return [eid.decode() for eid, _ in got[0][1]]


async def _claim(r: AnyRedis, rec: str) -> int:
    [[code, fence]] = await scripts.call(r, "claim", [rec], ["w-1/i1", TTL_MS, "w-1", 60_000, "m"])
    assert code == 1
    return int(fence)


async def test_a_settled_item_is_stored_replied_acked_and_deleted(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, replies = k.inbox("w-1", "normal"), k.idem("k1"), k.replies("c-1")
    [entry] = await _delivered(r, inbox, 1)
    fence = await _claim(r, rec)
    b = Batch()
    b.add(idem=rec, fence=fence, status="succeeded", reply=b"R", mode="done",
          reply_key=replies, inbox=inbox, entry=entry)  # fmt: skip
    assert await b.run(r) == [1]
    assert await r.hget(rec, "reply") == b"R" and await r.hget(rec, "done") == b"1"
    [(_, fields)] = await r.xrange(replies)
    assert fields == {b"r": b"R"}
    assert 0 < await r.pttl(replies) <= TTL_MS
    # Acked entries are deleted too, so an inbox holds only work still to do.
    assert await r.xlen(inbox) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 0


async def test_a_fenced_item_writes_nothing_and_leaves_its_entry(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, replies, dlq = k.inbox("w-1", "high"), k.idem("k2"), k.replies("c-1"), k.dlq("cap")
    [entry] = await _delivered(r, inbox, 1)
    fence = await _claim(r, rec)
    await r.hincrby(rec, "fence", 1)  # another owner claimed the key since
    b = Batch()
    b.add(idem=rec, fence=fence, status="dead", reply=b"E", mode="done", reply_key=replies,
          inbox=inbox, entry=entry, ops=[("XADD", dlq, "*", "reason", "max_attempts")])  # fmt: skip
    assert await b.run(r) == [0]
    assert await r.hget(rec, "done") is None
    assert await r.exists(replies, dlq) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 1


async def test_follow_up_commands_run_and_items_settle_independently(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox = k.inbox("w-1", "low")
    e1, e2, e3 = await _delivered(r, inbox, 3)
    retry_rec, stale_rec = k.idem("k3"), k.idem("k4")
    f_retry = await _claim(r, retry_rec)
    await _claim(r, stale_rec)
    b = Batch()
    # A retry: release the key, park the envelope in the delayed set, ack this copy.
    b.add(idem=retry_rec, fence=f_retry, status="retrying", reply=b"", mode="release",
          reply_key=None, inbox=inbox, entry=e1, ops=[("ZADD", k.delayed, 12345, b"ENV")])  # fmt: skip
    b.add(idem=stale_rec, fence=999, status="succeeded", reply=b"X", mode="done",
          reply_key=None, inbox=inbox, entry=e2)  # fmt: skip
    # No idempotency record (a malformed entry): ack only.
    b.add(idem=None, fence="", status="", reply=b"", mode="", reply_key=None, inbox=inbox, entry=e3)
    assert await b.run(r) == [1, 0, 1]
    assert await r.zrange(k.delayed, 0, -1, withscores=True) == [(b"ENV", 12345.0)]
    assert (
        await r.hget(retry_rec, "status") == b"retrying" and await r.hget(retry_rec, "done") is None
    )
    left = await r.xpending_range(inbox, GROUP, min="-", max="+", count=10)
    assert [p["message_id"].decode() for p in left] == [e2]


async def test_a_disallowed_command_fails_the_batch_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, replies = k.inbox("w-1", "normal"), k.idem("k5"), k.replies("c-1")
    first, second = await _delivered(r, inbox, 2)
    fence = await _claim(r, rec)
    await r.sadd(k.agents, "w-1")
    b = Batch()
    # A good item first: it must not be half-settled when the second one is refused.
    b.add(idem=rec, fence=fence, status="succeeded", reply=b"R", mode="done",
          reply_key=replies, inbox=inbox, entry=first)  # fmt: skip
    b.add(idem=None, fence="", status="", reply=b"", mode="", reply_key=None, inbox=inbox,
          entry=second, ops=[("DEL", k.agents)])  # fmt: skip
    with pytest.raises(rexc.ResponseError, match="command not allowed: DEL"):
        await b.run(r)
    assert await r.hget(rec, "done") is None and await r.exists(replies) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 2
    assert await r.smembers(k.agents) == {b"w-1"}

"""send.lua: the inbox entry and the pending record are written together."""

from __future__ import annotations

import pytest

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


async def test_send_adds_the_entry_and_marks_it_pending(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, ptr = k.inbox("w-1", "normal"), k.idem("m1"), k.task("m1")
    entry = await scripts.call(
        r, "send", [inbox, rec, ptr], [b"ENV", "text.summarize", 1, "m1", "", TTL_MS]
    )
    [(got_id, fields)] = await r.xrange(inbox)
    assert got_id == entry and fields == {b"e": b"ENV"}
    h = await r.hgetall(rec)
    assert h[b"status"] == b"pending" and h[b"capability"] == b"text.summarize"
    assert h[b"attempt"] == b"1" and h[b"sent_msg_id"] == b"m1"
    assert 0 < await r.pttl(rec) <= TTL_MS
    assert await r.exists(ptr) == 0  # the key is the msg_id: no pointer needed


async def test_a_caller_key_gets_a_pointer_from_the_msg_id(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, ptr = k.inbox("w-1", "high"), k.idem("order-7"), k.task("m2")
    await scripts.call(r, "send", [inbox, rec, ptr], [b"ENV", "cap", 1, "m2", "order-7", TTL_MS])
    assert await r.get(ptr) == b"order-7"
    assert 0 < await r.pttl(ptr) <= TTL_MS


async def test_resending_under_a_finished_key_keeps_its_status(r: AnyRedis, ns: str) -> None:
    # A duplicate send (same key) must not reset "succeeded" to "pending": the worker will
    # answer it from the stored reply, and `reach task` must keep telling the truth meanwhile.
    k = Keys(ns)
    inbox, rec, ptr = k.inbox("w-1", "low"), k.idem("order-8"), k.task("m3")
    await r.hset(rec, mapping={"status": "succeeded", "done": "1", "reply": b"R"})
    await scripts.call(r, "send", [inbox, rec, ptr], [b"ENV", "cap", 2, "m3", "order-8", TTL_MS])
    h = await r.hgetall(rec)
    assert h[b"status"] == b"succeeded" and h[b"reply"] == b"R" and h[b"attempt"] == b"2"
    assert await r.xlen(inbox) == 1

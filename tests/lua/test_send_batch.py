"""send.lua's batch form (several messages to one agent in one call) and the typed calls
over it (inbox.send_batch_call, inbox.send_many): each message added as the one-message
form would add it, the bound exact, a bad argument or key refusing the call before any
write, and send_many isolating that message."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts import inbox

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


def msg(i: int, key: str = "") -> inbox.Message:
    return inbox.Message(
        data=b"ENV%d" % i,
        capability="cap.x",
        attempt=1,
        msg_id=f"m{i}",
        key=key or f"m{i}",
        idempotency_key=key,
    )


async def test_a_batch_adds_each_message_and_marks_each_pending(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    batch = [(msg(1), "normal"), (msg(2, "order-2"), "high"), (msg(3), "normal")]
    sent = await inbox.send_batch_call(k, batch, agent_id="w-1", ttl_ms=TTL_MS).run(r)
    assert [s.refused for s in sent] == [False, False, False]
    normal = await r.xrange(k.inbox("w-1", "normal"))
    high = await r.xrange(k.inbox("w-1", "high"))
    assert [f[b"e"] for _, f in normal] == [b"ENV1", b"ENV3"]
    assert [f[b"e"] for _, f in high] == [b"ENV2"]
    assert [e for e, _ in normal] == [sent[0].entry_id.encode(), sent[2].entry_id.encode()]
    for m in ("m1", "order-2", "m3"):
        h = await r.hgetall(k.idem(m))
        assert h[b"status"] == b"pending" and h[b"capability"] == b"cap.x"
        assert 0 < await r.pttl(k.idem(m)) <= TTL_MS
    assert await r.get(k.task("m2")) == b"order-2"  # the caller's key: a pointer
    assert not await r.exists(k.task("m1"), k.task("m3"))


async def test_a_batch_stops_exactly_at_the_bound(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.xadd(k.inbox("w-2", "low"), {"e": b"old"})
    batch = [(msg(i), "normal") for i in range(5)]
    sent = await inbox.send_batch_call(k, batch, agent_id="w-2", ttl_ms=TTL_MS, max_queue=3).run(r)
    assert [s.refused for s in sent] == [False, False, True, True, True]
    assert [s.depth for s in sent[2:]] == [3, 3, 3]
    assert await r.xlen(k.inbox("w-2", "normal")) == 2
    assert not await r.exists(k.idem("m2"), k.idem("m3"), k.idem("m4"))  # refused: no trace


async def test_a_bad_batch_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    good = inbox.send_batch_call(k, [(msg(1), "normal"), (msg(2), "normal")], agent_id="w-3",
                                 ttl_ms=TTL_MS)  # fmt: skip
    keys, args = list(good.keys), list(good.args)
    with pytest.raises(ResponseError, match=r"reach: bad arguments: want 6, 7 or 9 ARGV, or 7"):
        await scripts.call(r, "send", keys, [*args, "x"])
    with pytest.raises(ResponseError, match=r"reach: bad keys: want 9 KEYS for 2 messages"):
        await scripts.call(r, "send", keys[:-1], args)
    stray = [*keys[:6], "elsewhere", *keys[7:]]
    with pytest.raises(ResponseError, match=r"KEYS\[7\]: not one of the inboxes"):
        await scripts.call(r, "send", stray, args)
    bad_attempt = [*args[:9], "-1", *args[10:]]
    with pytest.raises(ResponseError, match=r"attempt \(ARGV\[10\]\)"):
        await scripts.call(r, "send", keys, bad_attempt)
    await r.set(k.idem("m2"), "not a hash")
    with pytest.raises(ResponseError, match=r"KEYS\[8\]: holds a string"):
        await scripts.call(r, "send", keys, args)
    assert not await r.exists(*k.inboxes("w-3"), k.idem("m1"))  # nothing written


async def test_send_many_sends_the_messages_of_a_refused_batch_one_by_one(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    await r.set(k.idem("m2"), "not a hash")  # message 2's record is broken
    items = [inbox.Delivery(msg(i), "w-4", "normal") for i in range(4)]
    items.append(inbox.Delivery(msg(9), "w-5", "high"))  # another agent: a call of its own
    out = await inbox.send_many(r, k, items, cluster=False, ttl_ms=TTL_MS)
    assert isinstance(out[2], ResponseError) and "KEYS[2]: holds a string" in str(out[2])
    ok = [x for i, x in enumerate(out) if i != 2]
    assert all(isinstance(x, inbox.Sent) and not x.refused for x in ok)
    assert await r.xlen(k.inbox("w-4", "normal")) == 3
    assert await r.xlen(k.inbox("w-5", "high")) == 1


async def test_send_many_splits_a_large_group_into_batches(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    n = inbox.BATCH * 2 + 3
    items = [inbox.Delivery(msg(i), "w-6", "normal", max_queue=n - 1) for i in range(n)]
    out = await inbox.send_many(r, k, items, cluster=False, ttl_ms=TTL_MS)
    assert all(isinstance(x, inbox.Sent) for x in out)
    refused = [x for x in out if isinstance(x, inbox.Sent) and x.refused]
    assert len(refused) == 1 and refused[0].depth == n - 1 and out[-1] is refused[0]
    assert await r.xlen(k.inbox("w-6", "normal")) == n - 1


async def test_a_batch_keeps_a_status_the_record_holds(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.hset(k.idem("order-1"), mapping={"status": "succeeded", "result": "r"})
    batch = [(msg(1, "order-1"), "normal"), (msg(2), "normal")]
    await inbox.send_batch_call(k, batch, agent_id="w-7", ttl_ms=TTL_MS).run(r)
    kept = await r.hgetall(k.idem("order-1"))
    assert kept[b"status"] == b"succeeded" and kept[b"result"] == b"r"
    assert kept[b"sent_msg_id"] == b"m1"  # the send's own fields are written as ever
    assert (await r.hgetall(k.idem("m2")))[b"status"] == b"pending"


async def test_one_record_there_among_fresh_ones_keeps_its_status_and_is_not_claimed(
    r: AnyRedis, ns: str
) -> None:
    # A batch whose records are all absent skips the look at each one (one EXISTS for
    # all); this one has a record there, last, so each is looked at: the fresh ones are
    # written claimed, the one there keeps its status and gets no claim.
    k = Keys(ns)
    await r.hset(k.idem("order-9"), mapping={"status": "succeeded", "done": "1"})
    batch = [(msg(i), "normal") for i in range(1, 4)] + [(msg(9, "order-9"), "normal")]
    call = inbox.send_batch_call(
        k, batch, agent_id="w-8", ttl_ms=TTL_MS, claim_for="w-8/i1", claim_lease_ms=30_000
    )
    sent = await call.run(r)
    assert [s.refused for s in sent] == [False] * 4
    for m in ("m1", "m2", "m3"):
        h = await r.hgetall(k.idem(m))
        assert (h[b"status"], h[b"owner"], h[b"fence"]) == (b"pending", b"w-8/i1", b"1")
    kept = await r.hgetall(k.idem("order-9"))
    assert (kept[b"status"], kept[b"done"]) == (b"succeeded", b"1") and b"owner" not in kept
    entries = await r.xrange(k.inbox("w-8", "normal"))
    assert [b"c" in f for _, f in entries] == [True, True, True, False]

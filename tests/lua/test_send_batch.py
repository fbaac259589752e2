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
    # Two priorities: the batch form's layout (one priority for all takes the compact one)
    good = inbox.send_batch_call(k, [(msg(1), "normal"), (msg(2), "high")], agent_id="w-3",
                                 ttl_ms=TTL_MS)  # fmt: skip
    keys, args = list(good.keys), list(good.args)
    assert args[0] != "="
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


# -- the compact form: one inbox, capability and attempt, no caller's key --------------
OWNER = "w-c/i1"


def compact_call(
    k: Keys, n: int, *, agent_id: str = "w-c", max_queue: int = 0, priority: str = "low"
) -> scripts.Call[list[inbox.Sent]]:
    call = inbox.send_batch_call(
        k, [(msg(i), priority) for i in range(1, n + 1)], agent_id=agent_id, ttl_ms=TTL_MS,
        max_queue=max_queue, claim_for=OWNER, claim_lease_ms=30_000,
    )  # fmt: skip
    assert call.args[0] == "=" and len(call.args) == 8 + 2 * n and len(call.keys) == 3 + n
    return call


async def test_the_compact_form_adds_each_message_as_the_one_message_form_does(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    sent = await compact_call(k, 4).run(r)
    # The same messages one by one under other msg_ids: each record and entry compared.
    for i in range(1, 5):
        m = msg(i)
        one = inbox.Message(m.data, m.capability, m.attempt, f"x{m.msg_id}", f"x{m.key}")
        await inbox.send_call(
            k, one, agent_id="w-c", priority="low", ttl_ms=TTL_MS, claim_for=OWNER,
            claim_lease_ms=30_000,
        ).run(r)  # fmt: skip
    entries = await r.xrange(k.inbox("w-c", "low"))
    assert [e.decode() for e, _ in entries[:4]] == [s.entry_id for s in sent]
    for (_, batched), (_, alone) in zip(entries[:4], entries[4:], strict=True):
        assert batched.keys() == alone.keys() == {b"e", b"c", b"l"}
        assert (batched[b"e"], batched[b"c"]) == (alone[b"e"], alone[b"c"])
    for i in range(1, 5):
        batched, alone = await r.hgetall(k.idem(f"m{i}")), await r.hgetall(k.idem(f"xm{i}"))
        assert batched.pop(b"lease_until") and alone.pop(b"lease_until")  # times differ
        assert batched == alone
        assert 0 < await r.pttl(k.idem(f"m{i}")) <= TTL_MS


async def test_the_compact_form_stops_exactly_at_the_bound(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.xadd(k.inbox("w-cb", "high"), {"e": b"old"})  # the bound counts every priority
    sent = await compact_call(k, 5, agent_id="w-cb", max_queue=3).run(r)
    assert [s.refused for s in sent] == [False, False, True, True, True]
    assert [s.depth for s in sent[2:]] == [3, 3, 3]
    assert not await r.exists(k.idem("m3"), k.idem("m4"), k.idem("m5"))  # refused: no trace


def _mutate(keys: list[str], args: list[object], how: str) -> tuple[list[str], list[object]]:
    if how == "an argument more":
        return keys, [*args, "x"]
    if how == "a key less":
        return keys[:-1], args
    slot, value = {
        "inbox index": (1, "4"),
        "attempt": (3, "-1"),
        "ttl_ms": (4, "0"),
        "max_queue": (5, "x"),
        "claim for": (6, "no-slash"),
        "claim lease_ms": (7, "0"),
    }[how]
    return keys, [*args[:slot], value, *args[slot + 1 :]]


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("an argument more", r"the compact form wants 8 ARGV and 2 per message, got 13"),
        ("a key less", r"keys: want 5 KEYS for 2 messages, got 4"),
        ("inbox index", r"inbox index \(ARGV\[2\]\) 4: want 1, 2 or 3"),
        ("attempt", r"attempt \(ARGV\[4\]\)"),
        ("ttl_ms", r"ttl_ms \(ARGV\[5\]\)"),
        ("max_queue", r"max_queue \(ARGV\[6\]\)"),
        ("claim for", r"claim for \(ARGV\[7\]\) no-slash"),
        ("claim lease_ms", r"claim lease_ms \(ARGV\[8\]\)"),
    ],
)
async def test_a_bad_compact_call_is_refused_before_any_write(
    r: AnyRedis, ns: str, how: str, says: str
) -> None:
    k = Keys(ns)
    good = compact_call(k, 2)
    keys, args = _mutate(list(good.keys), list(good.args), how)
    with pytest.raises(ResponseError, match=says):
        await scripts.call(r, "send", keys, args)
    assert not await r.exists(*k.inboxes("w-c"), k.idem("m1"), k.idem("m2"))


@pytest.mark.parametrize("broken", ["inbox", "record"])
async def test_a_compact_call_with_a_key_of_another_type_writes_nothing(
    r: AnyRedis, ns: str, broken: str
) -> None:
    k = Keys(ns)
    call = compact_call(k, 3)
    if broken == "inbox":
        await r.set(k.inbox("w-c", "normal"), "not a stream")  # KEYS[2]
        says = r"KEYS\[2\]: holds a string"
    else:
        await r.set(k.idem("m3"), "not a hash")  # KEYS[6]
        says = r"KEYS\[6\]: holds a string"
    with pytest.raises(ResponseError, match=says):
        await call.run(r)
    assert not await r.exists(k.inbox("w-c", "low"), k.idem("m1"), k.idem("m2"))


@pytest.mark.parametrize("odd", ["priority", "capability", "attempt", "caller's key"])
def test_only_a_batch_alike_in_all_but_its_messages_takes_the_compact_form(odd: str) -> None:
    k = Keys("ns-compact")
    other = {
        "priority": (msg(2), "high"),
        "capability": (inbox.Message(b"E", "cap.y", 1, "m2", "m2"), "normal"),
        "attempt": (inbox.Message(b"E", "cap.x", 2, "m2", "m2"), "normal"),
        "caller's key": (msg(2, "order-2"), "normal"),
    }[odd]
    batch = [(msg(1), "normal"), other, (msg(3), "normal")]
    assert inbox.send_batch_call(k, batch, agent_id="w", ttl_ms=TTL_MS).args[0] != "="
    alike = [(msg(i), "normal") for i in (1, 2, 3)]
    assert inbox.send_batch_call(k, alike, agent_id="w", ttl_ms=TTL_MS).args[0] == "="


async def test_the_compact_form_without_a_claim_and_with_a_record_there(
    r: AnyRedis, ns: str
) -> None:
    # No claim: entries hold the envelope alone and records no owner. One record there
    # (m2, done): it keeps its status, the others are marked pending.
    k = Keys(ns)
    await r.hset(k.idem("m2"), mapping={"status": "succeeded", "done": "1"})
    call = inbox.send_batch_call(
        k, [(msg(i), "normal") for i in (1, 2, 3)], agent_id="w-n", ttl_ms=TTL_MS
    )
    assert call.args[0] == "=" and call.args[6] == ""
    sent = await call.run(r)
    assert [s.refused for s in sent] == [False] * 3
    for _, fields in await r.xrange(k.inbox("w-n", "normal")):
        assert fields.keys() == {b"e"}
    for i in (1, 3):
        h = await r.hgetall(k.idem(f"m{i}"))
        assert h[b"status"] == b"pending" and b"owner" not in h and h[b"sent_msg_id"] == b"m%d" % i
    kept = await r.hgetall(k.idem("m2"))
    assert (kept[b"status"], kept[b"done"], kept[b"sent_msg_id"]) == (b"succeeded", b"1", b"m2")

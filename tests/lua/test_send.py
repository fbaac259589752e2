"""send.lua: the inbox entry and the pending record are written together, unless the
agent's inbox is at its bound (and enqueue.lua, the bound on a Cluster)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis, connect
from reach.keys import Keys
from tests.lua.announced import listening

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


async def test_a_copy_of_the_cancelled_msg_id_stays_cancelled(r: AnyRedis, ns: str) -> None:
    # A retry (or a moved entry) of the msg_id cancel.lua cancelled must not run: its
    # status stays; a new message under the key runs again (both forms of send.lua).
    k = Keys(ns)
    inbox, rec = k.inbox("w-1", "low"), k.idem("can-1")
    await r.hset(rec, mapping={"status": "cancelled", "cancel_of": "m5"})
    await scripts.call(
        r, "send", [inbox, rec, k.task("m5")], [b"E", "cap", 2, "m5", "can-1", TTL_MS]
    )
    assert await r.hget(rec, "status") == b"cancelled"
    batch = bounded(k, "w-1", "m5", "low")
    args = [b"E", "cap", 3, "m5", "can-1", TTL_MS, 0]
    assert len(await scripts.call(r, "send", batch, args)) > 0
    assert await r.hget(rec, "status") == b"cancelled"
    await scripts.call(
        r, "send", [inbox, rec, k.task("m6")], [b"E", "cap", 1, "m6", "can-1", TTL_MS]
    )
    assert await r.hget(rec, "status") == b"pending"
    assert await r.xlen(inbox) == 3


# -- the queue bound (issue 9, item 6) ------------------------------------------------
def bounded(k: Keys, agent: str, msg: str, priority: str = "normal") -> list[str]:
    return [k.inbox(agent, priority), k.idem(msg), k.task(msg), *k.inboxes(agent)]


async def test_a_full_inbox_refuses_and_writes_nothing(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.xadd(k.inbox("w-1", "high"), {"e": b"A"})
    await r.xadd(k.inbox("w-1", "low"), {"e": b"B"})
    keys = bounded(k, "w-1", "m4")
    depth = await scripts.call(r, "send", keys, [b"ENV", "cap", 1, "m4", "order-9", TTL_MS, 2])
    assert depth == 2  # an integer: the inbox's depth, at the bound
    assert await r.xlen(k.inbox("w-1", "normal")) == 0
    assert await r.exists(k.idem("order-9"), k.task("m4")) == 0  # no pending record


async def test_under_the_bound_it_adds_and_counts_all_three_priorities(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    await r.xadd(k.inbox("w-1", "high"), {"e": b"A"})
    got = await scripts.call(
        r, "send", bounded(k, "w-1", "m5", "low"), [b"ENV", "cap", 1, "m5", "", TTL_MS, 3]
    )
    assert isinstance(got, bytes)  # an entry id
    got = await scripts.call(
        r, "send", bounded(k, "w-1", "m6"), [b"ENV", "cap", 1, "m6", "", TTL_MS, 3]
    )
    assert isinstance(got, bytes)
    assert (
        await scripts.call(
            r, "send", bounded(k, "w-1", "m7"), [b"ENV", "cap", 1, "m7", "", TTL_MS, 3]
        )
        == 3
    )
    assert (await r.hgetall(k.idem("m6")))[b"status"] == b"pending"
    assert await r.exists(k.idem("m7")) == 0


async def test_a_bound_of_zero_means_unbounded(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox = k.inbox("w-1", "normal")
    for i in range(3):
        await scripts.call(
            r,
            "send",
            [inbox, k.idem(f"z{i}"), k.task(f"z{i}")],
            [b"ENV", "cap", 1, f"z{i}", "", TTL_MS, 0],
        )
    assert await r.xlen(inbox) == 3


async def test_concurrent_senders_never_pass_the_bound(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)

    async def one(i: int) -> Any:
        return await scripts.call(
            r,
            "send",
            bounded(k, "w-2", f"c{i}", ("high", "low")[i % 2]),
            [b"ENV", "cap", 1, f"c{i}", "", TTL_MS, 25],
        )

    results: list[Any] = []

    async def run(i: int) -> None:
        results.append(await one(i))

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(run, i)
    accepted = [x for x in results if isinstance(x, bytes)]
    assert len(accepted) == 25
    assert sorted({x for x in results if isinstance(x, int)}) == [25]
    assert sum([await r.xlen(s) for s in k.inboxes("w-2")]) == 25


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([b"ENV", "cap", "x", "m", "", TTL_MS], "attempt"),
        ([b"ENV", "cap", 1, "m", "", ""], "ttl_ms"),
        ([b"ENV", "cap", 1, "m", "", "1e9"], "ttl_ms"),
        ([b"ENV", "cap", 1, "m", "", 0], "ttl_ms"),
        ([b"ENV", "cap", 1, "m", "", TTL_MS, "-1"], "max_queue"),
        ([b"ENV", "cap", 1, "m", "", TTL_MS, "nan"], "max_queue"),
        ([b"ENV", "cap", 1, "m", ""], "arguments"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, args: list[Any], why: str
) -> None:
    k = Keys(ns)
    keys = bounded(k, "w-3", "m")
    with pytest.raises(ResponseError, match=f"reach: bad {why}"):
        await scripts.call(r, "send", keys, args)
    assert await r.exists(*keys) == 0


async def test_a_bound_without_the_inbox_keys_is_refused(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    keys = [k.inbox("w-3", "normal"), k.idem("m"), k.task("m")]
    with pytest.raises(ResponseError, match="reach: bad keys"):
        await scripts.call(r, "send", keys, [b"ENV", "cap", 1, "m", "", TTL_MS, 5])
    assert await r.exists(*keys) == 0


async def test_a_record_of_the_wrong_type_is_refused_before_the_add(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.set(k.idem("m8"), "not a hash")
    inbox = k.inbox("w-4", "normal")
    with pytest.raises(ResponseError, match=r"reach: bad KEYS\[2\]: holds a string"):
        await scripts.call(
            r, "send", [inbox, k.idem("m8"), k.task("m8")], [b"ENV", "cap", 1, "m8", "", TTL_MS]
        )
    assert await r.exists(inbox) == 0  # no entry whose record could not be written


async def test_an_inbox_of_another_type_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.set(k.inbox("w-4", "low"), "not a stream")
    alone = [k.inbox("w-4", "low"), k.idem("m9"), k.task("m9")]
    with pytest.raises(ResponseError, match=r"reach: bad KEYS\[1\]: holds a string, want a stream"):
        await scripts.call(r, "send", alone, [b"ENV", "cap", 1, "m9", "", TTL_MS])
    # Bounded: the three inboxes are counted, and each must be a stream.
    keys = bounded(k, "w-4", "m9", "high")
    with pytest.raises(ResponseError, match=r"reach: bad KEYS\[6\]: holds a string, want a stream"):
        await scripts.call(r, "send", keys, [b"ENV", "cap", 1, "m9", "", TTL_MS, 5])
    assert await r.exists(k.inbox("w-4", "high"), k.idem("m9")) == 0


async def test_a_pointer_of_another_type_is_refused_only_when_written(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, ptr = k.inbox("w-4", "normal"), k.task("m10")
    await r.hset(ptr, "x", "1")  # not a string
    with pytest.raises(ResponseError, match=r"reach: bad KEYS\[3\]: holds a hash, want a string"):
        await scripts.call(
            r, "send", [inbox, k.idem("order-10"), ptr], [b"E", "cap", 1, "m10", "order-10", TTL_MS]
        )
    assert await r.exists(inbox, k.idem("order-10")) == 0
    # Named by its msg_id, the message has no pointer: that key is not written, not judged.
    assert await scripts.call(
        r, "send", [inbox, k.idem("m10"), ptr], [b"E", "cap", 1, "m10", "", TTL_MS]
    )
    assert await r.hget(ptr, "x") == b"1"


# -- enqueue.lua: the Cluster form of the bound ------------------------------------------
async def test_enqueue_adds_under_the_bound_and_refuses_at_it(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    keys = [k.inbox("w-5", "normal"), *k.inboxes("w-5")]
    first = await scripts.call(r, "enqueue", keys, [b"ENV", 2])
    await r.xadd(k.inbox("w-5", "high"), {"e": b"A"})
    assert isinstance(first, bytes)
    assert await scripts.call(r, "enqueue", keys, [b"ENV", 2]) == 2
    assert [f for _, f in await r.xrange(keys[0])] == [{b"e": b"ENV"}]
    for bad in (0, "", "abc", "1e3"):
        with pytest.raises(ResponseError, match="reach: bad call"):
            await scripts.call(r, "enqueue", keys, [b"ENV", bad])
    assert await r.xlen(keys[0]) == 1


async def test_enqueue_on_a_cluster_keeps_to_the_inbox_slot(redis_cluster: Any) -> None:
    rc = await connect(redis_cluster.url)
    try:
        k = Keys("tcl" + uuid.uuid4().hex[:8])
        keys = [k.inbox("w-6", "low"), *k.inboxes("w-6")]
        assert isinstance(await scripts.call(rc, "enqueue", keys, [b"E", 1]), bytes)
        assert await scripts.call(rc, "enqueue", keys, [b"E", 1]) == 1
    finally:
        await rc.aclose()


async def test_enqueue_wakes_the_agent_on_its_shard_channel_and_a_refusal_does_not(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    """An added entry is announced on the agent's wake-up channel (SPUBLISH, what a waiting
    runtime on a Cluster subscribes to); an add refused at the bound announces nothing."""
    k = Keys(ns)
    keys = [k.inbox("w-7", "normal"), *k.inboxes("w-7")]
    sub = aredis.Redis.from_url(redis_url)
    ps = sub.pubsub()
    try:
        await ps.execute_command("SSUBSCRIBE", k.wake("w-7"))
        with anyio.fail_after(10):
            while (m := await ps.get_message(timeout=1.0)) is None or m["type"] != "ssubscribe":
                pass
        assert isinstance(await scripts.call(r, "enqueue", keys, [b"E", 1]), bytes)
        assert await scripts.call(r, "enqueue", keys, [b"E", 1]) == 1  # refused
        got = []
        with anyio.move_on_after(1.0):  # the refusal's message, if there were one
            while True:
                m = await ps.get_message(timeout=0.2)
                if m is not None:
                    got.append((m["type"], m["channel"]))
        assert got == [("smessage", k.wake("w-7").encode())]
    finally:
        await ps.aclose()
        await sub.aclose()


async def test_a_send_announces_only_a_record_it_turns_pending_again(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    # Only a watched record announces: a new one has no watcher yet (its msg_id is not out
    # before the send returns), an unwatched one nobody listens to.
    k = Keys(ns)
    inbox, rec, ptr = k.inbox("w-1", "normal"), k.idem("order-9"), k.task("m9")
    args = [b"ENV", "cap", 1, "m9", "order-9", TTL_MS]
    async with listening(redis_url, rec) as heard:
        await scripts.call(r, "send", [inbox, rec, ptr], args)
        assert await heard() == []
        await r.hset(rec, "status", "dead")  # released: a send under the key runs again
        await scripts.call(r, "send", [inbox, rec, ptr], args)
        assert await heard() == []
        await r.hset(rec, mapping={"status": "dead", "watched": 1})
        await scripts.call(r, "send", [inbox, rec, ptr], args)
        assert await heard() == [b"pending"]

"""The typed calls of the script layer on real servers: the same call, and the same
answers, on standalone Redis (one call per batch) and on a Cluster (one per slot)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis, connect
from reach.keys import GROUP, Keys
from reach.registry import Registry
from reach.scripts import ClaimCode, DropInboxCode, SettleCode, delivery, inbox
from reach.scripts.delivery import ClaimItem, Completion, DeadLetter, Delayed, Mode, SettleItem
from tests.support.cluster import RedisTestCluster
from tests.support.registry_helpers import new_version

pytestmark = pytest.mark.anyio

TTL_MS = 60_000
OWNER = "w/1"


@pytest.fixture(
    params=[False, pytest.param(True, marks=pytest.mark.cluster)], ids=["one", "cluster"]
)
async def db(request: pytest.FixtureRequest, r: AnyRedis) -> AsyncIterator[tuple[AnyRedis, bool]]:
    """A standalone server, or a 3-master Cluster, and which one it is."""
    if not request.param:
        yield r, False
        return
    cluster: RedisTestCluster = request.getfixturevalue("redis_cluster")
    client = await connect(cluster.url)
    yield client, True
    await client.aclose()


def _letter(stream: str) -> DeadLetter:
    return DeadLetter(stream, 100, "unprocessable", "e", "T", 1, "w", "m", "cap", 1, b"?")


async def _claim(db: tuple[AnyRedis, bool], items: list[ClaimItem]) -> list[object]:
    rr, cluster = db
    return list(
        await delivery.claim(rr, items, cluster=cluster, owner=OWNER, ttl_ms=TTL_MS, agent_id="w")
    )


async def test_claim_answers_each_key_and_refuses_only_the_bad_record(
    db: tuple[AnyRedis, bool], ns: str
) -> None:
    rr, _ = db
    k = Keys(ns)
    await rr.hset(k.idem("done"), mapping={"done": "1", "reply": "R"})
    await rr.set(k.idem("bad"), "not a hash")
    items = [ClaimItem(k.idem(n), 30_000, f"m-{n}") for n in ("new", "done", "bad", "new")]
    got = await _claim(db, items)
    assert got[0] == delivery.Claimed(ClaimCode.RUN, fence=1)
    assert got[1] == delivery.Claimed(ClaimCode.REPLAY, reply=b"R")
    assert isinstance(got[2], rexc.ResponseError) and scripts.is_data_error(got[2])
    assert got[3] == delivery.Claimed(ClaimCode.BUSY, owner=OWNER)  # the copy just claimed
    assert await _claim(db, []) == []


async def test_takeover_from_the_gone_owner_claims_in_the_same_call(
    db: tuple[AnyRedis, bool], ns: str
) -> None:
    key = Keys(ns).idem("k")
    assert (await _claim(db, [ClaimItem(key, 30_000, "m")]))[0] == delivery.Claimed(
        ClaimCode.RUN, fence=1
    )
    # Judged gone: someone else than the owner that holds it. Its claim stands.
    got = await _claim(db, [ClaimItem(key, 30_000, "m", takeover_from="gone/0")])
    assert got[0] == delivery.Claimed(ClaimCode.BUSY, owner=OWNER)
    got = await _claim(db, [ClaimItem(key, 30_000, "m", takeover_from=OWNER)])
    assert got[0] == delivery.Claimed(ClaimCode.RUN, fence=2)


async def test_complete_is_fenced_for_a_stale_owner(db: tuple[AnyRedis, bool], ns: str) -> None:
    rr, cluster = db
    k = Keys(ns)
    await _claim(db, [ClaimItem(k.idem(n), 30_000, "m") for n in ("a", "b")])
    items = [
        (Completion(k.idem("a"), 1, "succeeded", Mode.DONE), b"RA"),
        (Completion(k.idem("b"), 9, "succeeded", Mode.DONE), b"RB"),
    ]
    got = await delivery.complete(rr, items, cluster=cluster, ttl_ms=TTL_MS)
    assert got == [SettleCode.SETTLED, SettleCode.FENCED]
    assert await rr.hmget(k.idem("a"), "done", "reply", "status") == [b"1", b"RA", b"succeeded"]
    assert await rr.hget(k.idem("b"), "done") is None


async def _pending_entries(rr: AnyRedis, stream: str, n: int) -> list[bytes]:
    await rr.xgroup_create(stream, GROUP, "0", mkstream=True)
    for i in range(n):
        await rr.xadd(stream, {"e": f"env-{i}"})
    got = await rr.xreadgroup(GROUP, "w", {stream: ">"}, count=n)
    return [entry_id for entry_id, _ in got[0][1]]


async def test_settle_writes_replies_and_follow_ups_then_acks_except_fenced(
    db: tuple[AnyRedis, bool], ns: str
) -> None:
    rr, cluster = db
    k = Keys(ns)
    stream = k.inbox("agent", "normal")
    ids = await _pending_entries(rr, stream, 3)
    await _claim(db, [ClaimItem(k.idem(n), 30_000, "m") for n in ("a", "b")])
    trips: list[str] = []
    items = [
        SettleItem(
            stream,
            ids[0],
            Completion(k.idem("a"), 1, "succeeded", Mode.DONE),
            reply=b"RA",
            reply_stream=k.replies("c1"),
            follow_up=Delayed(k.delayed, 5, b"retry"),
        ),
        SettleItem(stream, ids[1], Completion(k.idem("b"), 7, "dead", Mode.RELEASE)),
        SettleItem(stream, ids[2], follow_up=_letter(k.dlq("cap"))),
    ]
    got = await delivery.settle(
        rr, items, cluster=cluster, ttl_ms=TTL_MS, on_round_trip=trips.append
    )
    assert got == [SettleCode.SETTLED, SettleCode.FENCED, SettleCode.SETTLED]
    # Cluster: the writes, checked, then the acks of the items whose writes succeeded.
    assert trips == (["complete", "settle", "settle"] if cluster else ["settle"])
    assert [f for _, f in await rr.xrange(k.replies("c1"))] == [{b"r": b"RA"}]
    assert await rr.zrange(k.delayed, 0, -1) == [b"retry"]
    assert await rr.xlen(k.dlq("cap")) == 1
    # acked and deleted, but the fenced entry stays pending for its owner's next scan
    assert [e for e, _ in await rr.xrange(stream)] == [ids[1]]
    assert (await rr.xpending(stream, GROUP))["pending"] == 1
    assert await delivery.settle(rr, [], cluster=cluster, ttl_ms=TTL_MS) == []


async def test_settle_replaces_an_item_whose_record_is_refused(
    db: tuple[AnyRedis, bool], ns: str
) -> None:
    rr, cluster = db
    k = Keys(ns)
    stream = k.inbox("agent", "normal")
    ids = await _pending_entries(rr, stream, 2)
    await _claim(db, [ClaimItem(k.idem("a"), 30_000, "m")])
    await rr.set(k.idem("bad"), "not a hash")
    refused: list[int] = []

    def instead(i: int, item: SettleItem, e: Exception) -> SettleItem:
        assert scripts.is_data_error(e)
        refused.append(i)
        return SettleItem(item.inbox, item.entry_id, follow_up=_letter(k.dlq("x")))

    items = [
        SettleItem(stream, ids[0], Completion(k.idem("a"), 1, "succeeded", Mode.DONE), b"R"),
        SettleItem(stream, ids[1], Completion(k.idem("bad"), 1, "succeeded", Mode.DONE), b"R"),
    ]
    got = await delivery.settle(rr, items, cluster=cluster, ttl_ms=TTL_MS, on_refused=instead)
    assert got == [SettleCode.SETTLED, SettleCode.SETTLED]
    assert refused == [1]
    assert await rr.xlen(k.dlq("x")) == 1
    assert await rr.xlen(stream) == 0
    assert await rr.hget(k.idem("a"), "done") == b"1"


async def test_settle_alone_drops_an_entry_nothing_can_settle(r: AnyRedis, ns: str) -> None:
    """Standalone: refused, and its replacement refused too: the entry is only acked."""
    k = Keys(ns)
    stream = k.inbox("agent", "normal")
    ids = await _pending_entries(r, stream, 2)
    await r.set(k.dlq("x"), "not a stream")
    await r.set(k.idem("bad"), "not a hash")
    items = [
        SettleItem(stream, ids[0], follow_up=Delayed(k.delayed, 1, b"ok")),
        SettleItem(stream, ids[1], Completion(k.idem("bad"), 1, "dead", Mode.RELEASE)),
    ]

    def instead(i: int, item: SettleItem, e: Exception) -> SettleItem:
        return SettleItem(item.inbox, item.entry_id, follow_up=_letter(k.dlq("x")))

    got = await delivery.settle(r, items, cluster=False, ttl_ms=TTL_MS, on_refused=instead)
    assert got[0] is SettleCode.SETTLED
    assert isinstance(got[1], rexc.ResponseError) and scripts.is_data_error(got[1])
    assert await r.xlen(stream) == 0 and (await r.xpending(stream, GROUP))["pending"] == 0
    assert await r.zrange(k.delayed, 0, -1) == [b"ok"]


async def test_fetch(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    call = delivery.fetch(k, agent_id="a", n=10, keep_normal=1, keep_low=1)
    with pytest.raises(rexc.ResponseError, match="NOGROUP"):
        await call.run(r)
    for s in k.inboxes("a"):
        await r.xgroup_create(s, GROUP, "0", mkstream=True)
    await r.xadd(k.inbox("a", "low"), {"e": "x"})
    got = await call.run(r)
    assert [(s, [f for _, f in e]) for s, e in got.got] == [(k.inbox("a", "low"), [[b"e", b"x"]])]
    assert got.normal_waiting is False and got.low_waiting is False


def _msg(i: int) -> inbox.Message:
    return inbox.Message(
        data=f"env-{i}".encode(), capability="cap", attempt=0, msg_id=f"m{i}", key=f"m{i}"
    )


async def test_send_within_the_bound_and_the_record(db: tuple[AnyRedis, bool], ns: str) -> None:
    rr, cluster = db
    k = Keys(ns)

    async def send(i: int, max_queue: int) -> inbox.Sent:
        return await inbox.send(
            rr,
            k,
            _msg(i),
            cluster=cluster,
            agent_id="a",
            priority="high",
            ttl_ms=TTL_MS,
            max_queue=max_queue,
        )

    first = await send(1, 0)
    assert not first.refused and first.entry_id
    assert await rr.hmget(k.idem("m1"), "status", "capability") == [b"pending", b"cap"]
    assert not (await send(2, 2)).refused
    full = await send(3, 2)
    assert full.refused and full.depth == 2
    assert await rr.exists(k.idem("m3")) == 0
    assert await rr.xlen(k.inbox("a", "high")) == 2


async def test_drop_inbox(db: tuple[AnyRedis, bool], ns: str) -> None:
    rr, _ = db
    k = Keys(ns)
    await rr.xadd(k.inbox("a", "low"), {"e": "x"})
    assert await inbox.drop_inbox(k, agent_id="a").run(rr) is DropInboxCode.KEPT
    await rr.delete(k.inbox("a", "low"))
    assert await inbox.drop_inbox(k, agent_id="a").run(rr) is DropInboxCode.DROPPED


async def test_run_calls_decodes_each_and_leaves_errors_in_place(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.set(k.idem("bad"), "x")
    calls = [
        delivery.give_up(k.idem("none"), status="dead", error="", ttl_ms=TTL_MS),
        delivery.give_up(k.idem("bad"), status="dead", error="", ttl_ms=TTL_MS),
    ]
    got = await scripts.run_calls(r, calls)
    assert got[0] == delivery.GivenUp(done=False)
    assert isinstance(got[1], rexc.ResponseError)


def test_the_heartbeat_thread_runs_the_same_calls_synchronously(
    sync_r: redis.Redis, ns: str
) -> None:
    reg = Registry(sync_r, ns)
    version = new_version()
    done = reg.register_call(
        "s1",
        instance_id="i",
        version=version,
        capabilities=["c"],
        lease_ms=60_000,
        evict_after_ms=60_000,
    ).run_sync(sync_r)
    assert reg.check_registration("s1", version, done) is scripts.RegisterCode.NEW
    hb = reg.heartbeat_call("s1", instance_id="i", version=version, queue_depth=3, inflight=1)
    assert hb.run_sync(sync_r) == scripts.agents.Heartbeat(scripts.HeartbeatCode.RENEWED)
    stale = reg.heartbeat_call(
        "s1", instance_id="i", version=version - 1, queue_depth=0, inflight=0
    )
    assert stale.run_sync(sync_r).code is scripts.HeartbeatCode.STALE


async def test_give_up_unless_done(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.hset(k.idem("done"), mapping={"done": "1", "reply": "R"})
    gone = await delivery.give_up(
        k.idem("gone"), status="expired", error="late", ttl_ms=TTL_MS
    ).run(r)
    assert gone == delivery.GivenUp(done=False)
    assert await r.hmget(k.idem("gone"), "status", "error") == [b"expired", b"late"]
    done = await delivery.give_up(k.idem("done"), status="dead", error="x", ttl_ms=TTL_MS).run(r)
    assert done == delivery.GivenUp(done=True, reply=b"R")

"""mark_pending.lua: a Cluster send's record step marks the task pending in a script, as
send.lua does on standalone Redis (the status of a done or running key is kept; a
released key, which runs again, is pending anew)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis, connect
from reach.keys import Keys
from reach.scripts import inbox
from tests.lua.announced import listening
from tests.support.cluster import RedisTestCluster

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


def _msg(msg_id: str, key: str = "", attempt: int = 1) -> inbox.Message:
    return inbox.Message(
        data=b"ENV",
        capability="text.summarize",
        attempt=attempt,
        msg_id=msg_id,
        key=key or msg_id,
        idempotency_key=key,
    )


async def test_it_marks_the_record_pending(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    marked = await inbox.mark_pending_call(k, _msg("m1"), ttl_ms=TTL_MS).run(r)
    assert marked is True
    h = await r.hgetall(k.idem("m1"))
    assert h == {
        b"status": b"pending",
        b"capability": b"text.summarize",
        b"attempt": b"1",
        b"sent_msg_id": b"m1",
    }
    assert 0 < await r.pttl(k.idem("m1")) <= TTL_MS


async def test_a_stored_status_is_kept_the_rest_written(r: AnyRedis, ns: str) -> None:
    # A duplicate send under a finished key must not turn 'succeeded' back into 'pending'.
    k = Keys(ns)
    rec = k.idem("order-1")
    await r.hset(rec, mapping={"status": "succeeded", "done": "1", "reply": b"R"})
    marked = await inbox.mark_pending_call(k, _msg("m2", "order-1", 2), ttl_ms=TTL_MS).run(r)
    assert marked is False
    h = await r.hgetall(rec)
    assert h[b"status"] == b"succeeded" and h[b"reply"] == b"R"
    assert h[b"attempt"] == b"2" and h[b"sent_msg_id"] == b"m2"
    assert 0 < await r.pttl(rec) <= TTL_MS


@pytest.mark.parametrize(
    ("had", "kept"),
    [
        ({"status": "running", "owner": "w/i", "fence": "1"}, True),
        ({"status": "dead", "error": "no"}, False),  # released: it runs again
        ({"status": "failed"}, False),
        ({"status": "expired"}, False),
        ({"status": "retrying"}, False),
    ],
)
async def test_a_released_key_is_pending_again_a_running_one_kept(
    r: AnyRedis, ns: str, had: dict[str, str], kept: bool
) -> None:
    # A dead letter replayed under its key runs again: its record must not keep saying
    # 'dead' meanwhile (a caller's result() would read the last run's outcome as this one's).
    k = Keys(ns)
    for name, call in (
        ("mp", lambda key: inbox.mark_pending_call(k, _msg("m3", key), ttl_ms=TTL_MS)),
        ("send", lambda key: inbox.send_call(k, _msg("m3", key), agent_id="w",
                                             priority="normal", ttl_ms=TTL_MS)),
    ):  # fmt: skip
        key = f"{name}-{had['status']}"
        await r.hset(k.idem(key), mapping=had)
        await call(key).run(r)
        want = had["status"] if kept else "pending"
        assert (await r.hget(k.idem(key), "status")).decode() == want, name


@pytest.mark.parametrize("status", ["dead", "failed", "expired", "retrying"])
async def test_a_run_settled_before_the_mark_keeps_its_outcome(
    r: AnyRedis, ns: str, status: str
) -> None:
    # On a Cluster the inbox entry may be read, run and settled before the record step of
    # the send lands on the record's node: the late mark must not say 'pending' again.
    k = Keys(ns)
    rec = k.idem("m9")
    await r.hset(rec, mapping={"status": status, "fence": "1", "runs": "1", "error": "no"})
    marked = await inbox.mark_pending_call(k, _msg("m9"), ttl_ms=TTL_MS).run(r)
    assert marked is False
    h = await r.hgetall(rec)
    assert h[b"status"] == status.encode() and h[b"attempt"] == b"1"
    # Once a send has marked the record (attempt written), a released key runs again.
    await r.hset(rec, mapping={"status": status})
    assert await inbox.mark_pending_call(k, _msg("m9", attempt=2), ttl_ms=TTL_MS).run(r)
    assert await r.hget(rec, "status") == b"pending"


async def test_the_same_record_as_send_lua_writes(r: AnyRedis, ns: str) -> None:
    """The Cluster step and send.lua leave the same record (the pointer apart)."""
    k1, k2 = Keys(ns + "a"), Keys(ns + "b")
    m = _msg("m3", "order-3")
    await inbox.send_call(k1, m, agent_id="w", priority="low", ttl_ms=TTL_MS).run(r)
    await inbox.mark_pending_call(k2, m, ttl_ms=TTL_MS).run(r)
    assert await r.hgetall(k1.idem("order-3")) == await r.hgetall(k2.idem("order-3"))


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["cap", "x", "m", TTL_MS], "attempt"),
        (["cap", "-1", "m", TTL_MS], "attempt"),
        (["cap", "1e3", "m", TTL_MS], "attempt"),
        (["cap", "1000000000000000", "m", TTL_MS], "attempt"),
        (["cap", 1, "m", ""], "ttl_ms"),
        (["cap", 1, "m", 0], "ttl_ms"),
        (["cap", 1, "m", "007"], "ttl_ms"),
        (["cap", 1, "m", 31536000001], "ttl_ms"),
        (["cap", 1, "m"], "arguments"),
        (["cap", 1, "m", TTL_MS, "x"], "arguments"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, args: list[Any], why: str
) -> None:
    rec = Keys(ns).idem("m")
    with pytest.raises(ResponseError, match=f"^reach: bad {why}"):
        await scripts.call(r, "mark_pending", [rec], args)
    assert await r.exists(rec) == 0


async def test_two_keys_are_refused(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    with pytest.raises(ResponseError, match="^reach: bad arguments"):
        await scripts.call(r, "mark_pending", [k.idem("m"), k.idem("n")], ["c", 1, "m", TTL_MS])
    assert await r.exists(k.idem("m"), k.idem("n")) == 0


async def test_a_record_of_the_wrong_type_is_refused(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("m4")
    await r.set(rec, "not a hash")
    with pytest.raises(ResponseError, match=r"^reach: bad KEYS\[1\]: holds a string"):
        await scripts.call(r, "mark_pending", [rec], ["cap", 1, "m4", TTL_MS])
    assert await r.get(rec) == b"not a hash"


# -- on a Cluster: inbox.send's record step -----------------------------------------------
@pytest.mark.cluster
@pytest.mark.parametrize("max_queue", [0, 5], ids=["unbounded", "bounded"])
async def test_a_cluster_send_marks_pending_through_the_script(
    redis_cluster: RedisTestCluster, ns: str, max_queue: int
) -> None:
    rc = await connect(redis_cluster.url)
    try:
        k = Keys(ns)
        await rc.hset(k.idem("done-key"), mapping={"status": "succeeded", "reply": b"R"})
        await rc.set(k.idem("bad-key"), "not a hash")
        for m in (_msg("c1"), _msg("c2", "done-key"), _msg("c3", "bad-key")):
            sent = await inbox.send(
                rc,
                k,
                m,
                cluster=True,
                agent_id="w",
                priority="normal",
                ttl_ms=TTL_MS,
                max_queue=max_queue,
            )
            assert not sent.refused
        assert await rc.xlen(k.inbox("w", "normal")) == 3  # each message is sent
        assert await rc.hget(k.idem("c1"), "status") == b"pending"
        assert await rc.exists(k.task("c1")) == 0  # the key is the msg_id: no pointer
        assert await rc.hget(k.idem("done-key"), "status") == b"succeeded"
        assert await rc.get(k.task("c2")) == b"done-key"
        # A record of another type is refused by the script (its error is not raised: the
        # message is sent, the record is a status only), and left as it was.
        assert await rc.get(k.idem("bad-key")) == b"not a hash"
    finally:
        await rc.aclose()


async def test_a_copy_of_a_cancelled_msg_id_stays_cancelled(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    await r.hset(k.idem("c1"), mapping={"status": "cancelled", "cancel_of": "m1"})
    assert await inbox.mark_pending_call(k, _msg("m1", "c1", 2), ttl_ms=TTL_MS).run(r) is False
    assert await r.hget(k.idem("c1"), "status") == b"cancelled"
    # Another message under the key runs again.
    assert await inbox.mark_pending_call(k, _msg("m2", "c1"), ttl_ms=TTL_MS).run(r) is True
    assert await r.hget(k.idem("c1"), "status") == b"pending"


async def test_pending_is_announced_a_kept_status_not(r: AnyRedis, redis_url: str, ns: str) -> None:
    k = Keys(ns)
    rec = k.idem("m-announced")
    await r.hset(rec, mapping={"status": "dead", "watched": 1})
    async with listening(redis_url, rec) as heard:
        assert await inbox.mark_pending_call(k, _msg("m-announced"), ttl_ms=TTL_MS).run(r)
        await r.hset(rec, "status", "running")
        assert not await inbox.mark_pending_call(k, _msg("m-announced"), ttl_ms=TTL_MS).run(r)
        assert await heard() == [b"pending"]

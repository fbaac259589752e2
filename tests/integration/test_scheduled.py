"""Scheduled sends (issue 29, item 2), in-process agents on a real Redis: a send kept until
its due time has a ``scheduled`` task record and a listing entry, runs once and not before
it is due; a cancelled one never runs; a due time already past sends at once; bad
``at``/``delay_s`` are refused before anything is written; a signed send keeps its
sender's signature. Side effects are counted in Redis (tests/support/agents_schedule.py).
The restarts (every process, and Redis with AOF) are in tests/chaos/test_scheduled_restarts.py."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reach import Client, ConfigError, RedisUnavailable
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.envelope import decode_envelope
from reach.keys import Keys
from reach.scheduling import list_scheduled
from reach.scripts.scheduling import take_due_call
from tests.support.agents_messaging import effects, serving, wait_status
from tests.support.agents_schedule import CAP, make
from tests.support.cluster import RedisTestCluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio


async def ran(r: AnyRedis, ns: str, msg_id: str) -> int:
    return (await effects(r, ns, "work")).get(msg_id, 0)


async def ran_at_ms(r: AnyRedis, ns: str, msg_id: str) -> int:
    return int(await r.hget(Keys(ns).effects("ran_ms"), msg_id) or 0)


async def test_a_scheduled_send_waits_in_redis_then_runs_once(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, make()) as c:
        before_ms = int(time.time() * 1000)
        msg_id = await c.send(CAP, {"n": 1}, delay_s=1.0)
        st = await c.task(msg_id)
        assert st.status == "scheduled" and st.capability == CAP
        [listed] = await c.scheduled()
        assert [listed] == await list_scheduled(r, Keys(ns))
        assert (listed.msg_id, listed.capability) == (msg_id, CAP)
        assert listed.due_ms >= before_ms + 1000 and st.due_ms == listed.due_ms
        await wait_status(c, msg_id, "succeeded", timeout=30)
        assert await ran(r, ns, msg_id) == 1
        assert await ran_at_ms(r, ns, msg_id) >= listed.due_ms  # never before its due time
        assert await list_scheduled(r, Keys(ns)) == []
        k = Keys(ns)
        assert await r.exists(k.scheduled, k.scheduled_envelopes) == 0  # nothing left behind


async def test_at_takes_a_datetime_and_epoch_seconds(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make()) as c:
        a = await c.send(CAP, 1, at=datetime.now(UTC) + timedelta(seconds=0.5))
        b = await c.send(CAP, 2, at=time.time() + 0.5)
        for m in (a, b):
            await wait_status(c, m, "succeeded", timeout=30)
            assert await ran(r, ns, m) == 1


async def test_a_cancelled_scheduled_send_never_runs(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make()) as c:
        cancelled = await c.send(CAP, "no", delay_s=0.5)
        later = await c.send(CAP, "yes", delay_s=1.0)  # due after it: its run is our event
        res = await c.cancel(cancelled)
        assert res.cancelled and res.status == "scheduled"
        assert [s.msg_id for s in await list_scheduled(r, Keys(ns))] == [later]
        await wait_status(c, later, "succeeded", timeout=30)
        assert await ran(r, ns, cancelled) == 0
        assert (await c.task(cancelled)).status == "cancelled"
        assert (await c.cancel(cancelled)).outcome == "already_cancelled"


async def test_a_due_time_already_past_sends_at_once(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make()) as c:
        m1 = await c.send(CAP, 1, at=time.time() - 60)
        m2 = await c.send(CAP, 2, delay_s=0)
        assert await r.zcard(Keys(ns).scheduled) == 0  # never kept: sent as any message
        for m in (m1, m2):
            await wait_status(c, m, "succeeded", timeout=30)


BAD: dict[str, Callable[[float], dict[str, Any]]] = {
    "naive datetime": lambda now: {"at": datetime(2030, 1, 1)},  # whose 1 January?
    "both at and delay_s": lambda now: {"at": now + 60, "delay_s": 1},
    "negative delay": lambda now: {"delay_s": -1},
    "nan delay": lambda now: {"delay_s": math.nan},
    "infinite delay": lambda now: {"delay_s": math.inf},
    "bool delay": lambda now: {"delay_s": True},
    "negative at": lambda now: {"at": -5},
    "text at": lambda now: {"at": "tomorrow"},
    "over a year ahead": lambda now: {"delay_s": 400 * 86400},
    "expires before due": lambda now: {"delay_s": 10, "deadline_ms": int(now * 1000) + 5000},
    "zero timeout": lambda now: {"delay_s": 10, "timeout_s": 0},
    "where": lambda now: {"delay_s": 10, "where": {"region": "eu"}},
    "reroute_after_s": lambda now: {"delay_s": 10, "reroute_after_s": 1.0},
}


@pytest.mark.parametrize("case", sorted(BAD))
async def test_bad_at_or_delay_is_refused_before_anything_is_written(
    redis_url: str, ns: str, r: AnyRedis, case: str
) -> None:
    kwargs: dict[str, Any] = BAD[case](time.time())
    async with Client(redis_url=redis_url, namespace=ns) as c:
        with pytest.raises(ConfigError):
            await c.send(CAP, 1, **kwargs)
    assert await r.keys(f"*{ns}*") == []


async def test_the_deadline_counts_from_the_due_time(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make()) as c:
        # timeout_s shorter than the delay: counted from now it would expire unrun.
        m = await c.send(CAP, 1, delay_s=1.0, timeout_s=0.5)
        await wait_status(c, m, "succeeded", timeout=30)
        assert await ran(r, ns, m) == 1


async def test_a_send_with_its_own_idempotency_key_is_found_by_msg_id(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, make()) as c:
        m = await c.send(CAP, 1, delay_s=0.5, idempotency_key="order-7")
        st = await c.task(m)
        assert (st.status, st.idempotency_key) == ("scheduled", "order-7")
        await wait_status(c, m, "succeeded", timeout=30)


async def test_many_sends_due_together_each_run_once(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, make()) as c:
        due = time.time() + 1.0
        ids = [await c.send(CAP, i, at=due) for i in range(300)]

        async def all_ran() -> bool:
            return len(await effects(r, ns, "work")) == len(ids)

        await wait_until(all_ran, timeout_s=60, what="every scheduled send ran")
        counts = await effects(r, ns, "work")
        assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}


async def test_a_mover_that_died_after_placing_is_healed_by_the_lease(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    """A mover took a due send and placed it, then died before removing it: the entry is
    taken again when its lease ends and placed a second time, and idempotency runs it once."""
    k = Keys(ns)
    async with serving(redis_url, ns, make()) as c:
        m = await c.send(CAP, 1, at=time.time() + 3600)
        await r.zadd(k.scheduled, {m: 1})  # due now, for the dead mover below
        # The dead mover: its take (a short lease), its placement, and no removal.
        taken = await take_due_call(k, limit=10, lease_ms=300).run(r)
        [(msg_id, data)] = taken.entries
        await c.deliver(decode_envelope(data), quota=False)
        await wait_status(c, m, "succeeded", timeout=30)

        async def healed() -> bool:  # taken again after the lease, placed, removed
            return await r.zcard(k.scheduled) == 0

        await wait_until(healed, timeout_s=30, what="the leased entry taken again")

        async def inbox_empty() -> bool:  # the second copy was read and settled
            return sum([await r.xlen(s) for s in k.inboxes("sch-1")]) == 0

        await wait_until(inbox_empty, timeout_s=30, what="the second copy settled")
        assert msg_id == m and await ran(r, ns, m) == 1


SECRET = "team-secret-0123456789abcdef"


async def test_signed_by_its_sender_at_schedule_time_never_by_the_mover(
    redis_url: str, ns: str, r: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REACH_SECRET", raising=False)
    async with (
        serving(redis_url, ns, make(), secret=SECRET, require_signed=True),
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as signed,
        Client(redis_url=redis_url, namespace=ns) as unsigned,
    ):
        good = await signed.send(CAP, "signed", delay_s=0.5)
        # The runtime that moves it holds the secret too: it must not sign it.
        bad = await unsigned.send(CAP, "unsigned", delay_s=0.5)
        await wait_status(signed, good, "succeeded", timeout=30)

        async def letters() -> list[object]:
            return list(await r.xrange(Keys(ns).dlq(CAP)))

        [(_, letter)] = await wait_until(letters, timeout_s=30, what="the dead letter")
        assert await ran(r, ns, good) == 1 and await ran(r, ns, bad) == 0
        assert letter[b"reason"] == b"unauthenticated" and letter[b"msg_id"] == bad.encode()


@pytest.mark.cluster
async def test_scheduled_sends_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    """The record in its own slot, the scheduled set in the namespace's: scheduled, listed,
    cancelled, and run once when due, on the 3-master test cluster."""
    url = redis_cluster.url
    r = await connect(url)
    try:
        async with serving(url, ns, make()) as c:
            kept = await c.send(CAP, 1, delay_s=1.0, idempotency_key="c-1")
            gone = await c.send(CAP, 2, delay_s=0.5)
            assert (await c.task(kept)).status == "scheduled"
            assert {s.msg_id for s in await c.scheduled()} == {kept, gone}
            assert (await c.cancel(gone)).cancelled
            await wait_status(c, kept, "succeeded", timeout=30)
            assert await effects(r, ns, "work") == {"c-1": 1}  # the kept one's key, once
            assert await c.scheduled() == []
    finally:
        await r.aclose()


async def test_with_redis_away_scheduling_fails_at_once(fresh_redis: RedisServer, ns: str) -> None:
    """Not held in the outage buffer: the caller is told nothing was kept."""
    async with Client(redis_url=fresh_redis.url, namespace=ns) as c:
        fresh_redis.kill()
        with pytest.raises(RedisUnavailable):
            await c.send(CAP, 1, delay_s=60)
        assert c.pending_local() == []

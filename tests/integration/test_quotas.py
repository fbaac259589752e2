"""Per-tenant quotas (issue 13, item 7): a bound on every agent's inbox and a send rate per
caller identity, set per namespace, exact under 50 concurrent senders; over quota, the
send raises ``Overloaded`` naming the quota and nothing is written; a message accepted
once (a retry the sweeper places again) is never refused by them.

The agents here are registered but never read their inbox, so what the inboxes hold is
exactly what was accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from typing import Any

import anyio
import pytest

from reach import sweeper
from reach._autopipe import AutoPipeline
from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.envelope import encode
from reach.errors import Overloaded
from reach.keys import Keys
from reach.limits import parse_limit
from reach.quotas import SendBucket, clear_quotas, get_quotas, set_quotas
from reach.registry import Registry
from tests.support.agents_messaging import REPO, wait_eligible
from tests.support.cluster import RedisTestCluster
from tests.support.registry_helpers import register

pytestmark = pytest.mark.anyio

CAP = "test.quota"
SENDERS = 50


async def inbox_len(r: AnyRedis, ns: str, agent_id: str) -> int:
    return sum([await r.xlen(k) for k in Keys(ns).inboxes(agent_id)])


async def fire(clients: list[Client], n: int, **kw: Any) -> tuple[list[str], list[Overloaded]]:
    """``n`` concurrent sends spread over ``clients``, each started at once: the accepted
    msg_ids and the Overloaded errors (any other error fails the test)."""
    sent: list[str] = []
    refused: list[Overloaded] = []

    async def one(i: int) -> None:
        try:
            sent.append(await clients[i % len(clients)].send(CAP, {"i": i}, **kw))
        except Overloaded as e:
            refused.append(e)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return sent, refused


async def started(
    stack: contextlib.AsyncExitStack, redis_url: str, ns: str, n: int, **kw: Any
) -> list[Client]:
    clients = [
        await stack.enter_async_context(Client(redis_url=redis_url, namespace=ns, **kw))
        for _ in range(n)
    ]
    for c in clients:
        await wait_eligible(c, CAP, [])
    return clients


async def test_max_inbox_is_exact_under_50_concurrent_senders(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    limit = 20
    # the agent's own bound is looser: the namespace's quota is what refuses
    await register(Registry(r, ns), "q-1", [CAP], ready=True, max_queue=1000)
    await set_quotas(r, Keys(ns), max_inbox=limit)
    async with contextlib.AsyncExitStack() as stack:
        clients = await started(stack, redis_url, ns, 5)
        sent, refused = await fire(clients, SENDERS)
        assert len(sent) == limit and len(refused) == SENDERS - limit
        assert await inbox_len(r, ns, "q-1") == limit
        e = refused[0]
        assert e.limit == "max_inbox"
        assert f"holds {limit} messages" in str(e)
        assert f"reach quota set --max-inbox {limit}" in str(e) and "Back off" in str(e)
        # a refused message left no trace: only the accepted ones have a task record
        assert {(await clients[0].task(m)).status for m in sent} == {"pending"}
        # send_many meets the same bound (nothing more goes in)
        out = await clients[0].send_many(CAP, [1, 2, 3])
        assert all(isinstance(x, Overloaded) and x.limit == "max_inbox" for x in out)
        assert await inbox_len(r, ns, "q-1") == limit


async def test_the_lower_of_max_queue_and_max_inbox_applies(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    await register(Registry(r, ns), "q-small", [CAP], ready=True, max_queue=5)
    await set_quotas(r, Keys(ns), max_inbox=30)
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, CAP, ["q-small"])
        sent, refused = await fire([c], 12)
        assert len(sent) == 5 and len(refused) == 7
        # the agent's own bound refused: its message, not the quota's
        assert refused[0].limit == "max_queue" and "q-small 5/5" in str(refused[0])


async def test_send_rate_admits_exactly_the_burst_under_50_concurrent_senders(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    # One send a minute after a burst of 10: within the test's seconds the bucket does not
    # refill, so exactly 10 of the 50 concurrent sends fit, whatever their interleaving.
    await register(Registry(r, ns), "q-rate", [CAP], ready=True)
    await set_quotas(r, Keys(ns), send_rate=parse_limit("1/m", burst=10))
    async with contextlib.AsyncExitStack() as stack:
        # five clients (five connections) sending as one caller identity
        clients = await started(stack, redis_url, ns, 5, client_id="tenant-a")
        assert {c.identity for c in clients} == {"tenant-a"}
        sent, refused = await fire(clients, SENDERS)
        assert len(sent) == 10 and len(refused) == SENDERS - 10
        assert await inbox_len(r, ns, "q-rate") == 10
        e = refused[0]
        assert e.limit == "send_rate" and 0 < e.retry_after_s <= 60
        assert "caller 'tenant-a'" in str(e) and "reach quota set --send-rate 1/m" in str(e)
        # another identity has a bucket of its own
        async with Client(redis_url=redis_url, namespace=ns, client_id="tenant-b") as b:
            await wait_eligible(b, CAP, [])
            sent_b, refused_b = await fire([b], 12)
            assert len(sent_b) == 10 and len(refused_b) == 2
        # send_many takes its sends from the same bucket: all refused now
        out = await clients[0].send_many(CAP, [1, 2])
        assert all(isinstance(x, Overloaded) and x.limit == "send_rate" for x in out)


async def test_send_rate_holds_over_time_under_50_concurrent_senders(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    rate, burst = 40.0, 5
    await register(Registry(r, ns), "q-flow", [CAP], ready=True)
    await set_quotas(r, Keys(ns), send_rate=parse_limit(f"{rate:g}/s", burst=burst))
    accepted: list[str] = []
    refused: list[Overloaded] = []

    async def sender(c: Client, stop: float) -> None:
        while anyio.current_time() < stop:
            try:
                accepted.append(await c.send(CAP, 1))
            except Overloaded as e:
                refused.append(e)
                await anyio.sleep(min(e.retry_after_s, 0.05))

    async with contextlib.AsyncExitStack() as stack:
        clients = await started(stack, redis_url, ns, 5, client_id="tenant-flow")
        t0 = await server_us(r)
        stop = anyio.current_time() + 1.5
        async with anyio.create_task_group() as tg:
            for i in range(SENDERS):
                tg.start_soon(sender, clients[i % len(clients)], stop)
        t1 = await server_us(r)
    # Every accepted send took its place in the bucket between t0 and t1 (server time):
    # GCRA lets through at most rate * elapsed + burst of them.
    elapsed_s = (t1 - t0) / 1e6
    assert len(accepted) <= rate * elapsed_s + burst
    assert len(accepted) > burst  # the bucket refilled: the senders were not all refused
    assert refused and all(e.limit == "send_rate" for e in refused)
    assert await inbox_len(r, ns, "q-flow") == len(accepted)


async def test_concurrent_takes_of_one_turn_are_one_script_call(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    commands = AutoPipeline(await connect(redis_url))
    try:
        bucket = SendBucket(commands, Keys(ns), "tenant-t")
        rate = parse_limit("1/m", burst=20)
        await bucket.take(rate)  # loads the script
        before = await script_calls(r)
        taken = await asyncio.gather(*(bucket.take(rate) for _ in range(SENDERS)))
        # the first alone, the other 49 together; granted in the order they asked
        assert await script_calls(r) - before == 2
        assert [t.granted for t in taken] == [1] * 19 + [0] * (SENDERS - 19)
        assert all(t.wait_us > 0 for t in taken[19:])
    finally:
        await commands.aclose()


async def script_calls(r: AnyRedis) -> int:
    stats = await r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def server_us(r: AnyRedis) -> int:
    s, us = await r.time()
    return int(s) * 1_000_000 + int(us)


def start_senders(cmd: list[str], n: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]


async def test_both_quotas_hold_across_5_processes_of_10_senders(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    # Five processes, one identity, ten sends each, released together: the bucket grants
    # exactly its burst (30; it does not refill in the seconds this takes) and the inbox
    # takes exactly its quota (20) of those; the others are refused, each by its quota.
    keys = Keys(ns)
    await register(Registry(r, ns), "q-procs", [CAP], ready=True)
    await set_quotas(r, keys, max_inbox=20, send_rate=parse_limit("1/m", burst=30))
    ready, go = keys.effects("quota-ready"), keys.effects("quota-go")
    cmd = [sys.executable, "-m", "tests.support.quota_sender", redis_url, ns, "tenant-p", CAP]
    procs = start_senders([*cmd, "10", ready, go], 5)
    try:
        with anyio.fail_after(60):
            while await r.llen(ready) < len(procs):
                assert all(p.poll() is None for p in procs), "a sender process ended early"
                await anyio.sleep(0.05)
        await r.rpush(go, *["go"] * len(procs))
        outs = []
        for p in procs:
            out, _ = await anyio.to_thread.run_sync(lambda p=p: p.communicate(timeout=60))
            assert p.returncode == 0
            outs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    total: dict[str, int] = {}
    for o in outs:
        for k, v in o.items():
            total[k] = total.get(k, 0) + v
    assert total == {"sent": 20, "max_inbox": 10, "send_rate": 20}, total
    assert await inbox_len(r, ns, "q-procs") == 20


async def test_a_retry_of_an_accepted_message_is_not_refused(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    keys = Keys(ns)
    await register(Registry(r, ns), "q-retry", [CAP], ready=True)
    await set_quotas(r, keys, max_inbox=3, send_rate=parse_limit("1/m", burst=3))
    async with Client(redis_url=redis_url, namespace=ns, client_id="tenant-r") as c:
        await wait_eligible(c, CAP, ["q-retry"])
        sent, refused = await fire([c], 5)
        assert len(sent) == 3 and len(refused) == 2
        # a retry waiting in the delayed set: the inbox is at its quota and the caller's
        # rate is spent, yet the sweeper places it (it was accepted once)
        env = c.build(CAP, "again")
        env.attempt = 2
        await r.zadd(keys.delayed, {encode(env): 0})
        moved = await sweeper.move_due(r, keys, c)
        assert moved.retried == 1
        assert await inbox_len(r, ns, "q-retry") == 4
        assert await r.zcard(keys.delayed) == 0
        with pytest.raises(Overloaded):
            await c.send(CAP, "new")


async def test_clients_apply_a_changed_quota_within_the_refresh(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    keys = Keys(ns)
    await register(Registry(r, ns), "q-change", [CAP], ready=True)
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, CAP, ["q-change"])
        await c.send(CAP, 1)  # no quota
        await set_quotas(r, keys, max_inbox=1)
        assert (await get_quotas(r, keys)).max_inbox == 1

        async def refused() -> bool:
            try:
                await c.send(CAP, 2)
            except Overloaded:
                return True
            return False

        with anyio.fail_after(10):
            while not await refused():
                await anyio.sleep(0.1)
        await clear_quotas(r, keys)
        with anyio.fail_after(10):
            while await refused():
                await anyio.sleep(0.1)


async def test_garbage_in_the_quotas_hash_is_no_quota(redis_url: str, ns: str, r: AnyRedis) -> None:
    keys = Keys(ns)
    await r.hset(keys.quotas, mapping={"max_inbox": "lots", "send_rate": "\xff fast"})
    assert not (await get_quotas(r, keys)).any
    await register(Registry(r, ns), "q-junk", [CAP], ready=True)
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, CAP, ["q-junk"])
        sent, refused = await fire([c], 10)
        assert len(sent) == 10 and not refused


async def test_quotas_hold_on_a_cluster(redis_cluster: RedisTestCluster) -> None:
    ns = "tq" + uuid.uuid4().hex[:8]
    rc = await connect(redis_cluster.url)
    try:
        keys = Keys(ns)
        await register(Registry(rc, ns), "q-c1", [CAP], ready=True)
        await set_quotas(rc, keys, max_inbox=15)
        async with Client(redis_url=redis_cluster.url, namespace=ns, client_id="t-c") as c:
            await wait_eligible(c, CAP, ["q-c1"])
            sent, refused = await fire([c], SENDERS)
            assert len(sent) == 15 and len(refused) == SENDERS - 15
            assert sum([await rc.xlen(k) for k in keys.inboxes("q-c1")]) == 15
            await clear_quotas(rc, keys, max_inbox=True, send_rate=False)
            await set_quotas(rc, keys, send_rate=parse_limit("1/m", burst=4))
            c._delivery.quota_cache.invalidate()
            await rc.delete(*keys.inboxes("q-c1"))
            sent, refused = await fire([c], SENDERS)
            assert len(sent) == 4 and {e.limit for e in refused} == {"send_rate"}
    finally:
        await rc.aclose()


async def test_the_quota_message_names_every_full_agent(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    for a in ("q-m1", "q-m2"):
        await register(Registry(r, ns), a, [CAP], ready=True)
    await set_quotas(r, Keys(ns), max_inbox=3)
    async with Client(redis_url=redis_url, namespace=ns) as c:
        await wait_eligible(c, CAP, ["q-m1", "q-m2"])
        sent, refused = await fire([c], 10)
        # a full agent passes the message on: both inboxes fill before any refusal
        assert len(sent) == 6 and len(refused) == 4
        assert await inbox_len(r, ns, "q-m1") == 3 and await inbox_len(r, ns, "q-m2") == 3
        msg = str(refused[-1])
        assert "the inboxes of agents" in msg and "hold up to 3 messages" in msg
        assert "q-m1" in msg and "q-m2" in msg
        with pytest.raises(Overloaded, match="the inbox of agent q-m1 holds 3 messages"):
            await c.send(CAP, 1, target="q-m1")

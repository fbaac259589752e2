"""Claiming at send (issue 11): a message sent alone on standalone Redis is claimed by
send.lua for the runtime it is routed to; that runtime starts the handler without a claim
round trip and then marks the task running (start.lua). Anything else about the entry
(another instance named, a lease run out, garbled fields, a key already running) takes the
claim.lua path, so each message still runs once."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
import redis

from reach import Agent, Client, Context, Hooks
from reach.connection import AnyRedis
from reach.envelope import Envelope, encode, encode_payload
from reach.keys import Keys
from reach.registry import Registry
from reach.scripts import inbox
from reach.scripts.delivery import ClaimItem, claim_call
from tests.support.agents_messaging import Gate, bump, effects, serving, wait_status
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

AGENT = "cas-1"
CAP = "cas.work"


class RoundTrips(Hooks):
    def __init__(self) -> None:
        self.ops: list[str] = []

    def on_round_trip(self, op: str) -> None:
        self.ops.append(op)


def agent(gate: Gate, trips: RoundTrips) -> Agent:
    app = Agent(AGENT, capabilities=[CAP], hooks=[trips])

    @app.handler(CAP)
    async def work(payload: Any, ctx: Context) -> Any:
        if payload == "hold":
            await gate.hold()
        await bump(ctx, "cas")
        return payload

    return app


async def owner_of(client: Client) -> str:
    [info] = await client.eligible(CAP)
    return f"{info.agent_id}/{info.instance_id}"


async def test_a_lone_request_runs_without_a_claim_round_trip(redis_url: str, ns: str) -> None:
    gate, trips = Gate(), RoundTrips()
    async with serving(redis_url, ns, agent(gate, trips)) as client:
        assert await client.request(CAP, "hi", timeout_s=20) == "hi"
        assert "claim" not in trips.ops
        rec = await client.redis.hgetall(await _only_record(client, ns))
        assert rec[b"status"] == b"succeeded" and rec[b"fence"] == b"1" and rec[b"runs"] == b"1"

        # While the handler runs, its task shows 'running' (start.lua), with the
        # runtime's lease; then 'succeeded'.
        msg_id = await client.send(CAP, "hold")
        await gate.entered.wait()
        st = await wait_status(client, msg_id, "running")
        assert st.status == "running"
        gate.open()
        await wait_status(client, msg_id, "succeeded")
        assert "claim" not in trips.ops
        assert set((await effects(client.redis, ns, "cas")).values()) == {1}


async def _only_record(client: Client, ns: str) -> bytes:
    # The one idempotency record written so far: the request's.
    keys = [k async for k in client.redis.scan_iter(match=Keys(ns).idem("*"))]
    assert len(keys) == 1
    key: bytes = keys[0]
    return key


async def entry_for(r: AnyRedis, ns: str, client: Client, payload: str, **fields: Any) -> str:
    """Write an inbox entry of a real message straight into the agent's inbox, with extra
    ``fields`` (a claim marker as given, well formed or not), its record as send.lua's
    claim at send wrote it when ``claimed_for`` is given. Returns its msg_id."""
    env = client.build(CAP, payload)
    claimed_for = fields.pop("claimed_for", "")
    m = inbox.Message.of(env, encode(env))
    k = Keys(ns)
    if claimed_for:
        await inbox.send_call(
            k, m, agent_id=AGENT, priority="normal", ttl_ms=60_000, claim_for=claimed_for,
            claim_lease_ms=fields.pop("lease_ms", 60_000),
        ).run(r)  # fmt: skip
    else:
        await r.xadd(k.inbox(AGENT, "normal"), {"e": m.data, **fields})
    return env.msg_id


async def test_other_claims_take_the_claim_path_and_run_once(redis_url: str, ns: str) -> None:
    gate, trips = Gate(), RoundTrips()
    async with serving(redis_url, ns, agent(gate, trips)) as client:
        r = client.redis
        mine = await owner_of(client)
        sent = [
            # Claimed at send for an instance of the agent that is gone (a restart): the
            # runtime takes it over from that owner.
            await entry_for(r, ns, client, "a", claimed_for=f"{AGENT}/gone-instance"),
            # Claimed for this runtime, but the lease ran out before it was read.
            await entry_for(r, ns, client, "b", claimed_for=mine, lease_ms=1),
            # Garbled markers, written behind the scripts' back (no claim in the record).
            await entry_for(r, ns, client, "c", c=mine, l="soon"),
            await entry_for(r, ns, client, "d", c=mine, l="9" * 17),
            await entry_for(r, ns, client, "e", c=mine),
            await entry_for(r, ns, client, "f", c="someone/else", l="99999999999999"),
            await entry_for(r, ns, client, "g", l="99999999999999"),
        ]
        for msg_id in sent:
            await wait_status(client, msg_id, "succeeded")
        assert trips.ops.count("claim") >= 1
        done = await effects(r, ns, "cas")
        assert len(done) == len(sent) and set(done.values()) == {1}
        # The one claimed for another instance was taken over: fence 2, run once here.
        rec = await r.hgetall(Keys(ns).idem(sent[0]))
        assert rec[b"fence"] == b"2" and rec[b"runs"] == b"1"  # never run by the gone one
        # Still serving, on the fast path.
        trips.ops.clear()
        assert await client.request(CAP, "after", timeout_s=20) == "after"
        assert "claim" not in trips.ops


async def test_many_concurrent_sends_each_run_once(redis_url: str, ns: str) -> None:
    # Concurrent sends: the first of each loop turn is claimed at send, the rest go in a
    # batch call and are claimed by the worker. Either way: once each.
    gate, trips = Gate(), RoundTrips()
    async with serving(redis_url, ns, agent(gate, trips)) as client:

        async def ask(i: int) -> None:
            assert await client.request(CAP, i, timeout_s=30) == i

        async with anyio.create_task_group() as tg:
            for i in range(300):
                tg.start_soon(ask, i)

        async def all_done() -> bool:
            return len(await effects(client.redis, ns, "cas")) >= 300

        await wait_until(all_done, what="300 messages handled")
        assert set((await effects(client.redis, ns, "cas")).values()) == {1}


async def test_a_copied_entry_of_a_running_key_does_not_run_twice(redis_url: str, ns: str) -> None:
    # Entries are untrusted: a second entry of a key carrying the same claim marker (a copy
    # written straight into the inbox) while the first runs, in the same read or a later
    # one, must wait as a duplicate does, not start the handler again.
    gate, trips = Gate(), RoundTrips()
    async with serving(redis_url, ns, agent(gate, trips)) as client:
        r, k = client.redis, Keys(ns)
        # The claimed entry is made in a scratch inbox, then it and its copy go into the
        # agent's inbox in one transaction: one read gets both.
        env = client.build(CAP, "hold")
        await inbox.send_call(
            k, inbox.Message.of(env, encode(env)), agent_id="scratch", priority="normal",
            ttl_ms=60_000, claim_for=await owner_of(client), claim_lease_ms=60_000,
        ).run(r)  # fmt: skip
        [(_, fields)] = await r.xrange(k.inbox("scratch", "normal"))
        assert b"c" in fields
        async with r.pipeline(transaction=True) as tx:
            tx.xadd(k.inbox(AGENT, "normal"), fields)
            tx.xadd(k.inbox(AGENT, "normal"), fields)
            await tx.execute()
        msg_id = env.msg_id
        await gate.entered.wait()
        gate.open()
        await wait_status(client, msg_id, "succeeded")

        async def both_settled() -> bool:
            return await r.xlen(Keys(ns).inbox(AGENT, "normal")) == 0

        await wait_until(both_settled, what="both entries settled")
        assert await effects(r, ns, "cas") == {msg_id: 1}


class Stall(Hooks):
    """Stands for this process stopped (SIGSTOP) or starved between reading an entry
    claimed at send for it and starting its handler: meanwhile it is evicted, a live peer
    takes the key over, and the agent's heartbeat finds its registration lost and
    registers again, all before the event loop goes on."""

    def __init__(self, url: str, keys: Keys, peer: str) -> None:
        self.url, self.keys, self.peer = url, keys, peer
        self.owner = ""
        self.stalled = False

    def on_delivered(self, env: Envelope) -> None:
        if bytes(env.payload) != bytes(encode_payload("stall")) or self.stalled:
            return
        self.stalled = True
        r = redis.Redis.from_url(self.url)
        try:
            call = claim_call(
                [ClaimItem(self.keys.idem(env.key), 60_000, env.msg_id, takeover_from=self.owner)],
                owner=self.peer,
                ttl_ms=86_400_000,
                agent_id=self.peer.split("/")[0],
            )
            [taken] = call.run_sync(r)
            assert taken.fence == 2, taken  # the peer holds it now
            record = self.keys.agent(self.owner.split("/")[0])
            r.hset(record, "state", "evicted")  # as the sweeper marks an agent it evicts
            deadline = time.monotonic() + 20
            # The event loop stays blocked (as a stopped process's) until the heartbeat
            # thread, which renews the lease on its own connection meanwhile, has found
            # the registration lost and registered again.
            while r.hget(record, "state") != b"active":
                assert time.monotonic() < deadline, "the agent never registered again"
                time.sleep(0.02)
        finally:
            r.close()


async def test_an_entry_read_before_the_agent_was_evicted_is_claimed_again(
    redis_url: str, ns: str
) -> None:
    """A claim this runtime holds is trusted without a round trip only while it cannot
    have been taken over: an entry read before the agent found its registration lost
    (evicted) takes the claim path and finds the live peer that took the key over in the
    meantime, so the handler does not run it beside that peer (a chaos run saw a
    SIGSTOPped worker, resumed, run such a message a second time)."""
    gate, trips = Gate(), RoundTrips()
    app = agent(gate, trips)
    keys = Keys(ns)
    stall = Stall(redis_url, keys, "peer-1/p1")
    app.add_hooks(stall)
    async with serving(redis_url, ns, app) as client:
        stall.owner = await owner_of(client)
        reg = Registry(client.redis, ns)
        await register(reg, "peer-1", ["other.cap"], instance_id="p1")  # the peer is alive
        await client.send(CAP, "stall", idempotency_key="k-stall")

        async def stalled() -> bool:
            return stall.stalled

        await wait_until(stalled, what="the entry read and the stall over")
        assert await client.request(CAP, "after", timeout_s=20) == "after"  # the agent serves on
        await anyio.sleep(1.0)  # time for a wrongly started run to show
        assert "claim" in trips.ops  # the stale entry took the claim path
        counts = await effects(client.redis, ns, "cas")
        assert "k-stall" not in counts, counts  # the peer holds it: not run here

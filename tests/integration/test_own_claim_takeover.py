"""Taking a key over from this runtime's own claim (Execution._busy): a copy that finds
its key claimed by this very runtime while nothing here runs it takes the key up again,
and two such copies judged at once run it once. A chaos run (a worker SIGSTOPped past its
eviction, then continued, finding its held copies stale) ran one key twice side by side
in one process, with fences 3 and 4: both copies read this runtime as the owner before
either takeover came back, and the second took the key over from the first's fresh
claim."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from reach import Agent, Context
from reach._worker.items import Delivery
from reach.envelope import Envelope, encode, encode_payload, new_id
from reach.keys import Keys
from reach.outcomes import Settled
from tests.support.agents_messaging import bump, effects, serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

AGENT = "own-1"
CAP = "own.work"
KEY = "k-own"


def agent() -> Agent:
    app = Agent(AGENT, capabilities=[CAP])

    @app.handler(CAP)
    async def work(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "own")
        await anyio.sleep(0.2)  # long enough for a second run to overlap it
        return payload

    return app


def copy(keys: Keys) -> Delivery:
    env = Envelope(
        msg_id=new_id(), capability=CAP, payload=encode_payload("x"), idempotency_key=KEY
    )
    data = encode(env)
    # Its entry is not in the inbox (the copy is handed to the runtime directly): the
    # settle's ack of this id acks nothing.
    return Delivery(stream=keys.inbox(AGENT, "normal"), entry_id=b"1-1", env=env, raw=data)


async def test_two_copies_of_a_key_claimed_by_this_runtime_run_it_once(
    redis_url: str, ns: str
) -> None:
    app = agent()
    keys = Keys(ns)
    async with serving(redis_url, ns, app) as client:
        rt = app._runtime
        assert rt is not None
        execution = rt.consumer.execution
        a, b = copy(keys), copy(keys)
        record = keys.idem(a.key)
        # This runtime's claim, its lease alive, and nothing here running the key (as
        # after a claim whose handler never started: the copies found it stale).
        await client.redis.hset(
            record,
            mapping={
                "status": "running",
                "owner": execution.owner,
                "lease_until": 2**52,
                "fence": 5,
                "runs": 1,
                "capability": CAP,
            },
        )
        assert a.key not in rt.state.running
        await asyncio.gather(execution._busy(a), execution._busy(b))

        async def settled() -> bool:
            return await client.redis.hget(record, "status") == b"succeeded"

        await wait_until(settled, what="the key's run settled")
        await anyio.sleep(0.5)  # time for a second run to show
        assert await effects(client.redis, ns, "own") == {KEY: 1}
        assert await client.redis.hget(record, "fence") == b"6"  # one takeover, not two
        assert Settled.PARKED in (a.outcome, b.outcome)  # the other copy waits

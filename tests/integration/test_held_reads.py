"""reach._blocking.HeldReads on a real Redis: a blocking read that outlives its time limit
gives nothing (None) and leaves no reply behind for the next call to take as its own."""

from __future__ import annotations

import time
import uuid

import pytest
import redis.asyncio as aredis

from reach._blocking import HeldReads, stream_reply


@pytest.mark.anyio
async def test_a_read_past_its_limit_returns_none_and_the_next_call_gets_its_own_reply(
    redis_url: str,
) -> None:
    r = aredis.Redis.from_url(redis_url)
    held = HeldReads(r)
    quiet, other = (f"held-{uuid.uuid4().hex[:8]}-{k}" for k in ("quiet", "other"))
    try:
        t0 = time.monotonic()
        # Redis answers this read only after 1.5 s (nil: nothing comes to `quiet`), past
        # the 0.2 s limit
        got = await held.call("XREAD", "BLOCK", 1500, "STREAMS", quiet, "$", timeout_s=0.2)
        assert got is None
        assert time.monotonic() - t0 < 1.0  # the limit ended it, not Redis's block
        # The late nil must not be read as the next call's reply: the entry is its own.
        await r.xadd(other, {"f": "v"})
        got = await held.call("XREAD", "COUNT", 1, "STREAMS", other, "0", timeout_s=5)
        assert got, "the reply of the timed-out read was taken for this call's"
        [(_, [(_, fields)])] = stream_reply(got)
        assert fields in ({b"f": b"v"}, {"f": "v"})
    finally:
        await held.aclose()
        await r.aclose()


@pytest.mark.anyio
async def test_a_read_within_its_limit_keeps_the_connection(redis_url: str) -> None:
    r = aredis.Redis.from_url(redis_url)
    held = HeldReads(r)
    try:
        assert await held.call("PING", timeout_s=5) in (b"PONG", "PONG", True)
        first = held._conn
        assert await held.call("PING", timeout_s=5) in (b"PONG", "PONG", True)
        assert held._conn is first  # held between calls, not taken anew
    finally:
        await held.aclose()
        await r.aclose()

"""claim.lua: one runtime at a time runs a key; a finished key is answered from its record."""

from __future__ import annotations

import pytest

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys

pytestmark = pytest.mark.anyio

OWNER_A, OWNER_B = "w-1/i1", "w-2/i2"
TTL_MS = 60_000


def _args(owner: str, *items: tuple[int, str]) -> list[object]:
    args: list[object] = [owner, TTL_MS, owner.split("/")[0]]
    for lease_ms, msg_id in items:
        args += [lease_ms, msg_id]
    return args


async def test_first_claim_gets_fence_one_and_marks_running(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k1")
    assert await scripts.call(r, "claim", [rec], _args(OWNER_A, (5_000, "m1"))) == [[1, 1]]
    h = await r.hgetall(rec)
    assert h[b"owner"] == OWNER_A.encode() and h[b"status"] == b"running"
    assert h[b"msg_id"] == b"m1" and h[b"agent_id"] == b"w-1" and h[b"runs"] == b"1"
    assert 0 < await r.pttl(rec) <= TTL_MS


async def test_a_held_claim_turns_away_other_copies(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k2")
    await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1")))
    # A second copy, from another runtime or from this one, must not run while the lease holds.
    for owner in (OWNER_B, OWNER_A):
        got = await scripts.call(r, "claim", [rec], _args(owner, (60_000, "m1")))
        assert got == [[3, OWNER_A.encode()]]
    assert await r.hget(rec, "runs") == b"1"


async def test_an_expired_lease_is_claimed_again_with_a_higher_fence(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k3")
    await scripts.call(r, "claim", [rec], _args(OWNER_A, (60_000, "m1")))
    await r.hset(rec, "lease_until", 0)  # as if the lease ran out (or takeover.lua ended it)
    got = await scripts.call(r, "claim", [rec], _args(OWNER_B, (60_000, "m1")))
    assert got == [[1, 2]]
    assert await r.hget(rec, "owner") == OWNER_B.encode()
    assert await r.hget(rec, "runs") == b"2"


async def test_a_done_key_replays_its_stored_reply(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k4")
    await r.hset(rec, mapping={"done": "1", "reply": b"\x81\xa1r\x01", "fence": 3})
    got = await scripts.call(r, "claim", [rec], _args(OWNER_B, (60_000, "m9")))
    assert got == [[2, b"\x81\xa1r\x01"]]
    assert await r.hget(rec, "fence") == b"3"  # nothing was claimed


async def test_a_batch_answers_each_key_in_order(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    fresh, held, done = k.idem("b1"), k.idem("b2"), k.idem("b3")
    await scripts.call(r, "claim", [held], _args(OWNER_B, (60_000, "x")))
    await r.hset(done, mapping={"done": "1", "reply": b"R"})
    got = await scripts.call(
        r, "claim", [fresh, held, done], _args(OWNER_A, (1_000, "m1"), (1_000, "m2"), (1_000, "m3"))
    )
    assert got == [[1, 1], [3, OWNER_B.encode()], [2, b"R"]]
    # Each key's own lease and msg_id were written, not its neighbour's.
    assert await r.hget(fresh, "msg_id") == b"m1"
    assert await r.hget(held, "msg_id") == b"x"

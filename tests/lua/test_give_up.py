"""give_up.lua: a message no handler will run is marked expired or dead in its record, in
one step with the check that its key has not completed (a completed key keeps its status
and hands back its stored reply)."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.lua.announced import listening
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


async def _server_ms(r: AnyRedis) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


async def test_an_absent_record_is_created_with_the_status(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("k1")
    before = await _server_ms(r)
    got = await scripts.call(r, "give_up", [rec], ["expired", "deadline passed", TTL_MS])
    assert got is None
    h = await r.hgetall(rec)
    assert h[b"status"] == b"expired" and h[b"error"] == b"deadline passed"
    assert before <= int(h[b"updated_ms"]) <= await _server_ms(r)
    assert 0 < await r.pttl(rec) <= TTL_MS


async def test_a_record_not_completed_gets_the_status_and_keeps_the_rest(
    r: AnyRedis, ns: str
) -> None:
    rec = Keys(ns).idem("k2")
    await r.hset(rec, mapping={"status": "retrying", "capability": "c.x", "attempt": 2})
    assert await scripts.call(r, "give_up", [rec], ["dead", "", 1_000]) is None
    h = await r.hgetall(rec)
    assert (h[b"status"], h[b"error"], h[b"capability"], h[b"attempt"]) == (
        b"dead",
        b"",
        b"c.x",
        b"2",
    )
    assert 0 < await r.pttl(rec) <= 1_000


async def test_a_completed_key_keeps_its_status_and_hands_back_its_reply(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    done, bare = k.idem("done"), k.idem("bare")
    [[code, fence]] = await scripts.call(
        r, "claim", [done], ["w-1/i1", TTL_MS, "w", 3, 60_000, "m", ""]
    )
    assert code == 1
    args = [TTL_MS, fence, "succeeded", b"\x91\x01", "done", ""]
    assert await scripts.call(r, "complete", [done], args) == [1]
    await r.hset(bare, mapping={"done": "1", "status": "succeeded"})  # no reply stored
    before = await snapshot(r, ns)
    # The stored reply and the record's status, agent_id and msg_id it is rebuilt from.
    assert await scripts.call(r, "give_up", [done], ["expired", "late", TTL_MS]) == [
        b"\x91\x01",
        b"succeeded",
        b"w",
        b"m",
    ]
    assert await scripts.call(r, "give_up", [bare], ["dead", "x", TTL_MS]) == [
        b"",
        b"succeeded",
        b"",
        b"",
    ]
    assert_unchanged(before, await snapshot(r, ns))


# Numbers the sweeper never sends: not plain digits, not finite, or out of range.
BAD_INTS = ["", "abc", "nan", "inf", "1e309", "1e3", "-5", "0", "1.5", " 5", "007", str(10**16)]


def _bad_calls() -> list[tuple[str, list[object]]]:
    ok: list[object] = ["expired", "why", TTL_MS]
    calls = [("ttl_ms", [*ok[:2], v]) for v in BAD_INTS]
    calls += [("status", [v, *ok[1:]]) for v in ["", "succeeded", "running", "EXPIRED", "dead "]]
    calls += [("arguments", ok[:2]), ("arguments", [*ok, ""])]
    return calls


@pytest.mark.parametrize(("what", "args"), _bad_calls())
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, what: str, args: list[object]
) -> None:
    rec = Keys(ns).idem("a")
    await r.hset(rec, "status", "pending")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: bad {what}"):
        await scripts.call(r, "give_up", [rec], args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_call_without_exactly_one_key_is_refused(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    before = await snapshot(r, ns)
    for keys in ([], [k.idem("a"), k.idem("b")]):
        with pytest.raises(rexc.ResponseError, match=r"^reach: bad arguments: want 1 KEYS"):
            await scripts.call(r, "give_up", keys, ["expired", "", TTL_MS])
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_key_that_is_not_a_hash_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("w")
    await r.rpush(rec, "x")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=r"^reach: bad KEYS\[1\]: holds a list"):
        await scripts.call(r, "give_up", [rec], ["dead", "", TTL_MS])
    assert_unchanged(before, await snapshot(r, ns))


async def test_giving_up_is_announced_a_completed_key_not(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    k = Keys(ns)
    rec, done = k.idem("k-announced"), k.idem("k-done")
    await r.hset(done, mapping={"done": "1", "status": "succeeded", "watched": 1})
    await r.hset(rec, "watched", 1)
    async with listening(redis_url, rec) as heard, listening(redis_url, done) as heard_done:
        assert await scripts.call(r, "give_up", [rec], ["expired", "late", TTL_MS]) is None
        assert await scripts.call(r, "give_up", [done], ["dead", "", TTL_MS]) is not None
        assert await heard() == [b"expired"]
        assert await heard_done() == []

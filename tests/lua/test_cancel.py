"""cancel.lua: a message not finished is marked cancelled and its runner fenced out, in one
step with the check that it has not finished; claim.lua then answers CANCELLED, a
completion of the fenced run is refused, and send.lua / mark_pending.lua keep a copy of
the cancelled msg_id cancelled."""

from __future__ import annotations

import time

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts import CancelCode, ClaimCode, SettleCode
from tests.lua.announced import listening
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

TTL_MS = 60_000
OWNER = "w-1/i1"


async def _cancel(r: AnyRedis, rec: str, msg_id: str, notices: str | None = None) -> list[object]:
    keys = [rec] if notices is None else [rec, notices]
    got: list[object] = await scripts.call(r, "cancel", keys, [msg_id, "by me", TTL_MS, 100])
    return got


async def _claim(r: AnyRedis, rec: str, msg_id: str = "m") -> list[object]:
    [answer] = await scripts.call(r, "claim", [rec], [OWNER, TTL_MS, "w-1", 3, 60_000, msg_id, ""])
    return list(answer)


@pytest.mark.parametrize("status", ["scheduled", "pending", "retrying"])
async def test_a_queued_message_is_cancelled_and_never_claimed(
    r: AnyRedis, ns: str, status: str
) -> None:
    k = Keys(ns)
    rec = k.idem("q")
    await r.hset(rec, mapping={"status": status, "capability": "c.x"})
    assert await _cancel(r, rec, "m", k.cancels) == [CancelCode.CANCELLED, status.encode()]
    h = await r.hgetall(rec)
    assert (h[b"status"], h[b"error"], h[b"cancel_of"]) == (b"cancelled", b"by me", b"m")
    assert b"fence" not in h  # nobody held a claim: nothing to fence
    assert 0 < await r.pttl(rec) <= TTL_MS
    [(_, fields)] = await r.xrange(k.cancels)
    assert fields == {b"m": b"m", b"k": rec.encode()}
    assert await _claim(r, rec) == [ClaimCode.CANCELLED, b""]
    assert (await r.hget(rec, "status")) == b"cancelled"  # the refused claim wrote nothing


async def test_a_running_message_is_fenced_out(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    rec = k.idem("run")
    code, fence = await _claim(r, rec)
    assert code == ClaimCode.RUN
    assert await _cancel(r, rec, "m", k.cancels) == [CancelCode.CANCELLED, b"running"]
    assert await r.hget(rec, "fence") == str(int(str(fence)) + 1).encode()
    # The run's completion is refused (its entry stays pending; the next claim settles it).
    args = [TTL_MS, fence, "succeeded", b"R", "done", ""]
    assert await scripts.call(r, "complete", [rec], args) == [SettleCode.FENCED]
    assert (await r.hget(rec, "status")) == b"cancelled"
    # Even a takeover from its owner cannot run it again.
    got = await scripts.call(r, "claim", [rec], [OWNER, TTL_MS, "w-1", 3, 60_000, "m", OWNER])
    assert [list(a) for a in got] == [[ClaimCode.CANCELLED, b""]]


async def test_a_claim_made_at_send_is_fenced_and_not_started(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, ptr = k.inbox("w-1", "normal"), k.idem("cs"), k.task("cs")
    args = [b"ENV", "cap", 1, "cs", "", TTL_MS, 0, OWNER, 60_000]
    await scripts.call(r, "send", [inbox, rec, ptr], args)
    assert (await r.hget(rec, "fence")) == b"1"
    assert await _cancel(r, rec, "cs") == [CancelCode.CANCELLED, b"pending"]
    assert (await r.hget(rec, "fence")) == b"2"
    # start.lua no longer confirms the claim, and its fenced completion is refused.
    assert await scripts.call(r, "start", [rec], [OWNER, TTL_MS, 60_000, 1]) == [0]
    args = [TTL_MS, 1, "succeeded", b"R", "done", ""]
    assert await scripts.call(r, "complete", [rec], args) == [SettleCode.FENCED]
    assert (await r.hget(rec, "status")) == b"cancelled"


async def test_a_finished_message_cannot_be_cancelled(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    done, dead, odd = k.idem("done"), k.idem("dead"), k.idem("odd")
    _, fence = await _claim(r, done)
    args = [TTL_MS, fence, "succeeded", b"R", "done", ""]
    assert await scripts.call(r, "complete", [done], args) == [SettleCode.SETTLED]
    await r.hset(dead, mapping={"status": "dead", "error": "boom"})
    await r.hset(odd, mapping={"status": "weird"})  # a status the scripts never write
    before = await snapshot(r, ns)
    assert await _cancel(r, done, "m", k.cancels) == [CancelCode.DONE, b"succeeded"]
    assert await _cancel(r, dead, "m", k.cancels) == [CancelCode.DONE, b"dead"]
    assert await _cancel(r, odd, "m", k.cancels) == [CancelCode.DONE, b"weird"]
    assert_unchanged(before, await snapshot(r, ns))  # no write, no notice


async def test_a_second_cancel_and_an_absent_record_change_nothing(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    rec = k.idem("twice")
    await r.hset(rec, "status", "pending")
    assert (await _cancel(r, rec, "m", k.cancels))[0] == CancelCode.CANCELLED
    before = await snapshot(r, ns)
    assert await _cancel(r, rec, "m", k.cancels) == [
        CancelCode.ALREADY_CANCELLED,
        b"cancelled",
    ]
    assert await _cancel(r, k.idem("never"), "m", k.cancels) == [CancelCode.UNKNOWN, b""]
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_fence_that_is_no_number_restarts_above_any_handed_out(
    r: AnyRedis, ns: str
) -> None:
    rec = Keys(ns).idem("junk")
    await r.hset(rec, mapping={"status": "running", "fence": "x1"})
    before_ms = int(time.time() * 1000) - 60_000  # the server's clock, give or take
    await _cancel(r, rec, "m")
    assert int(await r.hget(rec, "fence") or 0) > before_ms


async def test_a_copy_of_the_cancelled_msg_id_stays_cancelled_a_new_one_runs(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    inbox, rec, ptr = k.inbox("w-1", "normal"), k.idem("key"), k.task("m1")
    await scripts.call(r, "send", [inbox, rec, ptr], [b"ENV", "cap", 1, "m1", "key", TTL_MS])
    await _cancel(r, rec, "m1")
    # A retry or a moved entry of m1 (send.lua, or mark_pending.lua on a Cluster).
    await scripts.call(r, "send", [inbox, rec, ptr], [b"ENV", "cap", 2, "m1", "key", TTL_MS])
    assert (await r.hget(rec, "status")) == b"cancelled"
    assert await scripts.call(r, "mark_pending", [rec], ["cap", 2, "m1", TTL_MS]) == 0
    assert (await r.hget(rec, "status")) == b"cancelled"
    assert await _claim(r, rec, "m1") == [ClaimCode.CANCELLED, b""]
    # A new message under the same key runs.
    ptr2 = k.task("m2")
    await scripts.call(r, "send", [inbox, rec, ptr2], [b"ENV", "cap", 1, "m2", "key", TTL_MS])
    assert (await r.hget(rec, "status")) == b"pending"
    assert (await _claim(r, rec, "m2"))[0] == ClaimCode.RUN


BAD_INTS = ["", "abc", "nan", "inf", "1e3", "-5", "0", "1.5", " 5", "007", str(10**16)]


def _bad_calls() -> list[tuple[str, list[object]]]:
    ok: list[object] = ["m", "why", TTL_MS, 100]
    calls = [("ttl_ms", [*ok[:2], v, ok[3]]) for v in BAD_INTS]
    calls += [("maxlen", [*ok[:3], v]) for v in [*BAD_INTS, "10000001"]]
    calls += [("msg_id", ["", *ok[1:]]), ("msg_id", ["m" * 1025, *ok[1:]])]
    calls += [("error", [ok[0], "e" * 2001, *ok[2:]])]
    calls += [("arguments", ok[:3]), ("arguments", [*ok, ""])]
    return calls


@pytest.mark.parametrize(("what", "args"), _bad_calls())
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, what: str, args: list[object]
) -> None:
    k = Keys(ns)
    rec = k.idem("a")
    await r.hset(rec, "status", "pending")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: bad {what}"):
        await scripts.call(r, "cancel", [rec, k.cancels], args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_keys_of_the_wrong_type_or_number_are_refused(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    rec, lst = k.idem("h"), k.idem("l")
    await r.hset(rec, "status", "pending")
    await r.rpush(lst, "x")
    await r.set(k.cancels, "not a stream")
    before = await snapshot(r, ns)
    args = ["m", "", TTL_MS, 100]
    for keys, why in (
        ([lst], r"KEYS\[1\]: holds a list"),
        ([rec, k.cancels], r"KEYS\[2\]: holds a string"),
        ([], "arguments"),
        ([rec, k.cancels, rec], "arguments"),
    ):
        with pytest.raises(rexc.ResponseError, match=f"^reach: bad {why}"):
            await scripts.call(r, "cancel", keys, args)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_cancel_is_announced_a_refused_one_not(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    rec = Keys(ns).idem("k-announced")
    await _claim(r, rec)
    await r.hset(rec, "watched", 1)
    async with listening(redis_url, rec) as heard:
        assert (await _cancel(r, rec, "m"))[0] == CancelCode.CANCELLED
        assert (await _cancel(r, rec, "m"))[0] == CancelCode.ALREADY_CANCELLED
        assert await heard() == [b"cancelled"]

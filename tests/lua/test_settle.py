"""settle.lua: per item, store the outcome if the fence holds, then reply, run the follow-ups
and ack + delete the entry; a fenced item writes nothing at all."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import GROUP, Keys
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


class Batch:
    """Builds settle.lua's KEYS (deduplicated, 1-based indexes) and ARGV as the runtime does."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.items: list[Any] = []
        self.n = 0

    def ki(self, key: str | None) -> int:
        if key is None:
            return 0
        if key not in self.keys:
            self.keys.append(key)
        return self.keys.index(key) + 1

    def add(
        self,
        *,
        idem: str | None,
        fence: Any,
        status: str,
        reply: bytes,
        mode: str,
        reply_key: str | None,
        inbox: str | None,
        entry: str,
        ops: Sequence[tuple[Any, ...]] = (),
    ) -> None:
        self.n += 1
        self.items += [
            self.ki(idem),
            fence,
            status,
            reply,
            mode,
            "",
            self.ki(reply_key),
            self.ki(inbox),
            entry,
            len(ops),
        ]
        for name, key, *rest in ops:
            self.items += [name, self.ki(key), len(rest), *rest]

    async def run(self, r: AnyRedis) -> Any:
        return await scripts.call(r, "settle", self.keys, [TTL_MS, GROUP, self.n, *self.items])


async def _delivered(r: AnyRedis, inbox: str, n: int) -> list[str]:
    await r.xgroup_create(inbox, GROUP, id="0", mkstream=True)
    for i in range(n):
        await r.xadd(inbox, {"e": f"m{i}"})
    got = await r.xreadgroup(GROUP, "w-1", {inbox: ">"}, count=n)
    return [eid.decode() for eid, _ in got[0][1]]


async def _claim(r: AnyRedis, rec: str) -> int:
    [[code, fence]] = await scripts.call(
        r, "claim", [rec], ["w-1/i1", TTL_MS, "w-1", 60_000, "m", ""]
    )
    assert code == 1
    return int(fence)


async def test_a_settled_item_is_stored_replied_acked_and_deleted(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, replies = k.inbox("w-1", "normal"), k.idem("k1"), k.replies("c-1")
    [entry] = await _delivered(r, inbox, 1)
    fence = await _claim(r, rec)
    b = Batch()
    b.add(
        idem=rec,
        fence=fence,
        status="succeeded",
        reply=b"R",
        mode="done",
        reply_key=replies,
        inbox=inbox,
        entry=entry,
    )
    assert await b.run(r) == [1]
    assert await r.hget(rec, "reply") == b"R" and await r.hget(rec, "done") == b"1"
    [(_, fields)] = await r.xrange(replies)
    assert fields == {b"r": b"R"}
    assert 0 < await r.pttl(replies) <= TTL_MS
    # Acked entries are deleted too, so an inbox holds only work still to do.
    assert await r.xlen(inbox) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 0


async def test_a_fenced_item_writes_nothing_and_leaves_its_entry(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, replies, dlq = k.inbox("w-1", "high"), k.idem("k2"), k.replies("c-1"), k.dlq("cap")
    [entry] = await _delivered(r, inbox, 1)
    fence = await _claim(r, rec)
    await r.hincrby(rec, "fence", 1)  # another owner claimed the key since
    b = Batch()
    b.add(
        idem=rec,
        fence=fence,
        status="dead",
        reply=b"E",
        mode="done",
        reply_key=replies,
        inbox=inbox,
        entry=entry,
        ops=[("XADD", dlq, "*", "reason", "max_attempts")],
    )
    assert await b.run(r) == [0]
    assert await r.hget(rec, "done") is None
    assert await r.exists(replies, dlq) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 1


async def test_follow_up_commands_run_and_items_settle_independently(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox = k.inbox("w-1", "low")
    e1, e2, e3 = await _delivered(r, inbox, 3)
    retry_rec, stale_rec = k.idem("k3"), k.idem("k4")
    f_retry = await _claim(r, retry_rec)
    await _claim(r, stale_rec)
    b = Batch()
    # A retry: release the key, park the envelope in the delayed set, ack this copy.
    b.add(
        idem=retry_rec,
        fence=f_retry,
        status="retrying",
        reply=b"",
        mode="release",
        reply_key=None,
        inbox=inbox,
        entry=e1,
        ops=[("ZADD", k.delayed, 12345, b"ENV")],
    )
    b.add(
        idem=stale_rec,
        fence=999,
        status="succeeded",
        reply=b"X",
        mode="done",
        reply_key=None,
        inbox=inbox,
        entry=e2,
    )
    # No idempotency record (a malformed entry): ack only.
    b.add(idem=None, fence="", status="", reply=b"", mode="", reply_key=None, inbox=inbox, entry=e3)
    assert await b.run(r) == [1, 0, 1]
    assert await r.zrange(k.delayed, 0, -1, withscores=True) == [(b"ENV", 12345.0)]
    assert (
        await r.hget(retry_rec, "status") == b"retrying" and await r.hget(retry_rec, "done") is None
    )
    left = await r.xpending_range(inbox, GROUP, min="-", max="+", count=10)
    assert [p["message_id"].decode() for p in left] == [e2]


async def test_a_disallowed_command_fails_the_batch_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, replies = k.inbox("w-1", "normal"), k.idem("k5"), k.replies("c-1")
    first, second = await _delivered(r, inbox, 2)
    fence = await _claim(r, rec)
    await r.sadd(k.agents, "w-1")
    b = Batch()
    # A good item first: it must not be half-settled when the second one is refused.
    b.add(
        idem=rec,
        fence=fence,
        status="succeeded",
        reply=b"R",
        mode="done",
        reply_key=replies,
        inbox=inbox,
        entry=first,
    )
    b.add(
        idem=None,
        fence="",
        status="",
        reply=b"",
        mode="",
        reply_key=None,
        inbox=inbox,
        entry=second,
        ops=[("DEL", k.agents)],
    )
    with pytest.raises(
        rexc.ResponseError, match=r"^reach: bad extra command 1 of item 2 .* DEL: want XADD or ZADD"
    ):
        await b.run(r)
    assert await r.hget(rec, "done") is None and await r.exists(replies) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 2
    assert await r.smembers(k.agents) == {b"w-1"}


BAD_INTS = ["", "abc", "nan", "inf", "1e309", "1e3", "-5", "0", "1.5", " 5", "007", str(10**16)]


def _bad_calls() -> list[tuple[str, int | None, object]]:
    # (what the error names, ARGV index (0-based) to replace, value); None: see the test.
    # The layout of the good batch is in the test below.
    it1, it2 = "of item 1", "of item 2"
    cmd1, cmd2 = f"extra command 1 {it1}", f"extra command 1 {it2}"
    calls: list[tuple[str, int | None, object]] = [("ttl_ms", 0, v) for v in BAD_INTS]
    calls += [("group", 1, "")]
    calls += [("number of items", 2, v) for v in ["4", "x", "", "-1", "1e3", "02"]]
    calls += [("arguments", 2, "1"), ("arguments", 2, "3"), ("arguments", None, "extra")]
    calls += [(f"idem key index {it2}", 24, v) for v in ["6", "-1", "x", "1.0", ""]]
    calls += [(f"fence {it1}", 4, v) for v in ["abc", "0", "", "-1", "1e3"]]
    calls += [(f"status {it1}", 5, v) for v in ["x", "", "running"]]
    calls += [(f"mode {it1}", 7, v) for v in ["x", ""]]
    calls += [(f"reply stream index {it2}", 30, v) for v in ["6", "x"]]
    calls += [(f"inbox index {it2}", 31, v) for v in ["6", "-1"]]
    calls += [
        (f"entry id {it2}", 32, v)
        for v in [
            "abc",
            "",
            "1-",
            "-1",
            "1-2-3",
            " 1-0",
            "18446744073709551616-0",
            "1-18446744073709551616",
            "123456789012345678901-0",
        ]
    ]
    calls += [(f"number of extra commands {it2}", 33, v) for v in ["2", "x", "100", ""]]
    calls += [(cmd2, 34, v) for v in ["DEL", "zadd", "EVAL", "", "XACK"]]
    calls += [(f"key index of {cmd2}", 35, v) for v in ["0", "6", "x"]]
    calls += [(f"number of arguments of {cmd2}", 36, v) for v in ["3", "1001", "x", ""]]
    calls += [(f"number of arguments of {cmd2}", None, "drop"), (cmd2, 36, "1"), (cmd2, 36, "0")]
    calls += [
        (cmd2, 37, v) for v in ["nan", "inf", "-inf", "1e309", "", "abc", " 1", "1e3", "1" * 30]
    ]
    calls += [(cmd1, 16, v) for v in ["MINID", "NOMKSTREAM"]]  # for MAXLEN
    calls += [(cmd1, 18, v) for v in ["x", "-1", "", "1e3"]]  # the MAXLEN count
    calls += [(cmd1, 19, v) for v in ["1-1", "0-1", "$"]]  # for '*'
    calls += [(cmd1, 15, "7"), (cmd1, 15, "5")]  # no value for the last field
    # One key used as two types: ZADD on the inbox; XADD on the idempotency record.
    calls += [(f"key index of {cmd2}", 35, "3"), (f"key index of {cmd1}", 14, "1")]
    return calls


@pytest.mark.parametrize(("what", "at", "value"), _bad_calls())
async def test_a_batch_out_of_contract_is_refused_before_any_write(
    r: AnyRedis, ns: str, what: str, at: int | None, value: object
) -> None:
    k = Keys(ns)
    inbox, rec, replies, dlq = k.inbox("w-1", "normal"), k.idem("k"), k.replies("c"), k.dlq("cap")
    e1, e2 = await _delivered(r, inbox, 2)
    fence = await _claim(r, rec)
    await r.zadd(k.delayed, {b"OLD": 1})
    b = Batch()
    # KEYS: rec 1, replies 2, inbox 3, dlq 4, delayed 5. ARGV (0-based): ttl 0, group 1,
    # n 2; item 1 at 3..12, its XADD at 13..23 (name, key index, 8 args: MAXLEN ~ 1000 *
    # and two pairs); item 2 at 24..33, its ZADD at 34..38.
    b.add(
        idem=rec,
        fence=fence,
        status="succeeded",
        reply=b"R",
        mode="done",
        reply_key=replies,
        inbox=inbox,
        entry=e1,
        ops=[("XADD", dlq, "MAXLEN", "~", 1000, "*", "reason", "x", "env", b"E")],
    )
    b.add(
        idem=None,
        fence="",
        status="",
        reply=b"",
        mode="",
        reply_key=None,
        inbox=inbox,
        entry=e2,
        ops=[("ZADD", k.delayed, 12345, b"ENV")],
    )
    args: list[Any] = [TTL_MS, GROUP, b.n, *b.items]
    assert len(args) == 39 and args[34] == "ZADD" and args[19] == "*"
    if at is not None:
        args[at] = value
    elif value == "drop":
        args = args[:-1]
    else:
        args = [*args, "x"]
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: bad {re.escape(what)}"):
        await scripts.call(r, "settle", b.keys, args)
    assert_unchanged(before, await snapshot(r, ns))
    # The same batch, as the runtime builds it, settles.
    assert await b.run(r) == [1, 1]
    assert await r.xlen(inbox) == 0 and await r.xlen(dlq) == 1


async def test_a_key_of_another_type_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    inbox, rec, replies, dlq = k.inbox("w-1", "low"), k.idem("k"), k.replies("c"), k.dlq("cap")
    [e1] = await _delivered(r, inbox, 1)
    fence = await _claim(r, rec)
    await r.set(dlq, "not a stream")
    b = Batch()
    b.add(
        idem=rec,
        fence=fence,
        status="dead",
        reply=b"R",
        mode="release",
        reply_key=replies,
        inbox=inbox,
        entry=e1,
        ops=[("XADD", dlq, "*", "reason", "x")],
    )
    before = await snapshot(r, ns)
    with pytest.raises(
        rexc.ResponseError,
        match=r"^reach: bad KEYS\[4\]: holds a string, key index of extra command",
    ):
        await b.run(r)
    assert_unchanged(before, await snapshot(r, ns))

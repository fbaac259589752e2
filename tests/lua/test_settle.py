"""settle.lua: per item, store the outcome if the fence holds, then reply, file its follow-up
(a dead letter or a delayed copy, in fixed slots) and ack + delete the entry; a fenced item
writes nothing at all."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import GROUP, Keys
from reach.scripts.codes import StreamBound
from reach.scripts.delivery import DeadLetter, Delayed
from reach.tasks import dead_letter_op
from tests.lua.announced import listening
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
        inbox: str | None,
        entry: str,
        idem: str | None = None,
        fence: Any = "",
        status: str = "",
        reply: bytes = b"",
        mode: str = "",
        reply_key: str | None = None,
        follow_up: DeadLetter | Delayed | None = None,
        stored: bytes | None = None,
    ) -> None:
        """One item; without ``idem``, one that completes no record (an ack only).
        ``stored``: what its record keeps (None: the reply's bytes, as the runtime's short
        form is bytes the script does not read)."""
        self.n += 1
        self.items += [
            self.ki(idem),
            fence,
            status,
            reply if stored is None else stored,
            mode,
            "",
            reply,
            self.ki(reply_key),
            self.ki(inbox),
            entry,
        ]
        if isinstance(follow_up, DeadLetter):
            self.items += [1, self.ki(follow_up.stream), follow_up.maxlen, *follow_up.values]
        elif isinstance(follow_up, Delayed):
            self.items += [2, self.ki(follow_up.zset), follow_up.due_ms, follow_up.envelope]
        else:
            self.items.append(0)

    def plain(self, *, inbox: str | None, entry: str, idem: str, fence: Any, stored: bytes) -> None:
        """A plain success in its 5 slots: '+<record index>', fence, stored reply, inbox
        index, entry id (succeeded, done, no error, no reply published, no follow-up)."""
        self.n += 1
        self.items += [f"+{self.ki(idem)}", fence, stored, self.ki(inbox), entry]

    def plain_run(
        self, *, inbox: str | None, fence: Any, items: list[tuple[str, str, bytes]]
    ) -> None:
        """A run of plain successes in 4 + 2k slots: '*k', fence, inbox index, the first
        record's index, then (stored reply, entry id) each; ``items``: (record, entry id,
        stored) each, the records new to this batch (their KEYS in a row)."""
        ii = self.ki(inbox)
        first = self.ki(items[0][0])
        assert all(self.ki(rec) == first + j for j, (rec, _, _) in enumerate(items))
        self.n += len(items)
        self.items += [f"*{len(items)}", fence, ii, first]
        for _, entry, stored in items:
            self.items += [stored, entry]

    def complete(
        self,
        s: Scene,
        entry: str,
        *,
        status: str = "succeeded",
        mode: str = "done",
        reply: bytes = b"R",
        follow_up: DeadLetter | Delayed | None = None,
    ) -> None:
        """An item that completes the scene's claimed record and replies to its stream."""
        self.add(
            inbox=s.inbox,
            entry=entry,
            idem=s.rec,
            fence=s.fence,
            status=status,
            reply=reply,
            mode=mode,
            reply_key=s.replies,
            follow_up=follow_up,
        )

    async def run(self, r: AnyRedis) -> Any:
        return await scripts.call(r, "settle", self.keys, [TTL_MS, GROUP, self.n, *self.items])


def _letter(stream: str) -> DeadLetter:
    return DeadLetter(
        stream, 1000, "max_attempts", "boom", "ValueError", 3, "w-1", "m", "cap", 1, b"E"
    )


async def _delivered(r: AnyRedis, inbox: str, n: int) -> list[str]:
    await r.xgroup_create(inbox, GROUP, id="0", mkstream=True)
    for i in range(n):
        await r.xadd(inbox, {"e": f"m{i}"})
    got = await r.xreadgroup(GROUP, "w-1", {inbox: ">"}, count=n)
    return [eid.decode() for eid, _ in got[0][1]]


async def _claim(r: AnyRedis, rec: str) -> int:
    [[code, fence]] = await scripts.call(
        r, "claim", [rec], ["w-1/i1", TTL_MS, "w-1", 3, 60_000, "m", ""]
    )
    assert code == 1
    return int(fence)


@dataclass
class Scene:
    """A test's keys: an inbox with ``entries`` delivered to w-1, a record claimed with
    ``fence``, a reply stream and a dead-letter stream."""

    k: Keys
    inbox: str
    rec: str
    replies: str
    dlq: str
    entries: list[str]
    fence: int


async def _scene(r: AnyRedis, ns: str, *, n: int = 1, priority: str = "normal") -> Scene:
    k = Keys(ns)
    inbox, rec = k.inbox("w-1", priority), k.idem("k")
    entries = await _delivered(r, inbox, n)
    return Scene(k, inbox, rec, k.replies("c-1"), k.dlq("cap"), entries, await _claim(r, rec))


async def test_a_settled_item_is_stored_replied_acked_and_deleted(r: AnyRedis, ns: str) -> None:
    s = await _scene(r, ns)
    inbox, rec, replies = s.inbox, s.rec, s.replies
    b = Batch()
    b.complete(s, s.entries[0])
    assert await b.run(r) == [1]
    assert await r.hget(rec, "reply") == b"R" and await r.hget(rec, "done") == b"1"
    [(_, fields)] = await r.xrange(replies)
    assert fields == {b"r": b"R"}
    assert 0 < await r.pttl(replies) <= TTL_MS
    # Acked entries are deleted too, so an inbox holds only work still to do.
    assert await r.xlen(inbox) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 0


async def test_a_fenced_item_writes_nothing_and_leaves_its_entry(r: AnyRedis, ns: str) -> None:
    s = await _scene(r, ns, priority="high")
    inbox, rec, replies, dlq = s.inbox, s.rec, s.replies, s.dlq
    await r.hincrby(rec, "fence", 1)  # another owner claimed the key since
    b = Batch()
    b.complete(s, s.entries[0], status="dead", reply=b"E", follow_up=_letter(dlq))
    assert await b.run(r) == [0]
    assert await r.hget(rec, "done") is None
    assert await r.exists(replies, dlq) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 1


async def test_follow_ups_are_written_and_items_settle_independently(r: AnyRedis, ns: str) -> None:
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
        follow_up=Delayed(k.delayed, 12345, b"ENV"),
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
    b.add(inbox=inbox, entry=e3)
    assert await b.run(r) == [1, 0, 1]
    assert await r.zrange(k.delayed, 0, -1, withscores=True) == [(b"ENV", 12345.0)]
    assert (
        await r.hget(retry_rec, "status") == b"retrying" and await r.hget(retry_rec, "done") is None
    )
    left = await r.xpending_range(inbox, GROUP, min="-", max="+", count=10)
    assert [p["message_id"].decode() for p in left] == [e2]


async def test_a_dead_letter_is_the_one_reach_tasks_writes(r: AnyRedis, ns: str) -> None:
    # The CLI, the admin module and agents in other languages read dead letters: the entry
    # settle.lua files has the fields, order and bytes of reach.tasks.dead_letter_op's XADD.
    k = Keys(ns)
    inbox = k.inbox("w-1", "normal")
    [entry] = await _delivered(r, inbox, 1)
    op = dead_letter_op(
        k,
        capability="cap",
        reason="max_attempts",
        data=b"\x81\xa1e\xc3",
        error="boom \u00e9",
        error_type="ValueError",
        attempts=3,
        agent_id="w-1",
        msg_id="m-1",
        maxlen=1000,
    )
    b = Batch()
    b.add(inbox=inbox, entry=entry, follow_up=DeadLetter.of_op(op))
    assert await b.run(r) == [1]
    await r.execute_command(*op[:1], k.dlq("direct"), *op[2:])
    [(_, filed)] = await r.xrange(k.dlq("cap"))
    [(_, direct)] = await r.xrange(k.dlq("direct"))
    assert list(filed.items()) == list(direct.items())
    assert list(filed)[:2] == [b"reason", b"error"] and filed[b"env"] == b"\x81\xa1e\xc3"


async def test_a_follow_up_out_of_contract_fails_the_batch_before_any_write(
    r: AnyRedis, ns: str
) -> None:
    s = await _scene(r, ns, n=2)
    inbox, rec, replies = s.inbox, s.rec, s.replies
    b = Batch()
    # A good item first: it must not be half-settled when the second one is refused.
    b.complete(s, s.entries[0])
    b.add(inbox=inbox, entry=s.entries[1])
    args = [TTL_MS, GROUP, b.n, *b.items[:-1], 3]  # a follow-up kind 3: there is none
    with pytest.raises(
        rexc.ResponseError,
        match=r"^reach: bad follow-up of item 2 \(ARGV\[25\]\) 3: want 0, 1 or 2",
    ):
        await scripts.call(r, "settle", b.keys, args)
    assert await r.hget(rec, "done") is None and await r.exists(replies) == 0
    assert (await r.xpending(inbox, GROUP))["pending"] == 2


BAD_INTS = ["", "abc", "nan", "inf", "1e309", "1e3", "-5", "0", "1.5", " 5", "007", str(10**16)]


def _bad_calls() -> list[tuple[str, int | None, object]]:
    # (what the error names, ARGV index (0-based) to replace, value); None: see the test.
    # The layout of the good batch is in the test below.
    it1, it2 = "of item 1", "of item 2"
    calls: list[tuple[str, int | None, object]] = [("ttl_ms", 0, v) for v in BAD_INTS]
    calls += [("group", 1, "")]
    # n past (36 ARGV after the header) / 5, the fewest an item takes: refused as such;
    # n within it, more items than the ARGV hold: refused at the first item left short.
    calls += [("number of items", 2, v) for v in ["99", "x", "", "-1", "1e3", "02"]]
    calls += [("arguments: item 3 starts at ARGV[40], needs 5 ARGV at least", 2, "4")]
    # n 1: the second item reads as the failure details, then an index section.
    calls += [("recent index", 2, "1"), ("arguments", 2, "3"), ("number of details", None, "extra")]
    calls += [("arguments", None, "drop"), ("arguments", 35, "1"), ("number of details", 35, "0")]
    calls += [(f"record index {it2}", 25, v) for v in ["6", "-1", "x", "1.0", ""]]
    calls += [(f"fence {it1}", 4, v) for v in ["abc", "0", "", "-1", "1e3"]]
    calls += [(f"status {it1}", 5, v) for v in ["x", "", "running"]]
    calls += [(f"mode {it1}", 7, v) for v in ["x", ""]]
    calls += [(f"reply stream index {it2}", 32, v) for v in ["6", "x"]]
    calls += [(f"inbox index {it2}", 33, v) for v in ["6", "-1"]]
    calls += [
        (f"entry id {it2}", 34, v)
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
    calls += [(f"follow-up {it1}", 13, v) for v in ["3", "x", "", "-1", "01", "1.0"]]
    calls += [(f"dead-letter stream index {it1}", 14, v) for v in ["0", "6", "x"]]
    calls += [(f"maxlen {it1}", 15, v) for v in ["x", "-1", "", "1e3", str(10**16)]]
    calls += [(f"attempts {it1}", 19, v) for v in ["x", "-1", "", "1.5"]]
    calls += [(f"ts {it1}", 23, v) for v in ["x", "1.5", "", "nan"]]
    calls += [(f"delayed index {it2}", 36, v) for v in ["0", "6", "x"]]
    calls += [
        (f"due {it2}", 37, v)
        for v in ["nan", "inf", "-inf", "1e309", "", "abc", " 1", "1e3", "1" * 30, "1.5", "-3"]
    ]
    # One key used as two types: the inbox as the delayed zset; the record as a dead-letter
    # stream. The refusal names the key's first use, which the script keeps for it.
    calls += [
        (
            f"delayed index {it2}: KEYS[3] is used as a stream by inbox index {it1}, here as a zset",
            36,
            "3",
        ),
        (
            (
                f"dead-letter stream index {it1}: KEYS[1] is used as a hash by record index "
                f"{it1}, here as a stream"
            ),
            14,
            "1",
        ),
    ]
    return calls


@pytest.mark.parametrize(("what", "at", "value"), _bad_calls())
async def test_a_batch_out_of_contract_is_refused_before_any_write(
    r: AnyRedis, ns: str, what: str, at: int | None, value: object
) -> None:
    s = await _scene(r, ns, n=2)
    k, inbox, dlq, (e1, e2) = s.k, s.inbox, s.dlq, s.entries
    await r.zadd(k.delayed, {b"OLD": 1})
    b = Batch()
    # KEYS: rec 1, replies 2, inbox 3, dlq 4, delayed 5. ARGV (0-based): ttl 0, group 1,
    # n 2; item 1 at 3..13 (its follow-up kind at 13), its dead letter at 14..24 (stream
    # index, maxlen, reason, error, error_type, attempts 19, agent_id, msg_id, capability,
    # ts 23, env); item 2 at 25..35, its delayed copy at 36..38 (zset index, due, envelope).
    b.complete(s, e1, follow_up=_letter(dlq))
    b.add(inbox=inbox, entry=e2, follow_up=Delayed(k.delayed, 12345, b"ENV"))
    args: list[Any] = [TTL_MS, GROUP, b.n, *b.items]
    assert len(args) == 39 and args[13] == 1 and args[35] == 2 and args[38] == b"ENV"
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
    s = await _scene(r, ns, priority="low")
    await r.set(s.dlq, "not a stream")
    b = Batch()
    b.complete(s, s.entries[0], status="dead", mode="release", follow_up=_letter(s.dlq))
    before = await snapshot(r, ns)
    with pytest.raises(
        rexc.ResponseError,
        match=r"^reach: bad KEYS\[4\]: holds a string, dead-letter stream index of item 1 wants",
    ):
        await b.run(r)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_record_of_another_type_is_refused_before_any_write(r: AnyRedis, ns: str) -> None:
    # Records are read in the check pass (HMGET) rather than asked their TYPE: what is not
    # a hash is refused all the same, naming the key, before anything is written.
    s = await _scene(r, ns)
    await r.delete(s.rec)
    await r.set(s.rec, "not a record")
    b = Batch()
    b.complete(s, s.entries[0])
    before = await snapshot(r, ns)
    with pytest.raises(
        rexc.ResponseError,
        match=r"^reach: bad KEYS\[1\]: holds a string, record index of item 1 wants a hash",
    ):
        await b.run(r)
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_record_twice_in_a_batch_is_read_again_after_its_first_completion(
    r: AnyRedis, ns: str
) -> None:
    # Two items of one record (two copies of a message): the first completes it, the second
    # sees it done (read again, not what the check pass read) and is fenced.
    s = await _scene(r, ns, n=2)
    b = Batch()
    b.complete(s, s.entries[0], reply=b"first")
    b.complete(s, s.entries[1], reply=b"second")
    assert await b.run(r) == [1, 0]
    assert await r.hget(s.rec, "reply") == b"first"
    left = await r.xpending_range(s.inbox, GROUP, min="-", max="+", count=10)
    assert [p["message_id"].decode() for p in left] == [s.entries[1]]


async def test_a_large_batch_acks_and_deletes_every_settled_entry(r: AnyRedis, ns: str) -> None:
    # The settled entries of an inbox are acked and deleted together at the end, in chunks
    # (more ids than one unpack gives); fenced entries are left pending.
    k = Keys(ns)
    high, low = k.inbox("w-1", "high"), k.inbox("w-1", "low")
    entries = await _delivered(r, high, 2100)
    kept = await _delivered(r, low, 2)
    rec = k.idem("k")
    fence = await _claim(r, rec)
    b = Batch()
    for e in entries[:1000]:
        b.add(inbox=high, entry=e)
    b.add(inbox=low, entry=kept[0], idem=rec, fence=fence + 1, status="succeeded", mode="done")
    for e in entries[1000:]:
        b.add(inbox=high, entry=e)
    b.add(inbox=low, entry=kept[1])
    assert await b.run(r) == [1] * 1000 + [0] + [1] * 1100 + [1]
    assert await r.xlen(high) == 0
    assert (await r.xpending(high, GROUP))["pending"] == 0
    left = await r.xpending_range(low, GROUP, min="-", max="+", count=10)
    assert [p["message_id"].decode() for p in left] == [kept[0]]
    assert await r.xlen(low) == 1


async def test_a_completion_counts_the_run_of_a_claim_made_at_send(r: AnyRedis, ns: str) -> None:
    # send.lua's claim writes no runs (absent: 0, no run yet) and a quick handler gets no
    # start.lua: its completion counts the run, in settle.lua and in complete.lua alike. A
    # record of an ordinary claim keeps its count.
    from reach.scripts import delivery, inbox

    k = Keys(ns)
    for key in ("cas-s", "cas-c"):
        m = inbox.Message(b"ENV", "cap", 1, key, key)
        await inbox.send_call(k, m, agent_id="w-1", priority="normal", ttl_ms=TTL_MS,
                              claim_for="w-1/i1", claim_lease_ms=60_000).run(r)  # fmt: skip
        assert await r.hget(k.idem(key), "runs") is None
    s = await _scene(r, ns)  # an ordinary claim: runs 1
    b = Batch()
    b.complete(s, s.entries[0])
    b.add(inbox=None, entry="", idem=k.idem("cas-s"), fence=1, status="succeeded",
          reply=b"R", mode="done")  # fmt: skip
    assert await b.run(r) == [1, 1]
    done = delivery.Completion(k.idem("cas-c"), 1, "failed", delivery.Mode.RELEASE, "x")
    assert await delivery.complete_call([(done, b"")], ttl_ms=TTL_MS).run(r) == [1]
    assert [await r.hget(k.idem(x), "runs") for x in ("cas-s", "cas-c")] == [b"1", b"1"]
    assert await r.hget(s.rec, "runs") == b"1"


async def test_a_reply_stream_is_bounded(r: AnyRedis, ns: str) -> None:
    # Replies nobody reads (a caller gone for good, a flood written into its stream) must
    # not grow the stream without limit: each reply is added with MAXLEN ~ the bound.
    s = await _scene(r, ns)
    bound = int(StreamBound.REPLIES)
    for start in range(0, bound + 5_000, 10_000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(start + 10_000, bound + 5_000)):
            pipe.xadd(s.replies, {"r": b"old"}, id=f"1-{i + 1}")
        await pipe.execute()
    assert await r.xlen(s.replies) == bound + 5_000
    b = Batch()
    b.complete(s, s.entries[0])
    assert await b.run(r) == [1]
    # Approximate trimming drops whole stream nodes (100 entries by default), oldest first.
    assert bound <= await r.xlen(s.replies) <= bound + 200
    [(_, newest)] = await r.xrevrange(s.replies, count=1)
    assert newest == {b"r": b"R"}


async def test_failure_details_go_to_the_record_and_the_dead_letter(r: AnyRedis, ns: str) -> None:
    s = await _scene(r, ns, n=2)
    b = Batch()
    b.complete(s, s.entries[0], status="dead", mode="release", follow_up=_letter(s.dlq))
    b.add(inbox=s.inbox, entry=s.entries[1])
    args = [TTL_MS, GROUP, b.n, *b.items, 1, 1, "KeyError", "Traceback ...\nKeyError: 'txt'\n"]
    assert await scripts.call(r, "settle", b.keys, args) == [1, 1]
    assert await r.hmget(s.rec, "status", "error_type", "traceback") == [
        b"dead",
        b"KeyError",
        b"Traceback ...\nKeyError: 'txt'\n",
    ]
    [(_, fields)] = await r.xrange(s.dlq)
    assert list(fields)[-1] == b"traceback" and fields[b"env"] == b"E"
    assert fields[b"traceback"].endswith(b"KeyError: 'txt'\n")


async def test_a_batch_without_details_is_settled_as_before(r: AnyRedis, ns: str) -> None:
    s = await _scene(r, ns, n=1)
    b = Batch()
    b.complete(s, s.entries[0], status="dead", mode="release", follow_up=_letter(s.dlq))
    assert await b.run(r) == [1]
    assert await r.hget(s.rec, "traceback") is None
    [(_, fields)] = await r.xrange(s.dlq)
    assert b"traceback" not in fields


@pytest.mark.parametrize(
    ("tail", "what"),
    [
        (["2", 1, "T", "tb"], "bad number of details"),
        (["1", 1, "T"], "bad arguments: 1 details"),
        (["1", 2, "T", "tb"], "bad item number of detail 1"),
        (["1", 0, "T", "tb"], "bad item number of detail 1"),
        (["x"], "bad number of details"),
    ],
)
async def test_details_out_of_contract_are_refused_before_any_write(
    r: AnyRedis, ns: str, tail: list[Any], what: str
) -> None:
    s = await _scene(r, ns, n=1)
    b = Batch()
    b.complete(s, s.entries[0], status="dead", mode="release")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: {re.escape(what)}"):
        await scripts.call(r, "settle", b.keys, [TTL_MS, GROUP, b.n, *b.items, *tail])
    assert_unchanged(before, await snapshot(r, ns))


async def test_the_index_section_adds_one_entry_per_chunk(r: AnyRedis, ns: str) -> None:
    s = await _scene(r, ns, n=2)
    recent = s.k.recent
    b = Batch()
    b.complete(s, s.entries[0])
    b.add(inbox=s.inbox, entry=s.entries[1])
    args = [TTL_MS, GROUP, b.n, *b.items, 0, b.ki(recent), 100, 2, b"C1", b"C2"]
    assert await scripts.call(r, "settle", b.keys, args) == [1, 1]
    assert [f[b"m"] for _, f in await r.xrange(recent)] == [b"C1", b"C2"]


@pytest.mark.parametrize(
    ("tail", "what"),
    [
        ([0, "x", 100, 1, b"C"], "bad recent index"),
        ([0, "R", "x", 1, b"C"], "bad recent maxlen"),
        ([0, "R", 100, 2, b"C"], "bad number of chunks"),
        ([0, "R", 100, 1], "bad arguments: 1 chunks"),
        ([0, "R", 100], "bad arguments: the index"),
    ],
)
async def test_an_index_section_out_of_contract_is_refused_before_any_write(
    r: AnyRedis, ns: str, tail: list[Any], what: str
) -> None:
    s = await _scene(r, ns, n=1)
    b = Batch()
    b.complete(s, s.entries[0])
    ri = b.ki(s.k.recent)
    tail = [ri if v == "R" else v for v in tail]
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: {re.escape(what)}"):
        await scripts.call(r, "settle", b.keys, [TTL_MS, GROUP, b.n, *b.items, *tail])
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_settled_item_is_announced_a_fenced_one_not(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    s = await _scene(r, ns, n=2)
    await r.hset(s.rec, "watched", 1)
    async with listening(redis_url, s.rec) as heard:
        b = Batch()
        b.complete(s, s.entries[0])
        assert await b.run(r) == [1]
        again = Batch()
        again.complete(s, s.entries[1])  # the same fence: the record is done, so fenced
        assert await again.run(r) == [0]
        assert await heard() == [b"succeeded"]


async def test_every_reply_stream_written_lives_ttl_ms_and_only_those(r: AnyRedis, ns: str) -> None:
    # Replies of one batch to one stream share a PEXPIRE, given after the items: each
    # stream written to ends with the TTL, one only a fenced item would have written none.
    s = await _scene(r, ns, n=4)
    k = s.k
    await r.hset(k.idem("other"), mapping={"fence": "7"})  # claimed by someone else
    b = Batch()
    for i, to in ((0, "c-1"), (1, "c-2"), (2, "c-1")):
        b.add(inbox=s.inbox, entry=s.entries[i], reply=b"R%d" % i, reply_key=k.replies(to))
    b.add(inbox=s.inbox, entry=s.entries[3], idem=k.idem("other"), fence=1, status="succeeded",
          mode="done", reply=b"late", reply_key=k.replies("c-3"))  # fmt: skip
    await r.xadd(k.replies("c-2"), {"r": b"old"})  # an existing stream without a TTL
    assert await b.run(r) == [1, 1, 1, 0]
    assert [f[b"r"] for _, f in await r.xrange(k.replies("c-1"))] == [b"R0", b"R2"]
    assert [f[b"r"] for _, f in await r.xrange(k.replies("c-2"))] == [b"old", b"R1"]
    for to in ("c-1", "c-2"):
        assert 0 < await r.pttl(k.replies(to)) <= TTL_MS
    assert await r.exists(k.replies("c-3")) == 0


# -- the plain success's 5 slots -------------------------------------------------------------
async def _two_claimed(r: AnyRedis, ns: str) -> tuple[str, str, str, list[str]]:
    """An inbox with 3 entries delivered to w-1, and two records claimed (fence 1 each)."""
    k = Keys(ns)
    inbox, rec1, rec2 = k.inbox("w-1", "normal"), k.idem("p1"), k.idem("p2")
    entries = await _delivered(r, inbox, 3)
    assert await _claim(r, rec1) == 1 and await _claim(r, rec2) == 1
    return inbox, rec1, rec2, entries


async def test_a_plain_success_settles_as_its_full_form_does(r: AnyRedis, ns: str) -> None:
    inbox, rec1, rec2, (e1, e2, e3) = await _two_claimed(r, ns)
    await r.hset(rec2, "error", "an earlier attempt's")  # deleted by either form
    await r.hset(rec1, "error", "an earlier attempt's")
    b = Batch()
    b.add(inbox=inbox, entry=e1, idem=rec1, fence=1, status="succeeded", mode="done",
          stored=b"S")  # fmt: skip
    b.plain(inbox=inbox, entry=e2, idem=rec2, fence=1, stored=b"S")
    assert len(b.items) == 11 + 5
    assert await b.run(r) == [1, 1]
    # The same record (updated_ms too: one call, one clock), living ttl_ms.
    full, plain = await r.hgetall(rec1), await r.hgetall(rec2)
    assert full == plain and plain[b"status"] == b"succeeded" and plain[b"reply"] == b"S"
    assert b"owner" not in plain and b"error" not in plain and plain[b"done"] == b"1"
    assert 0 < await r.pttl(rec2) <= TTL_MS
    # Both entries acked and deleted; the third is left as it was.
    assert [eid.decode() for eid, _ in await r.xrange(inbox)] == [e3]
    assert (await r.xpending(inbox, GROUP))["pending"] == 1


async def test_a_fenced_plain_success_writes_nothing(r: AnyRedis, ns: str) -> None:
    inbox, rec1, rec2, (e1, e2, _) = await _two_claimed(r, ns)
    await r.hincrby(rec2, "fence", 1)  # another owner claimed the key since
    before = await r.hgetall(rec2)
    b = Batch()
    b.plain(inbox=inbox, entry=e1, idem=rec1, fence=1, stored=b"S")
    b.plain(inbox=inbox, entry=e2, idem=rec2, fence=1, stored=b"S")
    assert await b.run(r) == [1, 0]
    assert await r.hgetall(rec2) == before
    [(first, _), *_rest] = await r.xrange(inbox)
    assert first.decode() == e2  # left pending


def _bad_plain_calls() -> list[tuple[str, int | None, object]]:
    it1 = "of item 1"
    calls: list[tuple[str, int | None, object]] = [
        (f"record index {it1}", 3, v) for v in ["+0", "+9", "+x", "+", "+01", "+-1", "++1", "+1.0"]
    ]
    calls += [(f"fence {it1}", 4, v) for v in ["0", "x", "", "-1"]]
    calls += [(f"inbox index {it1}", 6, v) for v in ["9", "x", "-1"]]
    calls += [(f"entry id {it1}", 7, v) for v in ["abc", "", "1-"]]
    calls += [
        (f"inbox index {it1}: KEYS[1] is used as a hash by record index {it1}", 6, "1"),
        (f"record index of item 2: KEYS[2] is used as a stream by inbox index {it1}", 8, "+2"),
        ("arguments: item 2 starts at ARGV[9], needs 5 ARGV at least", None, "drop"),
    ]
    return calls


@pytest.mark.parametrize(("what", "at", "value"), _bad_plain_calls())
async def test_a_plain_success_out_of_contract_is_refused_before_any_write(
    r: AnyRedis, ns: str, what: str, at: int | None, value: object
) -> None:
    inbox, rec1, rec2, (e1, e2, _) = await _two_claimed(r, ns)
    b = Batch()
    # KEYS: rec1 1, inbox 2, rec2 3. ARGV (0-based): ttl 0, group 1, n 2; item 1 (plain)
    # at 3..7 (record 3, fence 4, stored 5, inbox 6, entry 7), item 2 (plain) at 8..12.
    b.plain(inbox=inbox, entry=e1, idem=rec1, fence=1, stored=b"S")
    b.plain(inbox=inbox, entry=e2, idem=rec2, fence=1, stored=b"S")
    args: list[Any] = [TTL_MS, GROUP, b.n, *b.items]
    assert len(args) == 13 and args[3] == "+1" and args[8] == "+3"
    if at is not None:
        args[at] = value
    else:
        args = args[:-1]
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: bad {re.escape(what)}"):
        await scripts.call(r, "settle", b.keys, args)
    assert_unchanged(before, await snapshot(r, ns))
    assert await b.run(r) == [1, 1]


async def test_the_runtime_sends_a_plain_success_in_its_5_slots(r: AnyRedis, ns: str) -> None:
    """settle_call: a plain success goes in 5 slots, anything else in the full form, in
    one batch that settles."""
    from reach.scripts import delivery

    inbox, rec1, rec2, (e1, e2, _) = await _two_claimed(r, ns)
    k = Keys(ns)
    items = [
        delivery.SettleItem(
            inbox, e1, delivery.Completion(rec1, 1, "succeeded", delivery.Mode.DONE, stored=b"S")
        ),
        delivery.SettleItem(
            inbox,
            e2,
            delivery.Completion(rec2, 1, "succeeded", delivery.Mode.DONE, stored=b"S"),
            reply=b"R",
            reply_stream=k.replies("c-1"),
        ),
    ]
    call = delivery.settle_call(items, ttl_ms=TTL_MS)
    # KEYS: the inbox 1 (named before its record), rec1 2, rec2 3
    assert call.args[3:8] == ("+2", 1, b"S", "1", e1)
    assert call.args[8] == "3" and len(call.args) == 3 + 5 + 11
    assert await call.run(r) == [delivery.SettleCode.SETTLED] * 2
    assert await r.xlen(k.replies("c-1")) == 1 and await r.xlen(inbox) == 1


# -- a run of plain successes ('*k') ------------------------------------------------------
async def _claimed(r: AnyRedis, ns: str, n: int) -> tuple[str, list[str], list[str]]:
    """An inbox with n + 1 entries delivered to w-1, and n records claimed (fence 1 each)."""
    k = Keys(ns)
    inbox = k.inbox("w-1", "normal")
    recs = [k.idem(f"q{i}") for i in range(n)]
    entries = await _delivered(r, inbox, n + 1)
    for rec in recs:
        assert await _claim(r, rec) == 1
    return inbox, recs, entries


async def test_a_run_settles_each_record_as_its_5_slot_form_does(r: AnyRedis, ns: str) -> None:
    inbox, recs, entries = await _claimed(r, ns, 6)
    await r.hset(recs[1], "error", "an earlier attempt's")  # deleted either way
    await r.hset(recs[4], "error", "an earlier attempt's")
    b = Batch()
    b.ki(inbox)
    b.plain_run(inbox=inbox, fence=1, items=[(recs[i], entries[i], b"S%d" % i) for i in range(3)])
    for i in range(3, 6):
        b.plain(inbox=inbox, entry=entries[i], idem=recs[i], fence=1, stored=b"S%d" % i)
    assert len(b.items) == 4 + 2 * 3 + 5 * 3
    assert await b.run(r) == [1] * 6
    for i in range(3):  # the same record (updated_ms too: one call, one clock)
        run, alone = await r.hgetall(recs[i]), await r.hgetall(recs[i + 3])
        assert run.pop(b"reply") == b"S%d" % i and alone.pop(b"reply") == b"S%d" % (i + 3)
        assert run == alone and run[b"status"] == b"succeeded" and b"error" not in run
        assert 0 < await r.pttl(recs[i]) <= TTL_MS
    assert [eid.decode() for eid, _ in await r.xrange(inbox)] == [entries[6]]
    assert (await r.xpending(inbox, GROUP))["pending"] == 1


async def test_a_fenced_record_of_a_run_writes_nothing_the_others_settle(
    r: AnyRedis, ns: str
) -> None:
    inbox, recs, entries = await _claimed(r, ns, 3)
    await r.hincrby(recs[1], "fence", 1)  # another owner claimed it since
    before = await r.hgetall(recs[1])
    b = Batch()
    b.ki(inbox)
    b.plain_run(inbox=inbox, fence=1, items=[(recs[i], entries[i], b"S") for i in range(3)])
    assert await b.run(r) == [1, 0, 1]
    assert await r.hgetall(recs[1]) == before
    left = [eid.decode() for eid, _ in await r.xrange(inbox)]
    assert left == [entries[1], entries[3]]  # the fenced one's entry left pending


def _bad_run_calls() -> list[tuple[str, int | None, object]]:
    # ARGV (0-based): ttl 0, group 1, n 2 (= 3); the run at 3: '*3' 3, fence 4, inbox 5,
    # first record 6, then (stored, entry) at 7/8, 9/10, 11/12. KEYS: inbox 1, records 2..4.
    it1 = "of item 1"
    calls: list[tuple[str, int | None, object]] = [
        (f"run length {it1}", 3, v) for v in ["*0", "*4", "*x", "*", "*01", "*-1"]
    ]
    calls += [(f"fence {it1}", 4, v) for v in ["0", "x", "", "-1"]]
    calls += [(f"inbox index {it1}", 5, v) for v in ["9", "x", "-1"]]
    calls += [(f"first record index {it1}", 6, v) for v in ["0", "3", "x"]]
    calls += [(f"entry id of item {j + 1}", 8 + 2 * j, "1-") for j in range(3)]
    calls += [
        (f"inbox index {it1}: KEYS[2] is used as a hash by record index {it1}", 5, "2"),
        ("number of items (ARGV[3]) 6: want an integer 0..5", 2, "6"),
        ("arguments: item 4 starts at ARGV[14], needs 5 ARGV at least", 2, "4"),
    ]
    return calls


@pytest.mark.parametrize(("what", "at", "value"), _bad_run_calls())
async def test_a_run_out_of_contract_is_refused_before_any_write(
    r: AnyRedis, ns: str, what: str, at: int | None, value: object
) -> None:
    inbox, recs, entries = await _claimed(r, ns, 3)
    b = Batch()
    b.ki(inbox)
    b.plain_run(inbox=inbox, fence=1, items=[(recs[i], entries[i], b"S") for i in range(3)])
    args: list[Any] = [TTL_MS, GROUP, b.n, *b.items]
    assert len(args) == 13 and args[3] == "*3" and args[6] == 2
    assert at is not None
    args[at] = value
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: bad {re.escape(what)}"):
        await scripts.call(r, "settle", b.keys, args)
    assert_unchanged(before, await snapshot(r, ns))
    assert await b.run(r) == [1, 1, 1]


async def test_the_runtime_sends_runs_of_plain_successes(r: AnyRedis, ns: str) -> None:
    """settle_call: plain successes of one fence and inbox, their records new to the
    call, go as one run; a change of fence, a record named again and any other item end
    it; a run of one is its 5-slot form."""
    from reach.scripts import delivery

    inbox, recs, entries = await _claimed(r, ns, 7)
    await r.hincrby(recs[3], "fence", 1)  # claimed again: fence 2

    def ok(i: int, fence: int = 1) -> delivery.SettleItem:
        c = delivery.Completion(recs[i], fence, "succeeded", delivery.Mode.DONE, stored=b"S")
        return delivery.SettleItem(inbox, entries[i], c)

    failed = delivery.SettleItem(
        inbox,
        entries[6],
        delivery.Completion(recs[6], 1, "failed", delivery.Mode.DONE, error="no"),
    )
    items = [ok(0), ok(1), ok(2), ok(3, fence=2), ok(4), failed, ok(5)]
    call = delivery.settle_call(items, ttl_ms=TTL_MS)
    a = call.args
    # KEYS: the inbox 1, then records 2.. in the order met
    assert a[3:7] == ("*3", 1, "1", "2") and a[7:13] == (
        b"S",
        entries[0],
        b"S",
        entries[1],
        b"S",
        entries[2],
    )
    assert a[13:18] == ("+5", 2, b"S", "1", entries[3])  # another fence: a run of one
    assert a[18:23] == ("+6", 1, b"S", "1", entries[4])  # ended by the failure after it
    assert a[23] == "7" and a[34:39] == ("+8", 1, b"S", "1", entries[5])
    assert await call.run(r) == [delivery.SettleCode.SETTLED] * 7
    assert await r.xlen(inbox) == 1
    # a record named twice in a call: the second time on its own, in 5 slots
    twice = delivery.settle_call([ok(0), ok(1), ok(0)], ttl_ms=TTL_MS).args
    assert twice[3:7] == ("*2", 1, "1", "2") and twice[11] == "+2"

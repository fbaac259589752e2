"""ask.lua, withdraw_ask.lua and answer.lua: a question is put only by the run holding the
record, and never again once answered (a re-run gets the answer); an answer is stored once,
for the ask waiting, published on the record's channel, and kept; a timeout takes the
question back unless the answer came first; anything out of contract is refused before any
write."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts.asking import (
    ANSWER_MAX_BYTES,
    MAX_ASKS,
    QUESTION_MAX_BYTES,
    answer_call,
    ask_call,
    withdraw_call,
)
from reach.scripts.cancelling import cancel_call
from reach.scripts.codes import AnswerCode, AskCode
from tests.lua.announced import listening
from tests.lua.snapshot import assert_unchanged, snapshot
from tests.lua.test_step import OWNER, TTL_MS, claimed

pytestmark = pytest.mark.anyio


async def ask(r: AnyRedis, rec: str, fence: int, n: int = 1, q: str = "ok?", owner: str = OWNER):  # type: ignore[no-untyped-def]
    return await ask_call(rec, owner=owner, fence=fence, n=n, question=q, until_ms=0).run(r)


async def test_ask_answer_and_a_rerun_that_gets_the_answer(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    rec = Keys(ns).idem("a1")
    fence = await claimed(r, rec)
    ttl = await r.pttl(rec)
    await r.hset(rec, "watched", 1)
    async with listening(redis_url, rec) as heard:
        got = await ask_call(
            rec, owner=OWNER, fence=fence, n=1, question="Refund?", until_ms=1234
        ).run(r)
        assert (got.code, got.new) == (AskCode.ASKED, True)
        assert await heard() == [b"input_required"]
    h = await r.hgetall(rec)
    assert (h[b"status"], h[b"question"], h[b"asking"], h[b"asked"]) == (
        b"input_required",
        b"Refund?",
        b"1",
        b"1",
    )
    assert h[b"ask_until_ms"] == b"1234"
    async with listening(redis_url, rec) as heard:  # answered: published even unwatched
        await r.hdel(rec, "watched")
        reply = await answer_call(rec, answer=b'"yes"').run(r)
        assert (reply.code, reply.n) == (AnswerCode.ANSWERED, 1)
        assert await heard() == [b"running"]
    h = await r.hgetall(rec)
    assert h[b"status"] == b"running" and h[b"a:1"] == b'"yes"'
    assert b"question" not in h and b"asking" not in h and b"ask_until_ms" not in h
    assert 0 < await r.pttl(rec) <= ttl, "the TTL is the claim's"
    # a second answer is refused; the first stays
    again = await answer_call(rec, answer=b'"no"').run(r)
    assert (again.code, again.n) == (AnswerCode.ALREADY, 1)
    assert await r.hget(rec, "a:1") == b'"yes"'
    # the run taken over: the new owner's ask 1 gets the answer, writes nothing
    new = await claimed(r, rec, owner="w-2/inst-b", takeover_from=OWNER)
    before = await r.hgetall(rec)
    got = await ask(r, rec, new, owner="w-2/inst-b")
    assert (got.code, got.answer) == (AskCode.ANSWERED, b'"yes"')
    assert await r.hgetall(rec) == before
    # its ask 2 is a new question
    got = await ask(r, rec, new, n=2, owner="w-2/inst-b")
    assert (got.code, got.new) == (AskCode.ASKED, True)
    assert await r.hget(rec, "asked") == b"2"


async def test_a_rerun_putting_an_unanswered_ask_again_is_no_new_question(
    r: AnyRedis, ns: str
) -> None:
    rec = Keys(ns).idem("a2")
    fence = await claimed(r, rec)
    assert (await ask(r, rec, fence)).new
    new = await claimed(r, rec, owner="w-2/inst-b", takeover_from=OWNER)
    assert await r.hget(rec, "status") == b"running"  # the takeover's claim
    # between the runs, an answer for the ask still waiting is taken
    got = await ask(r, rec, new, owner="w-2/inst-b")
    assert (got.code, got.new) == (AskCode.ASKED, False)
    assert await r.hmget(rec, "status", "asked") == [b"input_required", b"1"]


async def test_withdraw_takes_the_question_back_unless_answered(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    k = Keys(ns)
    rec = k.idem("w1")
    fence = await claimed(r, rec)
    await ask(r, rec, fence)
    await r.hset(rec, "watched", 1)
    async with listening(redis_url, rec) as heard:
        got = await withdraw_call(rec, owner=OWNER, fence=fence, n=1).run(r)
        assert got.code == AskCode.WITHDRAWN
        assert await heard() == [b"running"]
    h = await r.hgetall(rec)
    assert h[b"status"] == b"running" and b"question" not in h and b"asking" not in h
    late = await answer_call(rec, answer=b"1").run(r)
    assert (late.code, late.status) == (AnswerCode.NOT_WAITING, "running")
    # answered first: the answer wins
    rec2 = k.idem("w2")
    fence2 = await claimed(r, rec2)
    await ask(r, rec2, fence2)
    await answer_call(rec2, answer=b"true").run(r)
    got = await withdraw_call(rec2, owner=OWNER, fence=fence2, n=1).run(r)
    assert (got.code, got.answer) == (AskCode.ANSWERED, b"true")


async def test_answers_for_another_ask_and_tasks_waiting_for_nothing(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    assert (await answer_call(k.idem("none"), answer=b"1").run(r)).code == AnswerCode.UNKNOWN
    rec = k.idem("n1")
    fence = await claimed(r, rec)
    idle = await answer_call(rec, answer=b"1").run(r)
    assert (idle.code, idle.status) == (AnswerCode.NOT_WAITING, "running")
    await ask(r, rec, fence, n=1)
    snap = await snapshot(r, ns)
    other = await answer_call(rec, answer=b"1", n=2).run(r)
    assert (other.code, other.status) == (AnswerCode.NOT_WAITING, "input_required")
    assert_unchanged(snap, await snapshot(r, ns))
    assert (await answer_call(rec, answer=b"1", n=1).run(r)).code == AnswerCode.ANSWERED
    assert (await answer_call(rec, answer=b"2", n=1).run(r)).code == AnswerCode.ALREADY
    # cancelled while waiting: no answer taken
    rec3 = k.idem("n3")
    f3 = await claimed(r, rec3)
    await ask(r, rec3, f3)
    await cancel_call(rec3, msg_id="m", error="cancelled", ttl_ms=TTL_MS).run(r)
    gone = await answer_call(rec3, answer=b"1").run(r)
    assert (gone.code, gone.status) == (AnswerCode.NOT_WAITING, "cancelled")


@pytest.mark.parametrize("case", ["stale fence", "other owner", "done", "cancelled", "absent"])
async def test_a_run_that_does_not_hold_the_record_asks_nothing(
    r: AnyRedis, ns: str, case: str
) -> None:
    rec = Keys(ns).idem("f1")
    fence = 1
    owner = OWNER
    if case != "absent":
        fence = await claimed(r, rec)
    if case == "stale fence":
        await claimed(r, rec, owner="w-2/inst-b", takeover_from=OWNER)
        owner = "w-2/inst-b"
    elif case == "other owner":
        owner = "w-9/inst-z"
    elif case == "done":
        await r.hset(rec, mapping={"done": "1", "status": "succeeded"})
    elif case == "cancelled":
        await cancel_call(rec, msg_id="m", error="cancelled", ttl_ms=TTL_MS).run(r)
    snap = await snapshot(r, ns)
    assert (await ask(r, rec, fence, owner=owner)).code == AskCode.FENCED
    got = await withdraw_call(rec, owner=owner, fence=fence, n=1).run(r)
    assert got.code == AskCode.FENCED
    assert_unchanged(snap, await snapshot(r, ns))


async def test_at_most_max_asks(r: AnyRedis, ns: str) -> None:
    rec = Keys(ns).idem("full")
    fence = await claimed(r, rec)
    assert (await ask(r, rec, fence, n=MAX_ASKS)).code == AskCode.ASKED
    before = await r.hgetall(rec)
    over = await ask(r, rec, fence, n=MAX_ASKS + 1)
    assert over.code == AskCode.FULL
    assert await r.hgetall(rec) == before


@pytest.mark.parametrize(
    ("script", "args", "why"),
    [
        ("ask", [OWNER, 1, 1, "q"], r"want 1 KEYS and 5 ARGV, got 1 and 4"),
        ("ask", ["", 1, 1, "q", 0], r"owner \(ARGV\[1\]\): want 1..1024 bytes"),
        ("ask", [OWNER, 0, 1, "q", 0], r"fence \(ARGV\[2\]\) 0"),
        ("ask", [OWNER, 1, 0, "q", 0], r"n \(ARGV\[3\]\) 0"),
        ("ask", [OWNER, 1, "01", "q", 0], r"n \(ARGV\[3\]\) 01"),
        ("ask", [OWNER, 1, 1, "", 0], rf"question \(ARGV\[4\]\): want 1..{QUESTION_MAX_BYTES}"),
        ("ask", [OWNER, 1, 1, "q" * (QUESTION_MAX_BYTES + 1), 0], r"question \(ARGV\[4\]\)"),
        ("ask", [OWNER, 1, 1, "q", -1], r"until_ms \(ARGV\[5\]\) -1"),
        ("withdraw_ask", [OWNER, 1], r"want 1 KEYS and 3 ARGV, got 1 and 2"),
        ("withdraw_ask", [OWNER, 1, "x"], r"n \(ARGV\[3\]\) x"),
        ("answer", [b"1"], r"want 1 KEYS and 2 ARGV, got 1 and 1"),
        ("answer", [b"", ""], rf"answer \(ARGV\[1\]\): want 1..{ANSWER_MAX_BYTES} bytes"),
        ("answer", [b"x" * (ANSWER_MAX_BYTES + 1), ""], r"answer \(ARGV\[1\]\)"),
        ("answer", [b"1", "0"], r"n \(ARGV\[2\]\) 0"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, script: str, args: list[object], why: str
) -> None:
    rec = Keys(ns).idem("bad")
    fence = await claimed(r, rec)
    await ask(r, rec, fence)
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match=why):
        await scripts.call(r, script, [rec], args)
    assert_unchanged(before, await snapshot(r, ns))


@pytest.mark.parametrize("script", ["ask", "withdraw_ask", "answer"])
async def test_a_key_that_is_no_hash_is_refused(r: AnyRedis, ns: str, script: str) -> None:
    key = Keys(ns).idem("str")
    await r.set(key, "x")
    args = {"ask": [OWNER, 1, 1, "q", 0], "withdraw_ask": [OWNER, 1, 1], "answer": [b"1", ""]}
    with pytest.raises(ResponseError, match="holds a string, want a hash"):
        await scripts.call(r, script, [key], args[script])
    assert await r.get(key) == b"x"


async def test_start_confirms_a_claim_made_at_send_whose_handler_asked(
    r: AnyRedis, ns: str
) -> None:
    """A record claimed at send whose handler asked before start.lua ran (and, the
    second, was answered too): its run counted once, by ask.lua, its status kept."""
    from reach.scripts import delivery, inbox
    from reach.scripts.delivery import StartItem

    k = Keys(ns)
    m = inbox.Message(data=b"env", capability="cap", attempt=1, msg_id="s1", key="s1")
    call = inbox.send_call(
        k, m, agent_id="w-1", priority="normal", ttl_ms=TTL_MS, claim_for=OWNER, claim_lease_ms=9000
    )
    await call.run(r)
    rec = k.idem("s1")
    assert await r.hget(rec, "runs") is None  # claimed at send: not counted yet (absent: 0)
    await ask(r, rec, 1)
    # the asking run counted by ask.lua itself (a run killed after asking is never left
    # uncounted); start.lua then leaves the record as it is
    assert await r.hmget(rec, "status", "runs") == [b"input_required", b"1"]
    started = delivery.start_call([StartItem(rec, 60_000, 1)], owner=OWNER, ttl_ms=TTL_MS)
    assert await started.run(r) == [0], "counted once"
    assert await r.hmget(rec, "status", "runs") == [b"input_required", b"1"]

    m2 = inbox.Message(data=b"env", capability="cap", attempt=1, msg_id="s2", key="s2")
    call = inbox.send_call(
        k,
        m2,
        agent_id="w-1",
        priority="normal",
        ttl_ms=TTL_MS,
        claim_for=OWNER,
        claim_lease_ms=9000,
    )
    await call.run(r)
    rec2 = k.idem("s2")
    await ask(r, rec2, 1)
    await answer_call(rec2, answer=b"1").run(r)  # answered within start.lua's 10 ms
    started = delivery.start_call([StartItem(rec2, 60_000, 1)], owner=OWNER, ttl_ms=TTL_MS)
    assert await started.run(r) == [0]  # counted by the ask already
    assert await r.hmget(rec2, "status", "runs") == [b"running", b"1"]

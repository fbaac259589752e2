"""The typed script calls: what each encodes into KEYS and ARGV, and how each reads its
reply (no Redis here: tests/lua/test_typed_calls.py runs them)."""

from __future__ import annotations

from typing import Any

import pytest

from reach import limits, scripts, splits
from reach.keys import Keys
from reach.scripts import (
    agents,
    asking,
    cancelling,
    codes,
    delivery,
    inbox,
    keeping,
    scheduling,
    sessions,
    steps,
    watching,
)
from reach.scripts.delivery import (
    ClaimItem,
    Completion,
    DeadLetter,
    Delayed,
    Mode,
    SettleItem,
)
from reach.tasks import MALFORMED_CAP, dead_letter_op, raw_dead_letter_op

K = Keys("ns")


R = agents.RegistryScripts(K, events_maxlen=1000)


def test_every_script_has_a_typed_call() -> None:
    made = {
        R.register(
            "a",
            instance_id="i",
            version=1,
            weight=1,
            capabilities=["c"],
            metadata_json="{}",
            lease_ms=1,
            evict_after_ms=1,
        ).script,
        R.heartbeat("a", instance_id="i", version=1, queue_depth=0, inflight=0).script,
        R.heartbeat_many([agents.Beat("a", "i", 1)]).script,
        R.deregister("a").script,
        R.mark_ready("a", instance_id="i", ready=True).script,
        R.drain("a").script,
        R.sweep(owner="o", lock_ms=0, shadow_ttl_ms=1, batch=1).script,
        R.count_agents(sample=1).script,
        R.server_time().script,
        delivery.fetch(K, agent_id="a", n=1, keep_normal=0, keep_low=0).script,
        delivery.claim_call([], owner="o", ttl_ms=1, agent_id="a").script,
        delivery.start_call([], owner="o", ttl_ms=1).script,
        delivery.renew_call([], owner="o").script,
        limits.take_call(K, "c", limits.RateLimit(1, 1), 1).script,
        splits.pin_call(K, "s", "c", chosen="1", split=splits.Split.parse("1=1")).script,
        delivery.complete_call([], ttl_ms=1).script,
        delivery.settle_call([], ttl_ms=1).script,
        inbox.send_call(K, _msg(), agent_id="a", priority="high", ttl_ms=1).script,
        inbox.enqueue_call(K, b"", agent_id="a", priority="high", max_queue=1).script,
        inbox.drop_inbox(K, agent_id="a").script,
        inbox.mark_pending_call(K, _msg(), ttl_ms=1).script,
        inbox.reroute_call(
            K, record="r", from_agent="a", entry_id="1-0", to_agent="b", priority="high"
        ).script,
    }
    made.add(delivery.give_up("k", status="dead", error="", ttl_ms=1).script)
    made.add(cancelling.cancel_call("k", msg_id="m", error="", ttl_ms=1).script)
    made.add(steps.step_call("k", owner="o", fence=1, name="n", result=b"\xc0").script)
    made.add(watching.progress_call("k", fence=1, fraction="0", note="").script)
    made.add(watching.watch_call("k").script)
    made.add(
        keeping.keep_call("k", "c", [(0, 1, b"e")], max_chunks=1, max_bytes=1, keep_ms=1).script
    )
    made |= {
        asking.ask_call("k", owner="o", fence=1, n=1, question="q", until_ms=0).script,
        asking.withdraw_call("k", owner="o", fence=1, n=1).script,
        asking.answer_call("k", answer=b"1").script,
    }
    made |= {
        scheduling.mark_scheduled_call("k", capability="c", msg_id="m", due_ms=1, ttl_ms=1).script,
        scheduling.schedule_call(K, msg_id="m", due_ms=1, envelope=b"e").script,
        scheduling.take_due_call(K, limit=1, lease_ms=1).script,
        scheduling.unschedule_call(K, ["m"]).script,
    }
    made |= {
        sessions.write_call(K, "s", ["C"], ttl_ms=1).script,
        sessions.read_values_call(K, "s").script,
    }
    assert made == set(scripts.names())


# -- registry -------------------------------------------------------------------------------
def test_register_encodes_the_header_layout() -> None:
    c = R.register(
        "a1",
        instance_id="i1",
        version=7,
        weight=2,
        capabilities=["c", "d.e"],
        metadata_json='{"x":1}',
        lease_ms=100,
        evict_after_ms=200,
        card_json="",
        ready=True,
        max_queue=5,
        slots=8,
    )
    assert c.keys == (K.agents, K.agent("a1"), K.caps, K.events, K.cap_prefix, K.agent_prefix)
    assert c.args == ("a1", "i1", 7, "2.0", "c,d.e", '{"x":1}', 100, 200, 1000, "", "1", 5, 8, 2)
    # ..., max_queue, slots, protocol
    assert c.op() == ("EVALSHA", scripts.script("register").sha, 6, *c.keys, *c.args)


@pytest.mark.parametrize(
    ("reply", "want"),
    [
        ([1, 1700000000000], agents.Registration(codes.RegisterCode.NEW, now_ms=1700000000000)),
        ([2, b"5"], agents.Registration(codes.RegisterCode.REPLACED, now_ms=5)),
        (
            [-1, b"1700000000000001"],
            agents.Registration(codes.RegisterCode.STALE, 0, "1700000000000001"),
        ),
    ],
)
def test_register_reply(reply: list[Any], want: agents.Registration) -> None:
    assert agents.decode_registration(reply) == want


def test_heartbeat_and_the_single_code_replies() -> None:
    hb = R.heartbeat(
        "a", instance_id="i", version=3, queue_depth=4, inflight=5, slots=6, handler_us=7
    )
    assert hb.keys == (K.agents, K.agent("a"), K.events)
    assert hb.args == ("a", "i", 3, 4, 5, 6, 7, 1000)
    assert hb.decode([2, 1]) == agents.Heartbeat(codes.HeartbeatCode.RECOVERED, draining=True)
    assert hb.decode([-1, 0]) == agents.Heartbeat(codes.HeartbeatCode.STALE, draining=False)
    d = R.drain("a")
    assert (d.keys, d.args) == ((K.agent("a"), K.events), ("a", 1000, ""))
    assert (
        d.decode(0) is codes.DrainCode.NOT_FOUND and d.decode(2) is codes.DrainCode.ALREADY_DRAINING
    )
    dr = R.deregister("a", instance_id="i")
    assert dr.keys[6:] == (K.reroute, K.left_of(0))  # listed for the sweeper, in one step
    assert (
        dr.keys[:6]
        == R.register(
            "a",
            instance_id="i",
            version=1,
            weight=1,
            capabilities=["c"],
            metadata_json="{}",
            lease_ms=1,
            evict_after_ms=1,
        ).keys
    )
    assert dr.args == ("a", "i", 1000) and dr.decode(-1) is codes.DeregisterCode.OTHER_INSTANCE
    m = R.mark_ready("a", instance_id="i", ready=False)
    assert m.args == ("a", "i", "0", 1000) and m.decode(1) is codes.MarkReadyCode.SET
    with pytest.raises(ValueError):
        m.decode(7)  # not a code of mark_ready.lua


def test_server_time_is_routed_by_the_registry_and_reads_times_reply() -> None:
    c = R.server_time()
    assert (c.keys, c.args) == ((K.agents,), ())  # shard 0's slot: the registry's node
    sharded = agents.RegistryScripts(Keys("ns", 16), events_maxlen=1000).server_time()
    assert sharded.keys == (Keys("ns", 16).agents_of(0),)
    assert c.op() == ("EVALSHA", scripts.script("server_time").sha, 1, K.agents)
    assert c.decode([b"1800000000", b"250000"]) == (1_800_000_000, 250_000)


def test_sweep_reply() -> None:
    c = R.sweep(owner="o", lock_ms=10, shadow_ttl_ms=20, batch=30)
    assert c.keys[3] == K.sweeper_lock and c.keys[6] == K.reroute
    assert c.args == ("o", 10, 20, 30, 1000)
    assert c.decode([-1]) == agents.Swept(locked=True)
    assert c.decode([5, 1, 2, 3, b"a", b"b"]) == agents.Swept(
        due=5, probation=1, deleted=3, evicted=(b"a", b"b")
    )


# -- delivery -------------------------------------------------------------------------------
def test_fetch_pairs_entries_with_their_stream() -> None:
    c = delivery.fetch(K, agent_id="a", n=10, keep_normal=1, keep_low=1)
    assert c.keys == tuple(K.inboxes("a"))
    assert c.args == ("reach", "a", 10, 1, 1)
    entry = [b"1-0", [b"e", b"x"]]
    got = c.decode([[], [entry], [], 0, 1])
    assert got.normal_waiting is False and got.low_waiting is True
    assert got.got == [(K.inbox("a", "normal"), [entry])]
    assert [k for k, _ in got.inboxes] == K.inboxes("a")


def test_claim_encodes_a_head_and_three_argv_per_key() -> None:
    items = [ClaimItem("k1", 1000, "m1"), ClaimItem("k2", 2000, "m2", takeover_from="b/j")]
    c = delivery.claim_call(items, owner="a/i", ttl_ms=99, agent_id="a")
    assert c.keys == ("k1", "k2")
    assert c.args == ("a/i", 99, "a", 3, 1000, "m1", "", 2000, "m2", "b/j")
    replay = [2, b"r", b"succeeded", b"a", b"m0"]
    assert c.decode([[1, 7], replay, [3, b"b/j"], [5, 4, 3]]) == [
        delivery.Claimed(codes.ClaimCode.RUN, fence=7),
        delivery.Claimed(
            codes.ClaimCode.REPLAY, reply=b"r", status="succeeded", agent_id="a", msg_id="m0"
        ),
        delivery.Claimed(codes.ClaimCode.BUSY, owner="b/j"),
        delivery.Claimed(codes.ClaimCode.POISONED, runs=4, takeovers=3),
    ]
    assert delivery.decode_claimed([2, b"", b"", b"", b""]).reply == b""
    assert delivery.decode_claimed([3, b"\xff/x"]).owner == "\ufffd/x"  # untrusted bytes


def test_give_up() -> None:
    c = delivery.give_up("k", status="expired", error="late", ttl_ms=9)
    assert (c.keys, c.args) == (("k",), ("expired", "late", 9))
    assert c.decode(None) == delivery.GivenUp(done=False)
    assert c.decode([b"R", b"succeeded", b"a", b"m0"]) == delivery.GivenUp(
        done=True, reply=b"R", status="succeeded", agent_id="a", msg_id="m0"
    )
    assert c.decode([b"", b"", b"", b""]) == delivery.GivenUp(done=True, reply=b"")


def test_renew_encodes_the_owner_then_lease_and_fence_per_key() -> None:
    items = [delivery.RenewItem("k1", 1000, 3), delivery.RenewItem("k2", 2000, 1)]
    c = delivery.renew_call(items, owner="a/i")
    assert (c.keys, c.args) == (("k1", "k2"), ("a/i", 1000, 3, 2000, 1))
    assert c.decode([1, 0]) == [True, False]


def test_cancel_call_names_the_notices_stream_only_when_given() -> None:
    c = cancelling.cancel_call("k", msg_id="m", error="by me", ttl_ms=9)
    assert (c.keys, c.args) == (("k",), ("m", "by me", 9, cancelling.CANCELS_MAXLEN))
    c = cancelling.cancel_call("k", msg_id="m", error="x" * 3000, ttl_ms=9, notices="n", maxlen=5)
    assert c.keys == ("k", "n") and c.args[1] == "x" * 2000 and c.args[3] == 5
    assert c.decode([1, b"running"]) == cancelling.CancelAnswer(
        codes.CancelCode.CANCELLED, "running"
    )
    assert c.decode([-1, b""]).code is codes.CancelCode.UNKNOWN
    with pytest.raises(ValueError):
        c.decode([4, b"x"])  # a code cancel.lua never answers

    done = Completion("k1", 3, "succeeded", Mode.DONE)
    again = Completion("k2", 4, "retrying", "release", "boom")
    c = delivery.complete_call([(done, b"r1"), (again, b"r2")], ttl_ms=50)
    assert c.keys == ("k1", "k2")
    assert c.args == (50, 3, "succeeded", b"r1", "done", "", 4, "retrying", "", "release", "boom")
    assert c.decode([1, 0]) == [codes.SettleCode.SETTLED, codes.SettleCode.FENCED]


LETTER = DeadLetter("dlq", 10, "max_attempts", "boom", "ValueError", 3, "a", "m1", "cap", 99, b"E")


def test_step_encodes_owner_fence_name_result_and_reads_each_answer() -> None:
    c = steps.step_call("rec", owner="a/i", fence=7, name="charge", result=b"\x01")
    assert (c.keys, c.args) == (("rec",), ("a/i", 7, "charge", b"\x01"))
    assert c.decode([1, 3]) == steps.StepAnswer(codes.StepCode.JOURNALED, count=3)
    assert c.decode([2, b"\x02"]) == steps.StepAnswer(codes.StepCode.KEPT, stored=b"\x02")
    assert c.decode([3, 100]) == steps.StepAnswer(codes.StepCode.FULL, count=100)
    assert c.decode([0, b""]) == steps.StepAnswer(codes.StepCode.FENCED)


def test_a_dead_letter_is_the_xadd_of_reach_tasks() -> None:
    op = dead_letter_op(
        K,
        capability="cap",
        reason="max_attempts",
        data=b"E",
        error="boom",
        error_type="ValueError",
        attempts=3,
        agent_id="a",
        msg_id="m1",
        maxlen=10,
    )
    letter = DeadLetter.of_op(op)
    assert letter.op() == op  # the very command reach.tasks builds: byte for byte
    assert (letter.stream, letter.maxlen, letter.env) == (K.dlq("cap"), 10, b"E")
    assert DeadLetter.of_op(raw_dead_letter_op(K, reason="malformed", data=b"x", error="e")).op()[
        :2
    ] == ("XADD", K.dlq(MALFORMED_CAP))
    with pytest.raises(ValueError, match="not a dead letter"):
        DeadLetter.of_op(("ZADD", "delayed", 1, b"x"))
    assert Delayed("delayed", 12, b"env").op() == ("ZADD", "delayed", 12, b"env")


def test_settle_indexes_each_key_once_in_order_of_first_use() -> None:
    items = [
        SettleItem(
            "in:1",
            b"1-0",
            Completion("rec", 2, "succeeded", Mode.DONE, stored=b"S"),
            reply=b"R",
            reply_stream="rep",
            follow_up=LETTER,
        ),
        SettleItem("in:1", b"2-0", follow_up=Delayed("delayed", 12, b"env")),
        SettleItem("", "3-0", reply=b"", reply_stream="rep"),
    ]
    c = delivery.settle_call(items, ttl_ms=60, group="g")
    assert c.keys == ("rec", "rep", "in:1", "dlq", "delayed")
    # Key indexes and kinds go as the strings Redis receives either way (no int to format
    # at every pack).
    assert c.args == (
        *(60, "g", 3),
        *("1", 2, "succeeded", b"S", "done", "", b"R", "2", "3", b"1-0", "1"),
        *("4", 10, "max_attempts", "boom", "ValueError", 3, "a", "m1", "cap", 99, b"E"),
        # No reply stream: no reply bytes either (the script reads them only with one).
        *("0", "", "", "", "", "", "", "0", "3", b"2-0", "2"),
        *("5", 12, b"env"),
        *("0", "", "", "", "", "", b"", "2", "0", "3-0", "0"),
    )
    assert c.decode([1, 0, 1]) == [
        codes.SettleCode.SETTLED,
        codes.SettleCode.FENCED,
        codes.SettleCode.SETTLED,
    ]


# -- inbox ----------------------------------------------------------------------------------
def _msg(idempotency_key: str = "") -> inbox.Message:
    return inbox.Message(
        data=b"env",
        capability="cap",
        attempt=2,
        msg_id="m1",
        key=idempotency_key or "m1",
        idempotency_key=idempotency_key,
    )


def test_send_takes_the_three_inboxes_only_with_a_bound() -> None:
    c = inbox.send_call(K, _msg("ik"), agent_id="a", priority="low", ttl_ms=70)
    assert c.keys == (K.inbox("a", "low"), K.idem("ik"), K.task("m1"))
    assert c.args == (b"env", "cap", 2, "m1", "ik", 70, 0)
    bounded = inbox.send_call(K, _msg(), agent_id="a", priority="low", ttl_ms=70, max_queue=10**20)
    assert bounded.keys[3:] == tuple(K.inboxes("a"))
    assert bounded.args[-1] == inbox.MAX_BOUND
    assert c.decode(b"1-0") == inbox.Sent(entry_id="1-0")
    refused = c.decode(12)
    assert refused.refused and refused.depth == 12


def test_enqueue_and_the_pending_record_commands() -> None:
    c = inbox.enqueue_call(K, b"env", agent_id="a", priority="high", max_queue=3)
    assert c.keys == (K.inbox("a", "high"), *K.inboxes("a"))
    assert c.args == (b"env", 3)
    mark = inbox.mark_pending_call(K, _msg(), ttl_ms=5)
    assert (mark.keys, mark.args) == ((K.idem("m1"),), ("cap", 2, "m1", 5))
    assert mark.decode(1) is True and mark.decode(0) is False


def test_drop_inbox() -> None:
    c = inbox.drop_inbox(K, agent_id="a")
    assert (c.keys, c.args) == (tuple(K.inboxes("a")), ())
    assert c.decode(0) is codes.DropInboxCode.KEPT

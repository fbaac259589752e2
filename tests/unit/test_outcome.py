"""What a handler's result or exception means for its message (reach._worker.outcome):
succeeded, rejected, retried with backoff, dead-lettered, expired - and what settling each
one writes. Pure functions: no Redis, no worker."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import reach
from reach._worker import outcome as oc
from reach._worker.items import Delivery
from reach.envelope import Envelope, decode_envelope, decode_payload, decode_reply
from reach.keys import Keys
from reach.outcomes import Outcome
from reach.scripts.delivery import DeadLetter, Delayed

NOW = 1_700_000_000_000
KEYS = Keys("t")


def env(**kw: Any) -> Envelope:
    kw.setdefault("msg_id", "m-1")
    kw.setdefault("capability", "x.y")
    return Envelope(**kw)


def raised(
    e: Envelope, exc: BaseException, *, timed_out: bool = False, backoff_ms: int = 500
) -> Outcome:
    return oc.raised(e, exc, timed_out=timed_out, now_ms=NOW, backoff_ms=backoff_ms)


# -- deciding ------------------------------------------------------------------------------
def test_a_returned_value_succeeds_with_its_encoded_result() -> None:
    o = oc.returned({"a": [1, 2]})
    assert (o.status, o.reason, o.error, o.dead_letter) == ("succeeded", "", "", False)
    assert o.result is not None and decode_payload(o.result) == {"a": [1, 2]}


def test_a_result_that_cannot_be_encoded_is_a_dead_letter() -> None:
    o = oc.returned(object())
    assert (o.status, o.reason, o.error_type, o.dead_letter) == (
        "dead",
        "bad_result",
        "EncodeError",
        True,
    )


def test_reject_is_dead_at_once_whatever_the_attempts_left() -> None:
    o = raised(env(attempt=1, max_attempts=5), reach.Reject("not for me"))
    assert (o.status, o.reason, o.error, o.error_type) == (
        "dead",
        "rejected",
        "not for me",
        "Reject",
    )
    assert raised(env(), reach.Reject()).error == "rejected"  # a message even when none given


def test_an_error_with_attempts_left_is_retried_after_the_backoff() -> None:
    o = raised(env(attempt=1, max_attempts=3), ValueError("flaky"), backoff_ms=700)
    assert (o.status, o.reason, o.error, o.error_type) == ("retrying", "", "flaky", "ValueError")
    assert o.retry_delay_ms == 700 and not o.dead_letter


def test_an_error_on_the_last_attempt_is_dead_max_attempts() -> None:
    o = raised(env(attempt=3, max_attempts=3), ValueError("still down"))
    assert (o.status, o.reason, o.error, o.error_type) == (
        "dead",
        "max_attempts",
        "still down",
        "ValueError",
    )


def test_no_retry_past_the_deadline_the_message_expires() -> None:
    e = env(deadline_ms=NOW + 400)
    o = raised(e, ValueError("boom"), backoff_ms=400)
    assert (o.status, o.reason, o.error_type) == ("expired", "expired", "ValueError")
    assert o.error == "no time left for a retry after: boom" and o.dead_letter
    assert raised(e, ValueError("boom"), backoff_ms=399).status == "retrying"


def test_running_past_the_deadline_is_a_timeout() -> None:
    o = raised(env(deadline_ms=NOW - 1), TimeoutError(), timed_out=True)
    assert (o.status, o.reason, o.error_type) == ("expired", "timeout", "DeadlineExceeded")


def test_checks_before_the_handler_runs() -> None:
    assert oc.expired_before_start(env(), NOW) is None  # no deadline
    assert oc.expired_before_start(env(deadline_ms=NOW + 1), NOW) is None
    o = oc.expired_before_start(env(deadline_ms=NOW), NOW)
    assert o is not None and (o.status, o.reason) == ("expired", "expired")
    o = oc.no_handler(env(capability="a.b"), "w-1")
    assert (o.status, o.reason, o.error) == (
        "dead",
        "no_handler",
        "agent w-1 has no handler for a.b",
    )
    o = oc.invalid_payload(msgspec.ValidationError("Expected `int`"))
    assert (o.status, o.reason, o.error_type) == ("dead", "invalid_payload", "ValidationError")


def test_backoff_doubles_per_attempt_up_to_the_cap() -> None:
    ms = [oc.backoff_ms(a, base_s=0.2, max_s=30.0) for a in (1, 2, 3, 4)]
    assert ms == [200, 400, 800, 1600]
    assert oc.backoff_ms(50, base_s=0.2, max_s=30.0) == 30_000
    assert oc.backoff_ms(10**6, base_s=0.2, max_s=30.0) == 30_000  # no float overflow
    assert oc.backoff_ms(1, base_s=0.2, max_s=30.0, jitter=1.5) == 300


# -- what settling writes ---------------------------------------------------------------
def delivery(e: Envelope, fence: int = 7) -> Delivery:
    return Delivery(stream="s", entry_id=b"1-0", env=e, fence=fence)


def apply(it: Delivery, o: Outcome) -> None:
    oc.apply(it, o, keys=KEYS, agent_id="w-1", dlq_maxlen=100, now_ms=NOW)


def test_success_completes_done_and_replies() -> None:
    e = env(reply_to="c-1")
    it = delivery(e)
    apply(it, oc.returned(42))
    assert it.complete is not None
    assert (it.complete.key, it.complete.fence, it.complete.status, it.complete.mode) == (
        KEYS.idem("m-1"),
        7,
        "succeeded",
        "done",
    )
    assert it.reply_key == KEYS.replies("c-1") and it.follow_up is None
    reply = decode_reply(it.reply)
    assert (reply.status, reply.agent_id, decode_payload(reply.result)) == ("succeeded", "w-1", 42)
    assert (it.outcome, it.reason) == ("succeeded", "")


def test_a_retry_releases_the_key_keeps_the_caller_waiting_and_schedules_the_next_attempt() -> None:
    e = env(reply_to="c-1", attempt=1)
    it = delivery(e)
    apply(it, raised(e, ValueError("flaky"), backoff_ms=250))
    assert it.complete is not None and (it.complete.status, it.complete.mode) == (
        "retrying",
        "release",
    )
    assert it.reply_key == ""  # the caller waits for the last attempt's reply
    assert isinstance(it.follow_up, Delayed)
    assert (it.follow_up.zset, it.follow_up.due_ms) == (KEYS.delayed, NOW + 250)
    nxt = decode_envelope(it.follow_up.envelope)
    assert (nxt.msg_id, nxt.attempt, nxt.avoid) == ("m-1", 2, "w-1")
    assert it.outcome == "retrying"


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        (Outcome("dead", "max_attempts", "down", "ValueError"), "max_attempts"),
        (Outcome("expired", "timeout", "late", "DeadlineExceeded"), "timeout"),
    ],
)
def test_a_dead_letter_is_filed_and_the_caller_told(outcome: Outcome, reason: str) -> None:
    e = env(reply_to="c-1", attempt=3)
    it = delivery(e)
    apply(it, outcome)
    assert it.complete is not None and it.complete.mode == "release"
    assert it.reply_key == KEYS.replies("c-1")
    assert isinstance(it.follow_up, DeadLetter)
    letter = it.follow_up.op()
    assert letter[:6] == ("XADD", KEYS.dlq("x.y"), "MAXLEN", "~", 100, "*")
    fields = dict(zip(letter[6::2], letter[7::2], strict=True))
    assert (fields["reason"], fields["attempts"], fields["agent_id"]) == (reason, 3, "w-1")
    assert decode_envelope(fields["env"]).msg_id == "m-1"
    assert (it.outcome, it.reason) == (outcome.status, reason)


def test_nobody_waiting_means_no_reply_stream() -> None:
    it = delivery(env())
    apply(it, oc.returned(None))
    # No reply to publish (nor bytes encoded for one); the record still stores its short
    # form for replays.
    assert (it.reply_key, it.reply) == ("", b"")
    assert it.complete is not None and it.complete.stored


# -- reach.Retry --------------------------------------------------------------------------
def test_retry_with_a_delay_waits_that_long_instead_of_the_backoff() -> None:
    o = raised(env(attempt=1), reach.Retry("rate limited", delay_s=2.5), backoff_ms=100)
    assert (o.status, o.retry_delay_ms, o.error, o.error_type) == (
        "retrying",
        2500,
        "rate limited",
        "Retry",
    )
    o = raised(env(attempt=1), reach.Retry(), backoff_ms=100)  # no delay: the usual backoff
    assert (o.status, o.retry_delay_ms, o.error) == (
        "retrying",
        100,
        "the handler asked for a retry",
    )


def test_retry_counts_as_an_attempt_and_respects_the_deadline() -> None:
    o = raised(env(attempt=3, max_attempts=3), reach.Retry(delay_s=1))
    assert (o.status, o.reason, o.error_type) == ("dead", "max_attempts", "Retry")
    o = raised(env(deadline_ms=NOW + 2000), reach.Retry(delay_s=2), backoff_ms=1)
    assert (o.status, o.reason) == ("expired", "expired")
    assert raised(env(deadline_ms=NOW + 2001), reach.Retry(delay_s=2)).status == "retrying"


@pytest.mark.parametrize("delay_s", [-1.0, float("nan"), float("inf"), 8 * 86_400.0])
def test_a_retry_delay_out_of_range_is_refused(delay_s: float) -> None:
    with pytest.raises(reach.ConfigError, match="delay_s"):
        reach.Retry(delay_s=delay_s)

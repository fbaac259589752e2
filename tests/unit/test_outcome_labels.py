"""The label vocabularies of reach.outcomes (Settled, HandlerResult, RequestOutcome) keep
the strings reach has always exported: metric label values and hook arguments must not
change when code compares with enum members instead of literals."""

from __future__ import annotations

import asyncio
import json

from prometheus_client import CollectorRegistry, Counter, generate_latest

from reach import metrics
from reach.card import A2ATaskState, a2a_state_wire, a2a_task_state
from reach.errors import DeadlineExceeded, NoAgentAvailable, Overloaded, Rejected, RemoteError
from reach.outcomes import (
    DEAD_LETTERED,
    DeadReason,
    HandlerResult,
    Outcome,
    RequestOutcome,
    Settled,
    Status,
)


def test_values_are_the_strings_on_the_wire() -> None:
    assert [s.value for s in Settled] == [
        "succeeded",
        "retrying",
        "dead",
        "expired",
        "replayed",
        "parked",
        "malformed",
        "gone",
        "acked",
    ]
    assert {h.value for h in HandlerResult} == {
        "succeeded",
        "timeout",
        "rejected",
        "cancelled",
        "error",
    }
    assert {r.value for r in RequestOutcome} == {
        "succeeded",
        "remote_error",
        "rejected",
        "no_agent",
        "deadline",
        "cancelled",
        "error",
    }


def test_settled_shares_the_status_members() -> None:
    for name in ("SUCCEEDED", "RETRYING", "DEAD", "EXPIRED"):
        assert Settled[name] == Status[name]
        assert hash(Settled[name]) == hash(Status[name].value)
    assert Settled.MALFORMED == DeadReason.MALFORMED
    assert {"dead", "expired", "malformed"} == DEAD_LETTERED


def test_handler_outcome_labels() -> None:
    def label(status: Status, reason: str = "") -> str:
        return metrics.handler_outcome(Outcome(status, reason))

    assert label(Status.SUCCEEDED) == "succeeded"
    assert label(Status.DEAD, DeadReason.BAD_RESULT) == "succeeded"
    assert label(Status.EXPIRED, DeadReason.TIMEOUT) == "timeout"
    assert label(Status.DEAD, DeadReason.REJECTED) == "rejected"
    assert label(Status.DEAD, DeadReason.REFUSED_BY_GUARD) == "rejected"  # not an error
    assert label(Status.DEAD, DeadReason.MAX_ATTEMPTS) == "error"
    assert label(Status.RETRYING) == "error"
    assert label(Status.DEAD, "max_attempts") == "error"  # a plain str read back from Redis


def test_client_outcome_labels() -> None:
    assert metrics.client_outcome(None) == "succeeded"
    assert metrics.client_outcome(RemoteError("x")) == "remote_error"
    assert metrics.client_outcome(Rejected("x")) == "rejected"
    assert metrics.client_outcome(Overloaded("x")) == "no_agent"
    assert metrics.client_outcome(NoAgentAvailable("x")) == "no_agent"
    assert metrics.client_outcome(DeadlineExceeded("x")) == "deadline"
    assert metrics.client_outcome(asyncio.CancelledError()) == "cancelled"
    assert metrics.client_outcome(KeyError("x")) == "error"


def test_enum_labels_export_as_their_strings() -> None:
    registry = CollectorRegistry()
    c = Counter("probe_outcomes", "probe", ["outcome"], registry=registry)
    c.labels(Settled.DEAD).inc()
    c.labels("dead").inc()  # the same child as the member
    c.labels(HandlerResult.ERROR).inc()
    text = generate_latest(registry).decode()
    assert 'probe_outcomes_total{outcome="dead"} 2.0' in text
    assert 'probe_outcomes_total{outcome="error"} 1.0' in text
    assert "Settled" not in text and "HandlerResult" not in text


def test_a2a_task_states_are_the_spec_s() -> None:
    # The short forms of A2A 1.0's TaskState (TASK_STATE_<NAME> on the JSON wire).
    assert {s.value for s in A2ATaskState} == {
        "unspecified",
        "submitted",
        "working",
        "completed",
        "failed",
        "canceled",
        "input-required",
        "rejected",
        "auth-required",
    }
    assert a2a_state_wire(A2ATaskState.INPUT_REQUIRED) == "TASK_STATE_INPUT_REQUIRED"
    assert a2a_task_state(Status.DEAD, DeadReason.TOO_LARGE) == "rejected"
    assert json.dumps(a2a_task_state("dead", "max_attempts")) == '"failed"'

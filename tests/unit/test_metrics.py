"""reach.metrics: series, labels, cardinality bound, breaker listener, the HTTP endpoint.

The metrics live in prometheus-client's process-wide registry, so every test reads
deltas (or uses capability names no other test uses).
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from reach import metrics
from reach.breaker import Breakers


def val(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def cap() -> str:
    return f"test.m{uuid.uuid4().hex[:8]}"


def test_sent_and_delivered_by_capability_and_priority() -> None:
    c = cap()
    metrics.message_sent(c, "high")
    metrics.message_sent(c, "high")
    metrics.message_sent(c, "low")
    metrics.delivered(c, "high")
    assert val("reach_messages_sent_total", capability=c, priority="high") == 2
    assert val("reach_messages_sent_total", capability=c, priority="low") == 1
    assert val("reach_messages_delivered_total", capability=c, priority="high") == 1


def test_settled_outcomes_count_dead_letters_expiries_and_retries() -> None:
    c = cap()
    metrics.settled(c, "succeeded")
    metrics.settled(c, "dead", "rejected")
    metrics.settled(c, "expired", "timeout")
    metrics.settled(c, "retrying")
    metrics.settled(c, "replayed")
    for outcome in ("succeeded", "dead", "expired", "retrying", "replayed"):
        assert val("reach_messages_acked_total", capability=c, outcome=outcome) == 1
    assert val("reach_messages_dead_lettered_total", capability=c, reason="rejected") == 1
    assert val("reach_messages_dead_lettered_total", capability=c, reason="timeout") == 1
    assert val("reach_messages_expired_total", capability=c, reason="timeout") == 1
    assert val("reach_messages_retried_total", capability=c) == 1
    # a success or a replay is no dead letter
    assert val("reach_messages_dead_lettered_total", capability=c, reason="succeeded") == 0
    metrics.expired(c)  # outside a handler: waited past its deadline for a retry
    assert val("reach_messages_expired_total", capability=c, reason="expired") == 1
    assert val("reach_messages_dead_lettered_total", capability=c, reason="expired") == 1


def test_histograms_and_replays_and_fences() -> None:
    c = cap()
    before = val("reach_queue_wait_seconds_count", priority="low")
    metrics.handler_done(c, "succeeded", 0.02)
    metrics.handler_done(c, "error", 1.5)
    metrics.queue_wait("low", 0.3)
    metrics.queue_wait("low", -1)  # clock skew between hosts: clamped to 0
    metrics.replayed(c)
    metrics.fenced(c)
    h = "reach_handler_duration_seconds"
    assert val(f"{h}_count", capability=c, outcome="succeeded", version="") == 1
    assert val(f"{h}_sum", capability=c, outcome="error", version="") == 1.5
    assert val(f"{h}_bucket", capability=c, outcome="error", version="", le="2.5") == 1
    assert val("reach_queue_wait_seconds_count", priority="low") == before + 2
    assert val("reach_idempotent_replays_total", capability=c) == 1
    assert val("reach_messages_fenced_total", capability=c) == 1


def test_client_reply_and_outcome_names() -> None:
    from reach.errors import DeadlineExceeded, NoAgentAvailable, Rejected, RemoteError

    c = cap()
    metrics.client_reply(c, metrics.client_outcome(None), 0.1)
    metrics.client_reply(c, metrics.client_outcome(DeadlineExceeded("x")), 2.0)
    assert val("reach_client_requests_total", capability=c, outcome="succeeded") == 1
    assert val("reach_client_request_duration_seconds_count", capability=c, outcome="deadline") == 1
    assert metrics.client_outcome(RemoteError("x", type="E")) == "remote_error"
    assert metrics.client_outcome(Rejected("x", reason="rejected")) == "rejected"
    assert metrics.client_outcome(NoAgentAvailable("x")) == "no_agent"
    assert metrics.client_outcome(ValueError("x")) == "error"


@pytest.fixture
def few_caps(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(metrics, "_caps", set())
    monkeypatch.setattr(metrics, "MAX_CAPABILITIES", 2)
    yield


def test_capability_labels_are_bounded(few_caps: None) -> None:
    a, b, c = cap(), cap(), cap()
    before = val("reach_messages_sent_total", capability="_other", priority="normal")
    for x in (a, b, c, c):
        metrics.message_sent(x, "normal")
    assert val("reach_messages_sent_total", capability=a, priority="normal") == 1
    assert val("reach_messages_sent_total", capability=b, priority="normal") == 1
    assert val("reach_messages_sent_total", capability=c, priority="normal") == 0
    assert val("reach_messages_sent_total", capability="_other", priority="normal") == before + 2


def test_breaker_transitions_from_a_real_breaker() -> None:
    t = [0.0]
    br = Breakers(min_requests=2, error_rate=0.5, cooldown_s=1.0, clock=lambda: t[0])
    br.listeners.append(metrics.on_breaker_change)
    opened = val("reach_breaker_transitions_total", from_state="closed", to_state="open")
    half = val("reach_breaker_transitions_total", from_state="open", to_state="half_open")
    closed = val("reach_breaker_transitions_total", from_state="half_open", to_state="closed")
    open_now = val("reach_breakers_open")
    br.record("a-1", False)
    br.record("a-1", False)
    assert br.state("a-1") == "open"
    assert (
        val("reach_breaker_transitions_total", from_state="closed", to_state="open") == opened + 1
    )
    assert val("reach_breakers_open") == open_now + 1
    t[0] = 2.0
    assert br.allow("a-1")  # half-open probe
    br.record("a-1", True)
    assert br.state("a-1") == "closed"
    assert (
        val("reach_breaker_transitions_total", from_state="open", to_state="half_open") == half + 1
    )
    assert (
        val("reach_breaker_transitions_total", from_state="half_open", to_state="closed")
        == closed + 1
    )
    assert val("reach_breakers_open") == open_now
    # agent ids are no label: the series do not grow with agents
    names = {
        s.labels.get("agent_id")
        for m in REGISTRY.collect()
        if m.name.startswith("reach_breaker")
        for s in m.samples
    }
    assert names == {None}


def test_agent_gauges_and_forget() -> None:
    agent = f"m-{uuid.uuid4().hex[:6]}"
    n = [3]
    metrics.track_inflight(agent, lambda: n[0])
    metrics.inbox_depth(agent, {"high": 1, "normal": 5, "low": 0})
    assert val("reach_inflight_messages", agent_id=agent) == 3
    n[0] = 1
    assert val("reach_inflight_messages", agent_id=agent) == 1  # read at scrape time
    assert val("reach_inbox_depth", agent_id=agent, priority="normal") == 5
    metrics.forget_agent(agent)
    assert REGISTRY.get_sample_value("reach_inflight_messages", {"agent_id": agent}) is None
    assert (
        REGISTRY.get_sample_value("reach_inbox_depth", {"agent_id": agent, "priority": "normal"})
        is None
    )
    metrics.forget_agent(agent)  # twice is fine


def test_registry_gauges_set_and_cleared() -> None:
    metrics.registry_counts({"active": 3, "probation": 1}, routable=2)
    assert val("reach_registry_agents", state="active") == 3
    assert val("reach_registry_agents", state="probation") == 1
    assert val("reach_registry_agents", state="evicted") == 0
    assert val("reach_registry_agents_routable") == 2
    metrics.registry_counts(None)  # not the sweeper: nothing exported
    assert REGISTRY.get_sample_value("reach_registry_agents", {"state": "active"}) is None
    assert REGISTRY.get_sample_value("reach_registry_agents_routable") is None  # not a 0
    # runtimes of one process: one without the lock does not wipe the holder's counts
    holder, other = object(), object()
    metrics.registry_counts({"active": 4}, routable=3, source=holder)
    metrics.registry_counts(None, source=other)
    assert val("reach_registry_agents_routable") == 3
    metrics.registry_counts(None, source=holder)  # it lost the lock (or stopped)
    assert REGISTRY.get_sample_value("reach_registry_agents_routable") is None


def test_serve_exposes_metrics_over_http() -> None:
    c = cap()
    metrics.message_sent(c, "normal")
    srv = metrics.serve(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_port}/metrics", timeout=5) as f:
            text = f.read().decode()
    finally:
        srv.shutdown()
        srv.server_close()
    fams = {m.name: m for m in text_string_to_metric_families(text)}
    assert "reach_messages_sent" in fams
    got = [
        s.value
        for s in fams["reach_messages_sent"].samples
        if s.name == "reach_messages_sent_total" and s.labels.get("capability") == c
    ]
    assert got == [1.0]
    # every reach series is declared, even before it has samples
    for name in (
        "reach_messages_acked",
        "reach_messages_dead_lettered",
        "reach_messages_expired",
        "reach_handler_duration_seconds",
        "reach_queue_wait_seconds",
        "reach_inflight_messages",
        "reach_inbox_depth",
        "reach_registry_agents",
        "reach_breaker_transitions",
        "reach_idempotent_replays",
    ):
        assert name in fams, name


def test_counts_are_folded_into_the_series_when_the_registry_is_read() -> None:
    # The message path counts plain numbers; a scrape (generate_latest) or any read of the
    # registry adds them to the prometheus series first, histogram buckets included.
    from prometheus_client import generate_latest

    c = cap()
    for s in (0.0005, 0.0005, 0.2, 400.0):
        metrics.handler_done(c, "succeeded", s)
    metrics.delivered(c, "normal")
    text = generate_latest(REGISTRY).decode()
    assert f'reach_messages_delivered_total{{capability="{c}",priority="normal"}} 1.0' in text
    labels = {"capability": c, "outcome": "succeeded", "version": ""}
    assert val("reach_handler_duration_seconds_count", **labels) == 4
    assert val("reach_handler_duration_seconds_sum", **labels) == pytest.approx(400.201)
    assert val("reach_handler_duration_seconds_bucket", **labels, le="0.001") == 2
    assert val("reach_handler_duration_seconds_bucket", **labels, le="0.25") == 3
    assert val("reach_handler_duration_seconds_bucket", **labels, le="300.0") == 3
    assert val("reach_handler_duration_seconds_bucket", **labels, le="+Inf") == 4
    metrics.handler_done(c, "succeeded", 0.25)  # a bound itself is in its bucket (le)
    assert val("reach_handler_duration_seconds_bucket", **labels, le="0.25") == 4


def test_unread_notes_are_folded_as_they_pile_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nobody scrapes: the notes are folded by the one that reaches FOLD_AT, so they never
    # pile up beyond it.
    monkeypatch.setattr(metrics._Tally, "FOLD_AT", 8)
    c = cap()
    for _ in range(20):
        metrics.delivered(c, "low")
        assert len(metrics._TALLY._notes) < 8
    assert val("reach_messages_delivered_total", capability=c, priority="low") == 20


def test_the_registry_is_counted_only_while_its_gauges_are_scraped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle worker nobody scrapes sends no count (a script call reading up to a thousand
    records every 5 s); a scrape makes the next counts worth their cost for a while."""
    from prometheus_client import generate_latest

    from reach._worker.hookchain import HookChain
    from reach.hooks import Hooks

    gauges = metrics._REGISTRY_GAUGES
    monkeypatch.setattr(gauges, "read_at", float("-inf"))
    chain = HookChain([metrics.MetricsHooks()])
    assert not metrics.registry_counts_wanted() and not chain.wants_registry_counts()
    generate_latest(REGISTRY)  # a scrape
    assert metrics.registry_counts_wanted() and chain.wants_registry_counts()
    monkeypatch.setattr(gauges, "read_at", gauges.read_at - metrics.COUNTS_WANTED_S - 1)
    assert not chain.wants_registry_counts()

    class Own(Hooks):  # an application's hook always gets the counts
        def on_registry_counts(self, counts: object, routable: int) -> None:
            pass

    assert HookChain([metrics.MetricsHooks(), Own()]).wants_registry_counts()
    assert not HookChain([]).wants_registry_counts()

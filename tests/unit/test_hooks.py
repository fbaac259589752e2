"""The hook seam (reach.hooks): which methods are called, in which order, and that a hook
that raises changes nothing but a log line. No Redis here; tests/integration/test_hooks.py
watches a real worker."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import REGISTRY

import reach
from reach import Agent, ConfigError, Hooks
from reach._worker import hookchain
from reach._worker.hookchain import HookChain
from reach._worker.stats import Stats
from reach.envelope import Envelope
from reach.hooks import HOOK_METHODS, Outcome, WorkerInfo
from reach.metrics import MetricsHooks, handler_outcome


def env(capability: str = "x.y") -> Envelope:
    return Envelope(msg_id=uuid.uuid4().hex, capability=capability)


class Recorder(Hooks):
    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name = name
        self.calls = calls

    def on_delivered(self, env: Envelope) -> None:
        self.calls.append((self.name, "on_delivered"))

    def after_settle(self, env: Envelope | None, outcome: str, reason: str) -> None:
        self.calls.append((self.name, f"after_settle {outcome}"))


class Broken(Hooks):
    def __init__(self) -> None:
        self.n = 0

    def on_delivered(self, env: Envelope) -> None:
        self.n += 1
        raise RuntimeError(f"broken hook #{self.n}")


class Worker:
    agent_id = "w-1"
    instance_id = "i-1"
    namespace = "ns"
    inflight = 3


def test_the_hook_methods() -> None:
    assert HOOK_METHODS == (
        "on_start",
        "on_stop",
        "on_heartbeat",
        "on_registry_counts",
        "on_round_trip",
        "on_delivered",
        "on_replay",
        "before_handle",
        "after_handle",
        "on_retry",
        "on_dead_letter",
        "on_fenced",
        "on_outcome_dropped",
        "after_settle",
    )
    for name in HOOK_METHODS:  # the chain calls each one
        assert callable(getattr(HookChain([]), name))


def test_hooks_are_called_in_order_and_only_where_overridden() -> None:
    calls: list[tuple[str, str]] = []
    chain = HookChain([Recorder("a", calls), Hooks(), Recorder("b", calls)])
    e = env()
    chain.on_delivered(e)
    chain.after_settle(e, "succeeded", "")
    chain.on_replay(e)  # nobody overrides it: nothing to call
    assert calls == [
        ("a", "on_delivered"),
        ("b", "on_delivered"),
        ("a", "after_settle succeeded"),
        ("b", "after_settle succeeded"),
    ]
    assert chain._on_replay == ()


def test_a_raising_hook_is_logged_rate_limited_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(hookchain.time, "monotonic", lambda: now[0])
    calls: list[tuple[str, str]] = []
    broken = Broken()
    chain = HookChain([broken, Recorder("after", calls)])
    with caplog.at_level(logging.ERROR, logger="reach.hooks"):
        for _ in range(5):
            chain.on_delivered(env())  # raises nothing
        assert len(calls) == 5 and broken.n == 5
        lines = [r for r in caplog.records if r.name == "reach.hooks"]
        assert len(lines) == 1  # the first failure, with its traceback
        assert "Broken.on_delivered" in lines[0].getMessage()
        assert "broken hook #1" in lines[0].getMessage() and lines[0].exc_info
        now[0] += hookchain.REMIND_S + 1
        chain.on_delivered(env())
        lines = [r for r in caplog.records if r.name == "reach.hooks"]
        assert len(lines) == 2
        assert "still failing (5 more times" in lines[1].getMessage()


def test_agent_takes_hooks_and_refuses_what_is_not_one() -> None:
    a, b = Hooks(), Hooks()
    app = Agent("h-1", capabilities=["x.y"], hooks=[a])
    app.add_hooks(b)
    assert app.hooks == [a, b]
    with pytest.raises(ConfigError, match=r"reach\.Hooks"):
        Agent("h-2", capabilities=["x.y"], hooks=[object()])  # type: ignore[list-item]
    with pytest.raises(ConfigError):
        app.add_hooks(print)  # type: ignore[arg-type]
    assert reach.Hooks is Hooks


def test_stats_count_what_the_worker_logs_when_it_stops(caplog: pytest.LogCaptureFixture) -> None:
    stats = Stats()
    chain = HookChain([stats])
    e = env()
    ctx: Any = None  # the statistics do not look at the context
    chain.on_round_trip("fetch")
    chain.on_round_trip("settle")
    chain.after_handle(ctx, Outcome("succeeded"), 0.1)
    chain.after_handle(ctx, Outcome("expired", "timeout"), 1.0)
    chain.after_handle(ctx, Outcome("expired", "expired"), None)
    chain.flush_handled()  # handled runs are counted per batch, before they are settled
    chain.on_dead_letter(e, "timeout", "")
    chain.on_dead_letter(None, "malformed", "")
    chain.on_retry(e, 0.2, "boom")
    chain.on_replay(e)
    chain.on_fenced(e)
    chain.on_outcome_dropped(e)
    assert stats.counts == {
        "handled": 1,
        "replayed": 1,
        "fenced": 1,
        "outcomes_dropped": 1,
        "dead": 2,
        "retried": 1,
        "expired": 2,
        "round_trips": 2,
    }
    with caplog.at_level(logging.INFO, logger="reach.runtime"):
        chain.on_stop(Worker())
    assert any(r.getMessage().startswith('stats: {"handled": 1') for r in caplog.records)


def val(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_are_a_hook() -> None:
    worker: WorkerInfo = Worker()
    chain = HookChain([MetricsHooks()])
    cap = f"test.h{uuid.uuid4().hex[:8]}"
    e = env(cap)
    chain.on_start(worker)
    assert val("reach_inflight_messages", agent_id="w-1") == 3
    depths: Mapping[str, int] = {"high": 1, "normal": 2, "low": 0}
    chain.on_heartbeat(worker, depths)
    assert val("reach_inbox_depth", agent_id="w-1", priority="normal") == 2
    chain.on_delivered(e)
    chain.on_replay(e)
    chain.on_fenced(e)
    chain.after_settle(e, "dead", "rejected")
    chain.after_settle(None, "malformed", "malformed")
    assert val("reach_messages_delivered_total", capability=cap, priority="normal") == 1
    assert val("reach_idempotent_replays_total", capability=cap) == 1
    assert val("reach_messages_fenced_total", capability=cap) == 1
    assert val("reach_messages_dead_lettered_total", capability=cap, reason="rejected") == 1
    chain.on_stop(worker)
    assert REGISTRY.get_sample_value("reach_inflight_messages", {"agent_id": "w-1"}) is None


@pytest.mark.parametrize(
    ("outcome", "label"),
    [
        (Outcome("succeeded"), "succeeded"),
        (Outcome("dead", "bad_result"), "succeeded"),  # it returned; the result was unusable
        (Outcome("expired", "timeout"), "timeout"),
        (Outcome("dead", "rejected"), "rejected"),
        (Outcome("retrying"), "error"),
        (Outcome("dead", "max_attempts"), "error"),
        (Outcome("expired", "expired"), "error"),  # no time left for its retry
    ],
)
def test_handler_outcome_label(outcome: Outcome, label: str) -> None:
    assert handler_outcome(outcome) == label


def test_batches_are_counted_once_and_every_message_is_seen() -> None:
    """A batch read or settled together: the metrics note each series once (the counts are
    those of the per-message calls when scraped), a hook of one's own still gets a call per
    message, after the built-in ones, and a subclass that overrides the per-message method
    alone is called per message."""
    calls: list[Any] = []

    class Mine(Hooks):
        def on_delivered(self, env: Envelope) -> None:
            calls.append(("delivered", env.capability))

        def after_settle(self, env: Envelope | None, outcome: str, reason: str) -> None:
            calls.append(("settled", outcome))

    class OwnSettle(MetricsHooks):
        def after_settle(self, env: Envelope | None, outcome: str, reason: str) -> None:
            calls.append(("own", outcome))

    cap = f"test.b{uuid.uuid4().hex[:8]}"
    chain = HookChain([MetricsHooks(), Mine(), OwnSettle()])
    chain.on_delivered_many([env(cap), env(cap), env(cap)])
    chain.after_settle_many(
        [(env(cap), "succeeded", ""), (env(cap), "dead", "rejected"), (env(cap), "succeeded", "")]
    )
    assert val("reach_messages_delivered_total", capability=cap, priority="normal") == 6
    assert val("reach_messages_acked_total", capability=cap, outcome="succeeded") == 2
    assert val("reach_messages_dead_lettered_total", capability=cap, reason="rejected") == 1
    assert calls == [
        *[("delivered", cap)] * 3,
        ("settled", "succeeded"),
        ("own", "succeeded"),
        ("settled", "dead"),
        ("own", "dead"),
        ("settled", "succeeded"),
        ("own", "succeeded"),
    ]


def test_handling_is_counted_per_batch_and_an_own_hook_is_still_called_per_message() -> None:
    """The metrics' before_handle and after_handle come as rows, handed over by
    flush_handled (the settler calls it before it writes the outcomes); the values are
    those of the per-message calls. A hook of one's own is called per message, at once."""
    calls: list[Any] = []

    class Mine(Hooks):
        def before_handle(self, ctx: Any) -> None:
            calls.append(("before", ctx.envelope.msg_id))

        def after_handle(self, ctx: Any, outcome: Outcome, duration_s: float | None) -> None:
            calls.append(("after", outcome.status))

    class Ctx:
        def __init__(self, envelope: Envelope) -> None:
            self.envelope = envelope

    cap = f"test.h{uuid.uuid4().hex[:8]}"
    chain = HookChain([MetricsHooks("v1"), Mine()])
    envs = [
        Envelope(msg_id=f"m{i}", capability=cap, sent_ms=1_000, priority="low") for i in range(3)
    ]
    waits_before = val("reach_queue_wait_seconds_count", priority="low")
    sum_before = val("reach_queue_wait_seconds_sum", priority="low")
    for i, e in enumerate(envs):
        ctx: Any = Ctx(e)
        chain.before_handle(ctx, 1_000 + 500 * i)  # waited 0, 0.5, 1.0 s
        chain.after_handle(ctx, Outcome("succeeded") if i else Outcome("retrying"), 0.02)
    chain.after_handle(Ctx(envs[0]), Outcome("dead", "no_handler"), None)  # no run: no time
    assert calls[:2] == [("before", "m0"), ("after", "retrying")] and len(calls) == 7

    def done(label: str) -> float:
        return val(
            "reach_handler_duration_seconds_count", capability=cap, outcome=label, version="v1"
        )

    assert done("succeeded") == 0  # not handed over yet
    chain.flush_handled()
    assert done("succeeded") == 2 and done("error") == 1
    assert val("reach_queue_wait_seconds_count", priority="low") == waits_before + 3
    assert val("reach_queue_wait_seconds_sum", priority="low") == pytest.approx(sum_before + 1.5)
    chain.flush_handled()  # nothing more
    assert done("succeeded") == 2

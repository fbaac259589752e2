"""reach.logs: message ids on log records (also from sync handlers' threads), the JSON and
text formats, and the optional OpenTelemetry spans (only when it is installed)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import anyio
import pytest

from reach import logs
from reach.envelope import Envelope


@pytest.fixture
def capture() -> Iterator[tuple[io.StringIO, logging.Handler]]:
    buf = io.StringIO()
    h = logging.StreamHandler(buf)
    h.addFilter(logs.ContextFilter())
    h.setFormatter(logs.JsonFormatter())
    lg = logging.getLogger("reach.test_logs")
    lg.addHandler(h)
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    yield buf, h
    lg.removeHandler(h)


def lines(buf: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(x) for x in buf.getvalue().splitlines()]


def env(**kw: str) -> Envelope:
    return Envelope(
        msg_id=kw.get("msg_id", "m-1"),
        capability="text.echo",
        trace_id=kw.get("trace_id", "t-1"),
        session_id=kw.get("session_id", "s-1"),
    )


def test_ids_on_records_only_inside_the_scope(capture) -> None:  # type: ignore[no-untyped-def]
    buf, _ = capture
    lg = logging.getLogger("reach.test_logs")
    lg.info("before")
    with logs.message_scope(env(), "agent-1"):
        lg.info("inside %s", "x")
        assert logs.current() == {
            "trace_id": "t-1",
            "session_id": "s-1",
            "agent_id": "agent-1",
            "msg_id": "m-1",
        }
    lg.info("after")
    before, inside, after = lines(buf)
    assert set(before) == {"ts", "level", "logger", "message"}
    assert inside["message"] == "inside x" and inside["level"] == "INFO"
    assert inside["logger"] == "reach.test_logs"
    assert (inside["msg_id"], inside["trace_id"], inside["session_id"], inside["agent_id"]) == (
        "m-1",
        "t-1",
        "s-1",
        "agent-1",
    )
    assert "msg_id" not in after


def test_empty_ids_are_left_out_and_extra_wins(capture) -> None:  # type: ignore[no-untyped-def]
    buf, _ = capture
    lg = logging.getLogger("reach.test_logs")
    with logs.message_scope(env(session_id=""), "agent-1"):
        lg.warning("w", extra={"msg_id": "given"})
    (rec,) = lines(buf)
    assert "session_id" not in rec
    assert rec["msg_id"] == "given"


def test_exceptions_are_one_json_line(capture) -> None:  # type: ignore[no-untyped-def]
    buf, _ = capture
    lg = logging.getLogger("reach.test_logs")
    try:
        raise ValueError("boom")
    except ValueError:
        lg.exception("failed")
    assert len(buf.getvalue().splitlines()) == 1
    (rec,) = lines(buf)
    assert "ValueError: boom" in rec["exc"]


async def _in_thread_and_task() -> list[dict[str, str]]:
    buf = io.StringIO()
    h = logging.StreamHandler(buf)
    h.addFilter(logs.ContextFilter())
    h.setFormatter(logs.JsonFormatter())
    lg = logging.getLogger("reach.test_logs.thread")
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    try:
        with logs.message_scope(env(msg_id="m-thread"), "agent-2"):
            # a sync handler runs in a worker thread: the context goes with it
            await anyio.to_thread.run_sync(lambda: lg.info("from a thread"))
        lg.info("outside")
    finally:
        lg.removeHandler(h)
    return lines(buf)


def test_sync_handlers_in_threads_carry_the_ids() -> None:
    inside, outside = anyio.run(_in_thread_and_task)
    assert inside["msg_id"] == "m-thread" and inside["agent_id"] == "agent-2"
    assert "msg_id" not in outside


def test_text_format_appends_the_ids() -> None:
    buf = io.StringIO()
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        logs.setup_logging("info", "text", stream=buf)
        with logs.message_scope(env(), "agent-1"):
            logging.getLogger("x").info("hello")
        logging.getLogger("x").info("plain")
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
    first, second = buf.getvalue().splitlines()
    assert first.endswith("x: hello [agent=agent-1 msg=m-1 trace=t-1 session=s-1]")
    assert second.endswith("x: plain")


def test_the_default_handler_follows_sys_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    # A runner (click's CliRunner, pytest) swaps sys.stderr per invocation and closes the
    # old one: records logged later must reach the stderr of their time, not fail on it.
    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup_logging("info")
        first.close()
        second = io.StringIO()
        monkeypatch.setattr("sys.stderr", second)
        logging.getLogger("reach.test").warning("after the swap")
        assert "after the swap" in second.getvalue()
        assert "Logging error" not in second.getvalue()
    finally:
        root.handlers[:], root.level = saved[0], saved[1]


def test_setup_logging_rejects_unknown_formats() -> None:
    with pytest.raises(ValueError, match="text or json"):
        logs.setup_logging("info", "xml")


def test_without_opentelemetry_tracing_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "OTEL", False)
    headers: dict[str, str] = {}
    logs.inject(headers)
    assert headers == {}
    with logs.span("reach.route") as s:
        assert s is None
    logs.note_outcome("dead", "Reject")


def test_opentelemetry_spans_and_traceparent() -> None:
    pytest.importorskip(
        "opentelemetry.sdk",
        reason="opentelemetry-sdk is not installed: the optional "
        "OpenTelemetry spans are tested only where it is (pip install opentelemetry-sdk)",
    )
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    assert logs.OTEL
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process; ignored (warning) if already set
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another tracer provider was installed earlier in this process")

    e = env()
    with logs.span("reach.route"), logs.span("reach.deliver", kind="producer") as sp:
        logs.inject(e.headers)
        deliver_ctx = sp.get_span_context()
    assert e.headers["traceparent"].split("-")[1] == format(deliver_ctx.trace_id, "032x")
    # the agent side: a child of the caller's context carried in the envelope
    with logs.message_scope(e, "agent-1"):
        logs.note_outcome("dead", "Reject")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    handle = spans["reach.handle text.echo"]
    assert handle.context.trace_id == deliver_ctx.trace_id
    assert handle.parent is not None and handle.parent.span_id == deliver_ctx.span_id
    assert handle.attributes["reach.outcome"] == "dead"
    assert handle.attributes["messaging.message.id"] == "m-1"
    assert handle.status.status_code.name == "ERROR"
    assert spans["reach.deliver"].parent.span_id == spans["reach.route"].context.span_id

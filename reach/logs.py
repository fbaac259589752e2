"""Logs that say which message they are about, and optional OpenTelemetry spans.

While a handler runs, the runtime binds the message's ids in a context variable
(:func:`message_scope`); :class:`ContextFilter`, on a logging handler, copies them onto
every record, so the handler's own ``logging`` calls carry them too::

    {"ts": "...", "level": "INFO", "logger": "myagent", "message": "summarising",
     "trace_id": "...", "session_id": "...", "agent_id": "summarizer-1", "msg_id": "..."}

:func:`setup_logging` installs one stderr handler with the filter, in ``text`` (default)
or ``json`` format (one object per line); ``reach worker --log-format json`` uses it.
Other setups add ``ContextFilter()`` to their own handlers and may use ``%(msg_id)s``,
``%(trace_id)s``, ``%(session_id)s`` and ``%(agent_id)s`` in their formats.
reach never logs payloads (nor results): only ids, capabilities and error messages.

OpenTelemetry is optional. When ``opentelemetry-api`` is importable, :func:`inject` writes
the current span's ``traceparent`` into an envelope's headers, :func:`span` opens spans
(``reach.route``, ``reach.deliver`` on the caller, ``reach.handle`` on the agent, the
latter a child of the caller's context carried in ``traceparent``). Without it every one
of these is a no-op costing a function call.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import IO, Any, NamedTuple

from .errors import ConfigError
from .outcomes import Status

try:  # optional; imported by name so that type checkers need no stubs for it
    _otel_propagate: Any = importlib.import_module("opentelemetry.propagate")
    _otel_trace: Any = importlib.import_module("opentelemetry.trace")
    OTEL = True
except ImportError:  # pragma: no cover - depends on the environment
    _otel_propagate = _otel_trace = None
    OTEL = False


_UNSET = object()
# A tracer provider named by the environment (OpenTelemetry reads it when asked for the
# provider): looked up once, for the fast path of tracing().
_ENV_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def tracing() -> bool:
    """True when OpenTelemetry is installed *and* a tracer provider was set up.

    With the API alone the spans would be no-ops that still cost ~25 µs per message
    (context extraction, attach/detach): skip them until someone collects spans. The
    runtime asks once per message: while no provider is set (OpenTelemetry's module
    global still None, none named by the environment) the answer costs an attribute
    read, not OpenTelemetry's lookup of the environment.
    """
    if not OTEL:
        return False
    if not _ENV_PROVIDER and getattr(_otel_trace, "_TRACER_PROVIDER", _UNSET) is None:
        return False
    provider = _otel_trace.get_tracer_provider()
    return type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")


__all__ = [
    "FIELDS",
    "OTEL",
    "ContextFilter",
    "JsonFormatter",
    "MessageIds",
    "OutageLog",
    "TextFormatter",
    "bind",
    "current",
    "enter_message",
    "exit_message",
    "inject",
    "message_scope",
    "note_outcome",
    "setup_logging",
    "span",
    "unbind",
]

FIELDS = ("trace_id", "session_id", "agent_id", "msg_id")


class MessageIds(NamedTuple):
    trace_id: str = ""
    session_id: str = ""
    agent_id: str = ""
    msg_id: str = ""


_current: ContextVar[MessageIds | None] = ContextVar("reach_message_ids", default=None)


def bind(
    *, trace_id: str = "", session_id: str = "", agent_id: str = "", msg_id: str = ""
) -> Token[MessageIds | None]:
    """Bind ids to the current context; pass the token to :func:`unbind`."""
    return _current.set(MessageIds(trace_id, session_id, agent_id, msg_id))


def unbind(token: Token[MessageIds | None]) -> None:
    _current.reset(token)


def current() -> dict[str, str]:
    """The ids bound now (only the non-empty ones)."""
    ids = _current.get()
    return {} if ids is None else {k: v for k, v in ids._asdict().items() if v}


def enter_message(env: Any, agent_id: str) -> Any:
    """Start handling ``env``: bind its ids (and, with OpenTelemetry, open its
    ``reach.handle`` span, a child of the caller's ``traceparent``). Returns what
    :func:`exit_message` takes. The runtime's hot path: cheaper than a ``with``."""
    token = _current.set(MessageIds(env.trace_id, env.session_id, agent_id, env.msg_id))
    if not tracing():
        return token
    attrs = {
        "messaging.system": "reach",
        "messaging.destination.name": env.capability,
        "messaging.message.id": env.msg_id,
        "reach.agent_id": agent_id,
        "reach.trace_id": env.trace_id,
        "reach.attempt": env.attempt,
        "reach.priority": env.priority,
    }
    cm = span(
        f"reach.handle {env.capability}", headers=env.headers, kind="consumer", attributes=attrs
    )
    cm.__enter__()
    return (token, cm)


def exit_message(state: Any) -> None:
    """End what :func:`enter_message` started (in the same task)."""
    if isinstance(state, tuple):
        token, cm = state
        try:
            cm.__exit__(None, None, None)
        finally:
            _current.reset(token)
    else:
        _current.reset(state)


@contextmanager
def message_scope(env: Any, agent_id: str) -> Iterator[None]:
    """``with`` form of :func:`enter_message` / :func:`exit_message`."""
    state = enter_message(env, agent_id)
    try:
        yield
    finally:
        exit_message(state)


class ContextFilter(logging.Filter):
    """Put the bound message ids on each record (``""`` when none; never overrides ids a
    caller passed with ``extra=``). Attach it to handlers, not loggers, so records of every
    logger get them."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = _current.get() or _EMPTY
        for name, value in zip(FIELDS, ids, strict=True):
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


_EMPTY = MessageIds()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the ids when set, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            v = getattr(record, name, "")
            if v:
                out[name] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [agent=.. msg=.. trace=.. session=..]``."""

    def __init__(self, fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s") -> None:
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        s = super().format(record)
        parts = [
            f"{short}={v}"
            for short, name in (
                ("agent", "agent_id"),
                ("msg", "msg_id"),
                ("trace", "trace_id"),
                ("session", "session_id"),
            )
            if (v := getattr(record, name, ""))
        ]
        if not parts:
            return s
        head, nl, tail = s.partition("\n")  # ids on the first line, before a traceback
        return f"{head} [{' '.join(parts)}]{nl}{tail}"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record is emitted, not the
    stream it was when the handler was made (a test runner or an embedding application may
    swap it, and a closed old one would turn every later record into a logging error)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass  # always sys.stderr


def setup_logging(
    level: str | int = "info", fmt: str = "text", stream: IO[str] | None = None
) -> logging.Handler:
    """Configure the root logger: one handler on ``stream`` (stderr) with the ids filter,
    ``fmt`` ``text`` or ``json``. Replaces handlers configured before. Returns the handler."""
    if fmt not in ("text", "json"):
        raise ConfigError(f"Unknown log format {fmt!r}: use text or json.")
    if isinstance(level, str):
        level = getattr(logging, level.upper(), logging.INFO)
    handler: logging.StreamHandler[Any] = (
        logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    )
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return handler


# -- OpenTelemetry (optional) ------------------------------------------------------------
_KINDS = {
    "internal": "INTERNAL",
    "producer": "PRODUCER",
    "consumer": "CONSUMER",
    "client": "CLIENT",
    "server": "SERVER",
}


def inject(headers: MutableMapping[str, str]) -> None:
    """Write the current span's ``traceparent`` (and ``tracestate``) into ``headers``.

    Call it on the envelope's headers just before it is encoded. No-op without
    OpenTelemetry, or with no recording span.
    """
    if tracing():
        _otel_propagate.inject(headers)


_NO_SPAN: AbstractContextManager[None] = nullcontext()


def span(
    name: str,
    *,
    headers: Mapping[str, str] | None = None,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
) -> AbstractContextManager[Any]:
    """A span named ``name`` (None without OpenTelemetry: then a shared no-op context,
    which costs a sending caller nothing per message). With ``headers``, its parent is
    the context they carry (``traceparent``); otherwise the current span."""
    if not tracing():
        return _NO_SPAN
    return _span(name, headers=headers, kind=kind, attributes=attributes)


@contextmanager
def _span(
    name: str,
    *,
    headers: Mapping[str, str] | None,
    kind: str,
    attributes: Mapping[str, Any] | None,
) -> Iterator[Any]:
    ctx = _otel_propagate.extract(headers) if headers else None
    tracer = _otel_trace.get_tracer("reach")
    with tracer.start_as_current_span(
        name,
        context=ctx,
        kind=getattr(_otel_trace.SpanKind, _KINDS.get(kind, "INTERNAL")),
        attributes=dict(attributes or {}),
    ) as s:
        yield s


def note_outcome(status: str, error_type: str = "") -> None:
    """Record a handled message's outcome on the current span (no-op without OTel)."""
    if not tracing():
        return
    s = _otel_trace.get_current_span()
    if not s.is_recording():
        return
    s.set_attribute("reach.outcome", status)
    if status != Status.SUCCEEDED:
        s.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, error_type or status))
        if error_type:
            s.set_attribute("error.type", error_type)


# -- outages ---------------------------------------------------------------------------
class OutageLog:
    """Log a failure that repeats (Redis down, a key of the wrong type) as a few lines, not
    one per retry.

    Call :meth:`failed` after each failed attempt and :meth:`ok` after each success. The
    log gets one line when the failure starts, a reminder every ``remind_s`` seconds while
    it lasts (how long, how many attempts, the last error), and one line when an attempt
    succeeds again. All three at ``level`` (WARNING), so whoever sees the first line sees
    the last. For a one-minute Redis outage with ``remind_s=30``: three or four lines.

    ``what`` names the operation, e.g. ``"client c-42: reply stream read"``. ``clock``
    (seconds, monotonic) is for tests. :meth:`ok` on a healthy path costs an attribute
    read, so hot loops may call it on every success. Safe to share between threads.

    Example::

        outage = OutageLog(log, "registry refresh")
        while True:
            try:
                await refresh()
            except RedisError as e:
                outage.failed(e)
            else:
                outage.ok()
    """

    def __init__(
        self,
        logger: logging.Logger | str,
        what: str,
        *,
        remind_s: float = 30.0,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.what = what
        self.remind_s = remind_s
        self.level = level
        self.clock = clock
        self.since: float | None = None  # clock() of the first failure of the outage
        self.attempts = 0  # failed attempts in the current outage
        self._reminded = 0.0
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        """True between a failure and the next success."""
        return self.since is not None

    @property
    def down_for_s(self) -> float:
        """Seconds since the outage started (0 when not down)."""
        since = self.since
        return 0.0 if since is None else self.clock() - since

    def failed(self, exc: BaseException | str) -> bool:
        """Note a failed attempt; returns True when it wrote a line."""
        with self._lock:
            now = self.clock()
            self.attempts += 1
            if self.since is None:
                self.since = self._reminded = now
                self.log.log(
                    self.level,
                    "%s failed: %s; retrying (reminder every %.0f s, one line when it works again)",
                    self.what,
                    _why(exc),
                    self.remind_s,
                )
                return True
            if now - self._reminded < self.remind_s:
                return False
            self._reminded = now
            self.log.log(
                self.level,
                "%s still failing after %.0f s (%d attempts): %s",
                self.what,
                now - self.since,
                self.attempts,
                _why(exc),
            )
            return True

    def ok(self) -> bool:
        """Note a successful attempt; returns True when it ended an outage (and said so)."""
        if self.since is None:
            return False
        with self._lock:
            if self.since is None:
                return False
            took, n = self.clock() - self.since, self.attempts
            self.since, self.attempts = None, 0
            self.log.log(
                self.level, "%s works again after %.1f s (%d failed attempts)", self.what, took, n
            )
            return True


def _why(exc: BaseException | str) -> str:
    if isinstance(exc, str):
        return exc
    text = str(exc).rstrip(". ")  # the line goes on after it
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

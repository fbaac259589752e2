"""Calls the hooks (reach.hooks) of a worker: built-in ones first, then the user's.

For each hook method it keeps only the hooks that override it, so an event nobody
watches costs one attribute read. A hook that also has ``on_delivered_many(envs)`` or
``after_settle_many(rows)`` (the built-in metrics) gets a batch read or settled together in
one call, instead of a call per message; the others get theirs per message, as
docs/hooks.md says, after it. So with ``before_handle_many(rows)`` and
``after_handle_many(rows)``: the rows of the messages handled since the last time are
handed over by :meth:`HookChain.flush_handled`, which the settler calls before it writes
their outcomes (their replies are published after, and a scrape then counts them). A hook that raises is logged (rate-limited per hook
method) and skipped: it never stops the worker nor changes a message's outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..envelope import Envelope, now_ms
from ..hooks import HOOK_METHODS, Hooks, WorkerInfo
from ..outcomes import Outcome

if TYPE_CHECKING:
    from ..context import Context

log = logging.getLogger("reach.hooks")

REMIND_S = 60.0  # after its first failure, a failing hook method is logged at most this often


class HookChain:
    """The hooks of one worker, called in order, each failure contained."""

    def __init__(self, hooks: Sequence[Hooks]) -> None:
        self.hooks = tuple(hooks)
        self._failures: dict[str, tuple[float, int]] = {}  # hook method -> (last logged, since)
        self._lock = threading.Lock()  # on_heartbeat runs in another thread
        calls: dict[str, tuple[Callable[..., None], ...]] = {}
        for name in HOOK_METHODS:
            base = getattr(Hooks, name)
            calls[name] = tuple(
                getattr(h, name) for h in self.hooks if getattr(type(h), name, base) is not base
            )
        self._on_start = calls["on_start"]
        self._on_stop = calls["on_stop"]
        self._on_heartbeat = calls["on_heartbeat"]
        self._on_registry_counts = calls["on_registry_counts"]
        self._on_round_trip = calls["on_round_trip"]
        self._on_delivered = calls["on_delivered"]
        self._on_replay = calls["on_replay"]
        self._before_handle = calls["before_handle"]
        self._after_handle = calls["after_handle"]
        self._on_retry = calls["on_retry"]
        self._on_dead_letter = calls["on_dead_letter"]
        self._on_fenced = calls["on_fenced"]
        self._on_outcome_dropped = calls["on_outcome_dropped"]
        self._after_settle = calls["after_settle"]
        self._on_delivered_many, self._on_delivered = _split(self._on_delivered, "on_delivered")
        self._after_settle_many, self._after_settle = _split(self._after_settle, "after_settle")
        self._before_handle_many, self._before_handle = _split(self._before_handle, "before_handle")
        self._after_handle_many, self._after_handle = _split(self._after_handle, "after_handle")
        # The rows waiting for flush_handled: (ctx, ms when before_handle came), and
        # after_handle's arguments.
        self._handling: list[tuple[Context, int]] = []
        self._handled: list[tuple[Context, Outcome, float | None]] = []

    def _call(self, fns: tuple[Callable[..., None], ...], *args: Any) -> None:
        for fn in fns:
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - a hook's bug is the hook's, not the message's
                self._failed(fn, e)

    def _failed(self, fn: Callable[..., None], exc: Exception) -> None:
        owner = getattr(fn, "__self__", None)
        name = f"{type(owner).__qualname__}.{getattr(fn, '__name__', '?')}"
        now = time.monotonic()
        with self._lock:
            last, since = self._failures.get(name, (0.0, 0))
            if last and now - last < REMIND_S:
                self._failures[name] = (last, since + 1)
                return
            self._failures[name] = (now, 0)
        if not last:
            log.error(
                "hook %s failed (the worker goes on; later failures of this hook are "
                "logged at most once a minute): %s: %s",
                name,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
        else:
            log.error(
                "hook %s still failing (%d more times since the last line): %s: %s",
                name,
                since + 1,
                type(exc).__name__,
                exc,
            )

    def on_start(self, worker: WorkerInfo) -> None:
        if self._on_start:
            self._call(self._on_start, worker)

    def on_stop(self, worker: WorkerInfo) -> None:
        self.flush_handled()  # runs cut by the stop: their before_handle still counts
        if self._on_stop:
            self._call(self._on_stop, worker)

    def on_heartbeat(self, worker: WorkerInfo, depths: Mapping[str, int]) -> None:
        if self._on_heartbeat:
            self._call(self._on_heartbeat, worker, depths)

    def on_registry_counts(self, counts: Mapping[str, int] | None, routable: int) -> None:
        if self._on_registry_counts:
            self._call(self._on_registry_counts, counts, routable)

    def wants_registry_counts(self) -> bool:
        """True when a hook uses the registry counts: an application's own hook always, the
        metrics' only while their gauges are being scraped (a count is a script call that
        reads up to a thousand records)."""
        for fn in self._on_registry_counts:
            wants = getattr(getattr(fn, "__self__", None), "wants_registry_counts", None)
            if wants is None or wants():
                return True
        return False

    def on_round_trip(self, op: str) -> None:
        if self._on_round_trip:
            self._call(self._on_round_trip, op)

    def on_delivered(self, env: Envelope) -> None:
        self.on_delivered_many((env,))

    def on_delivered_many(self, envs: Sequence[Envelope]) -> None:
        """``on_delivered`` for each of ``envs``, read together."""
        if self._on_delivered_many and envs:
            self._call(self._on_delivered_many, envs)
        if self._on_delivered:
            for env in envs:
                self._call(self._on_delivered, env)

    def on_replay(self, env: Envelope) -> None:
        if self._on_replay:
            self._call(self._on_replay, env)

    def before_handle(self, ctx: Context, at_ms: int | None = None) -> None:
        """``at_ms``: the clock now, if the caller read it already."""
        if self._before_handle_many:
            self._handling.append((ctx, now_ms() if at_ms is None else at_ms))
        if self._before_handle:
            self._call(self._before_handle, ctx)

    def after_handle(self, ctx: Context, outcome: Outcome, duration_s: float | None) -> None:
        if self._after_handle_many:
            self._handled.append((ctx, outcome, duration_s))
        if self._after_handle:
            self._call(self._after_handle, ctx, outcome, duration_s)

    def flush_handled(self) -> None:
        """Hand the ``before_handle_many`` and ``after_handle_many`` hooks the rows of the
        messages handled since the last call (before their outcomes are written)."""
        if self._handling:
            rows, self._handling = self._handling, []
            self._call(self._before_handle_many, rows)
        if self._handled:
            done, self._handled = self._handled, []
            self._call(self._after_handle_many, done)

    def on_retry(self, env: Envelope, delay_s: float, error: str) -> None:
        if self._on_retry:
            self._call(self._on_retry, env, delay_s, error)

    def on_dead_letter(self, env: Envelope | None, reason: str, error: str) -> None:
        if self._on_dead_letter:
            self._call(self._on_dead_letter, env, reason, error)

    def on_fenced(self, env: Envelope) -> None:
        if self._on_fenced:
            self._call(self._on_fenced, env)

    def on_outcome_dropped(self, env: Envelope) -> None:
        if self._on_outcome_dropped:
            self._call(self._on_outcome_dropped, env)

    def after_settle(self, env: Envelope | None, outcome: str, reason: str) -> None:
        self.after_settle_many(((env, outcome, reason),))

    def after_settle_many(self, rows: Sequence[tuple[Envelope | None, str, str]]) -> None:
        """``after_settle(env, outcome, reason)`` for each of ``rows``, settled together."""
        if self._after_settle_many and rows:
            self._call(self._after_settle_many, rows)
        if self._after_settle:
            for env, outcome, reason in rows:
                self._call(self._after_settle, env, outcome, reason)


def _split(
    fns: tuple[Callable[..., None], ...], name: str
) -> tuple[tuple[Callable[..., None], ...], tuple[Callable[..., None], ...]]:
    """(the ``<name>_many`` methods of the hooks in ``fns`` that have one, the ``name``
    methods of the others). A batch method counts only where the class that defines
    ``name`` defines it too: a subclass that overrides ``name`` alone gets its calls."""
    many, each = [], []
    for fn in fns:
        owner = getattr(fn, "__self__", None)
        m = getattr(owner, f"{name}_many", None)
        if callable(m) and _defined_in(type(owner), name) is _defined_in(
            type(owner), f"{name}_many"
        ):
            many.append(m)
        else:
            each.append(fn)
    return tuple(many), tuple(each)


def _defined_in(cls: type, name: str) -> type | None:
    return next((c for c in cls.__mro__ if name in vars(c)), None)

"""One seam for everything that watches an agent at work: metrics, statistics, tracing, yours.

Subclass :class:`Hooks`, override the methods you need, and give instances to the agent::

    class Timing(reach.Hooks):
        def before_handle(self, ctx: reach.Context) -> None:
            log.info("start %s", ctx.msg_id)

        def after_settle(self, env, outcome, reason) -> None:
            log.info("%s settled: %s", env.msg_id if env else "-", outcome)

    app = reach.Agent("a1", capabilities=["x.y"], hooks=[Timing()])
    app.add_hooks(OtherHooks())  # or later, before run()

reach's own Prometheus metrics (``reach.metrics.MetricsHooks``), the statistics a worker
logs when it stops and the OpenTelemetry outcome of a handled message are hooks too; they
run first, then yours, in the order given.

Rules of the seam:

* Hooks are plain (not async) methods and run inline on the worker's event loop
  (:meth:`Hooks.on_heartbeat` in the heartbeat thread): keep them quick, and hand slow
  work (network calls) to a queue or a task of your own.
* A hook that raises does not stop the worker and does not change what happens to the
  message: the error is logged (logger ``reach.hooks``, with its traceback the first
  time, then at most one line a minute per hook method) and the worker goes on.
* A method you do not override costs nothing: the worker calls only overridden ones.

The life of one message, in hook calls: :meth:`~Hooks.on_delivered` (read from the
inbox) -> either :meth:`~Hooks.on_replay` (its idempotency key was already done) or
:meth:`~Hooks.before_handle` -> :meth:`~Hooks.after_handle` -> :meth:`~Hooks.on_retry` or
:meth:`~Hooks.on_dead_letter` when that is its outcome -> :meth:`~Hooks.after_settle`
(written to Redis and acked). :meth:`~Hooks.on_fenced` replaces ``after_settle`` when
another worker took the message over meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from .envelope import Envelope
from .outcomes import Outcome

if TYPE_CHECKING:
    from .context import Context

__all__ = ["HOOK_METHODS", "Hooks", "Outcome", "WorkerInfo"]


class WorkerInfo(Protocol):
    """The running worker, as hooks see it."""

    @property
    def agent_id(self) -> str: ...

    @property
    def instance_id(self) -> str:
        """New at every start of the agent."""
        ...

    @property
    def namespace(self) -> str: ...

    @property
    def inflight(self) -> int:
        """Handlers running now."""
        ...


class Hooks:
    """Base class of hooks: every method does nothing; override the ones you need.

    ``env`` arguments are the message's :class:`reach.Envelope` (``env.msg_id``,
    ``env.capability``, ``env.attempt``...); it is ``None`` for an inbox entry that was
    not a message (bytes that are not an envelope, or an entry deleted meanwhile).
    """

    # -- the worker ------------------------------------------------------------------
    def on_start(self, worker: WorkerInfo) -> None:
        """The worker connected and is about to register."""

    def on_stop(self, worker: WorkerInfo) -> None:
        """The worker stopped serving (after its drain), before it deregisters."""

    def on_heartbeat(self, worker: WorkerInfo, depths: Mapping[str, int]) -> None:
        """Before each heartbeat, with the inbox length per priority (high, normal, low).

        Runs in the heartbeat thread, not on the event loop."""

    def on_registry_counts(self, counts: Mapping[str, int] | None, routable: int) -> None:
        """Every few seconds: the namespace's agents by state (active, probation,
        evicted) and how many are routable, counted by the agent holding the sweeper
        lock; ``None`` (and 0) when another agent holds it."""

    def on_round_trip(self, op: str) -> None:
        """The worker is about to make one round trip to Redis on the message path:
        ``op`` is fetch, block, claim, settle or complete."""

    # -- one message -----------------------------------------------------------------
    def on_delivered(self, env: Envelope) -> None:
        """An inbox entry was read and decoded into a message (before its claim)."""

    def on_replay(self, env: Envelope) -> None:
        """The message's idempotency key was already done: the stored reply is sent
        again instead of running the handler."""

    def before_handle(self, ctx: Context) -> None:
        """A claimed message is about to be handled (deadline check, payload
        validation, then the handler). Runs in the handler's task, with the message's
        ids bound for logging: a context variable set here is seen by the handler."""

    def after_handle(self, ctx: Context, outcome: Outcome, duration_s: float | None) -> None:
        """The message's outcome is decided (:class:`reach.hooks.Outcome`: ``status`` a
        :class:`reach.Status`, succeeded, retrying, dead or expired, with ``reason`` a
        :class:`reach.DeadReason` or ``""``, and ``error``).
        ``duration_s`` is how long the handler ran; ``None`` when it did not run (the
        deadline had passed, no handler, a payload that does not fit)."""

    def on_retry(self, env: Envelope, delay_s: float, error: str) -> None:
        """The message failed and will be tried again after ``delay_s``."""

    def on_dead_letter(self, env: Envelope | None, reason: str, error: str) -> None:
        """The message (or an unreadable entry) is being dead-lettered with ``reason`` (a
        :class:`reach.DeadReason` value)."""

    def on_fenced(self, env: Envelope) -> None:
        """This worker's outcome was refused: another worker took the message over
        (its claim had expired). Nothing was written, replied or acked for it."""

    def on_outcome_dropped(self, env: Envelope) -> None:
        """This worker let the message's outcome go unwritten: Redis refused it for so
        long that the worker held its most outcomes waiting (a long outage, a full Redis).
        The message stays pending and runs again, or replays a stored result."""

    def after_settle(self, env: Envelope | None, outcome: str, reason: str) -> None:
        """The entry's outcome was written to Redis and the entry acked. ``outcome`` is a
        :class:`reach.outcomes.Settled` value: succeeded, retrying, dead, expired, replayed,
        parked (a copy of a message another worker runs, waiting for its result), malformed
        or gone (deleted meanwhile); ``reason`` the dead-letter reason, if any."""


HOOK_METHODS: tuple[str, ...] = tuple(
    name for name in vars(Hooks) if name.startswith(("on_", "before_", "after_"))
)
"""The names of the hook methods, in the order they are defined."""

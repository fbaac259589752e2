"""The worker's own statistics, a built-in hook: counted while it runs, logged when it stops.

The line ``stats: {...}`` (logger ``reach.runtime``) is read by ``reach bench``:
``round_trips`` are the worker's Redis round trips on the message path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..envelope import Envelope
from ..hooks import Hooks, WorkerInfo
from ..outcomes import Outcome, Status

if TYPE_CHECKING:
    from ..context import Context

log = logging.getLogger("reach.runtime")


class Stats(Hooks):
    """Counts handled, replayed, fenced, dead-lettered, retried and expired messages,
    outcomes dropped unwritten, and
    round trips (the names are those of the logged line)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {
            "handled": 0,
            "replayed": 0,
            "fenced": 0,
            "outcomes_dropped": 0,
            "dead": 0,
            "retried": 0,
            "expired": 0,
            "round_trips": 0,
        }

    def on_round_trip(self, op: str) -> None:
        self.counts["round_trips"] += 1

    def on_replay(self, env: Envelope) -> None:
        self.counts["replayed"] += 1

    def after_handle(self, ctx: Context, outcome: Outcome, duration_s: float | None) -> None:
        self.after_handle_many(((ctx, outcome, duration_s),))

    def after_handle_many(self, rows: Sequence[tuple[Context, Outcome, float | None]]) -> None:
        """:meth:`after_handle` of a batch (reach._worker.hookchain.HookChain.flush_handled)."""
        handled = expired = 0
        for _, outcome, _ in rows:
            if outcome.status == Status.SUCCEEDED:
                handled += 1
            elif outcome.status == Status.EXPIRED:
                expired += 1
        self.counts["handled"] += handled
        self.counts["expired"] += expired

    def on_retry(self, env: Envelope, delay_s: float, error: str) -> None:
        self.counts["retried"] += 1

    def on_dead_letter(self, env: Envelope | None, reason: str, error: str) -> None:
        self.counts["dead"] += 1

    def on_fenced(self, env: Envelope) -> None:
        self.counts["fenced"] += 1

    def on_outcome_dropped(self, env: Envelope) -> None:
        self.counts["outcomes_dropped"] += 1

    def on_stop(self, worker: WorkerInfo) -> None:
        log.info("stats: %s", json.dumps(self.counts))

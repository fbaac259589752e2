"""The rows settled batches add to the index of recent messages (reach.recent).

Rows ride along with the settle calls (``settle.lua``'s index section: no round trip of
their own). A batch of fewer than :data:`COALESCE_ROWS` messages does not pay an ``XADD``
of its own: its rows are held and written with a later batch, once that many are held or
the oldest has waited :data:`COALESCE_S`; the settler writes what is still held after
that long without a batch to ride on (one ``XADD`` per chunk), and at the end of a drain.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from redis import exceptions as rexc

from ..connection import AnyRedis
from ..envelope import now_ms
from ..keys import Keys
from ..outcomes import Settled
from ..recent import ROWS_PER_ENTRY, RowTuple, pack, row_of
from ..scripts._loader import run_pipeline
from ..scripts.delivery import DeadLetter, RecentRows
from .items import Delivery, Settleable

log = logging.getLogger("reach.runtime")

# How a handled attempt ended; replays, parked copies and malformed bytes are no attempt.
INDEXED = frozenset({Settled.SUCCEEDED, Settled.RETRYING, Settled.DEAD, Settled.EXPIRED})
COALESCE_ROWS = ROWS_PER_ENTRY
"""Rows held before they ride along with a settle call whatever their age."""
COALESCE_S = 0.25
"""The longest a row is held (the list shows a message at most this much later)."""


def rows_of(batch: Sequence[Settleable], agent_id: str) -> list[RowTuple]:
    """The index rows of ``batch``'s handled attempts."""
    now = now_ms()
    rows = []
    for it in batch:
        if not isinstance(it, Delivery) or it.outcome not in INDEXED:
            continue
        f, c = it.follow_up, it.complete
        etype = f.error_type if isinstance(f, DeadLetter) else (c.error_type if c else "")
        rows.append(
            row_of(
                it.env,
                agent_id=agent_id,
                status=it.outcome,
                reason=it.reason,
                error_type=etype,
                started_ms=it.started_ms,
                ended_ms=now,
                key=it.key,
            )
        )
    return rows


def recent_rows(
    batch: Sequence[Settleable], keys: Keys, agent_id: str, maxlen: int
) -> RecentRows | None:
    """The index entries of ``batch``'s handled attempts (None: none, or ``maxlen`` 0)."""
    rows = rows_of(batch, agent_id) if maxlen > 0 else []
    return RecentRows(keys.recent, maxlen, pack(rows)) if rows else None


class RecentIndex:
    """One runtime's rows on their way to the index: held, then written with a batch."""

    def __init__(self, keys: Keys, agent_id: str, maxlen: int) -> None:
        self.keys, self.agent_id, self.maxlen = keys, agent_id, maxlen
        self._held: list[RowTuple] = []
        self._since = 0.0  # time.monotonic() of the oldest row held

    def take(self, batch: Sequence[Settleable]) -> RecentRows | None:
        """What the settle call of ``batch`` writes to the index: every row held, with
        ``batch``'s, once there are :data:`COALESCE_ROWS` or the oldest is
        :data:`COALESCE_S` old; else nothing (they are held)."""
        if self.maxlen <= 0:
            return None
        rows = rows_of(batch, self.agent_id)
        if rows and not self._held:
            self._since = time.monotonic()
        self._held += rows
        if not self._held:
            return None
        if len(self._held) < COALESCE_ROWS and time.monotonic() - self._since < COALESCE_S:
            return None
        return self._release()

    def _release(self) -> RecentRows:
        rows, self._held = self._held, []
        return RecentRows(self.keys.recent, self.maxlen, pack(rows))

    def due_in(self) -> float | None:
        """Seconds until the rows held are due (None: none held)."""
        if not self._held:
            return None
        return max(0.0, self._since + COALESCE_S - time.monotonic())

    async def flush(self, redis: AnyRedis) -> None:
        """Write the rows held now (a round trip of their own). The index is a view: rows
        that cannot be written are dropped, with a log line."""
        if not self._held:
            return
        recent = self._release()
        try:
            await run_pipeline(redis, recent.ops())
        except (rexc.RedisError, OSError) as e:
            log.debug("index of recent messages: %d row(s) dropped (%s)", len(recent.chunks), e)

"""The rows a settled batch adds to the index of recent messages (reach.recent)."""

from __future__ import annotations

from collections.abc import Sequence

from ..envelope import now_ms
from ..keys import Keys
from ..outcomes import Settled
from ..recent import pack, row_of
from ..scripts.delivery import DeadLetter, RecentRows
from .items import Delivery, Settleable

# How a handled attempt ended; replays, parked copies and malformed bytes are no attempt.
INDEXED = frozenset({Settled.SUCCEEDED, Settled.RETRYING, Settled.DEAD, Settled.EXPIRED})


def recent_rows(
    batch: Sequence[Settleable], keys: Keys, agent_id: str, maxlen: int
) -> RecentRows | None:
    """The index entries of ``batch``'s handled attempts (None: none, or ``maxlen`` 0)."""
    if maxlen <= 0:
        return None
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
            )
        )
    if not rows:
        return None
    return RecentRows(keys.recent, maxlen, pack(rows))

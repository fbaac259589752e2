"""Cancelled dead letters are counted apart from failures, reading only the letters filed
since the last count; a stream that shrinks (purged, replayed) is counted anew."""

from __future__ import annotations

import pytest

from reach import admin
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.overview import CancelledCounts, collect, frame_data

pytestmark = pytest.mark.anyio


async def letter(r: AnyRedis, keys: Keys, cap: str, reason: str) -> str:
    return str(await r.xadd(keys.dlq(cap), {"reason": reason, "msg_id": "m", "env": b""}))


async def test_cancelled_letters_are_counted_apart(r: AnyRedis, ns: str) -> None:
    keys = Keys(ns)
    counts = CancelledCounts()
    for reason in ("max_attempts", "cancelled", "cancelled", "rejected"):
        await letter(r, keys, "t.a", reason)
    s = await collect(r, ns, cancelled=counts)
    f = frame_data(s, None, ns)
    [cap] = f["capabilities"]
    assert (cap["dead_letters"], cap["failed"], cap["cancelled"]) == (4, 2, 2)
    assert (f["totals"]["failed"], f["totals"]["cancelled"]) == (2, 2)

    await letter(r, keys, "t.a", "cancelled")  # only the new letter is read
    assert (await collect(r, ns, cancelled=counts)).dlq_cancelled == {"t.a": 3}
    await admin.purge_dead_letters(r, keys, capability="t.a")
    await letter(r, keys, "t.a", "timeout")
    assert (await collect(r, ns, cancelled=counts)).dlq_cancelled == {"t.a": 0}

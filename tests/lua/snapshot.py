"""What a refused script call must leave unchanged: every key of a namespace, as DUMP sees it."""

from __future__ import annotations

from reach.connection import AnyRedis

Snapshot = dict[bytes, tuple[bytes | None, int]]


async def snapshot(r: AnyRedis, ns: str) -> Snapshot:
    """Every key of namespace ``ns`` with its serialized value (a stream's DUMP holds its
    groups, consumers and pending entries too) and its time to live in ms (-1: none)."""
    keys = sorted([k async for k in r.scan_iter(match=f"*{ns}*", count=1000)])
    return {k: (await r.dump(k), int(await r.pttl(k))) for k in keys}


def assert_unchanged(before: Snapshot, after: Snapshot) -> None:
    """Same keys, same values, and no expiry set, dropped or moved (beyond the time that
    passed between the two snapshots)."""
    assert sorted(after) == sorted(before)
    for k, (value, ttl) in before.items():
        value2, ttl2 = after[k]
        assert value2 == value, f"{k!r} changed"
        assert (ttl == -1) == (ttl2 == -1) and abs(ttl2 - ttl) < 5_000, f"{k!r}: ttl {ttl} → {ttl2}"

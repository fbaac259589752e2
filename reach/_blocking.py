"""A connection held by one task for its blocking stream reads (``XREAD`` / ``XREADGROUP``
with ``BLOCK``): a client's reply reader, a worker's inbox reader.

Through redis-py's client, every such read takes a connection from the pool and gives it
back, packs the command word by word and converts the reply through its callbacks: about
60 % more CPU per read than on a connection held for it (95 against 59 µs in
``python bench/read_cost.py``), and that work sits between a reply's arrival and the call
it wakes. A reader that blocks all day holds its connection anyway; :class:`HeldReads`
keeps it and reads on it directly.

Any failure of a call (Redis away, an error reply, no reply within its time limit,
cancellation mid-read) drops the connection: a reply half read, or one still to come, must
never be taken for the next call's. The next call
takes a fresh one from the pool (which, behind Sentinel, knows the current master).
Standalone and Sentinel clients only; a Cluster client reads through redis-py as before
(:meth:`HeldReads.usable`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import anyio

from ._expiry import expire_after
from .connection import AnyRedis

Entries = list[tuple[Any, dict[Any, Any]]]
"""A stream's entries as redis-py gives them: (id, {field: value})."""


def stream_reply(reply: Any) -> list[tuple[Any, Entries]]:
    """An ``XREAD``/``XREADGROUP`` reply, RESP3 (a map) or RESP2 (pairs), as redis-py's
    client returns it: ``[(key, [(id, {field: value}), ...]), ...]``; empty for nil.
    Entries whose fields were deleted (nil) come with an empty dict."""
    if not reply:
        return []
    pairs: Any = reply.items() if isinstance(reply, dict) else reply
    out: list[tuple[Any, Entries]] = []
    for key, entries in pairs:
        out.append((key, [(eid, _fields(flat)) for eid, flat in entries]))
    return out


def stream_pairs(reply: Any) -> list[tuple[Any, list[Any]]]:
    """An ``XREAD``/``XREADGROUP`` reply as ``[(key, entries), ...]``, each entry as Redis
    sent it (``[id, [field, value, ...]]``, fields nil for an entry deleted since): for a
    reader that looks at the flat fields in place (a worker's consumer)."""
    if not reply:
        return []
    return list(reply.items() if isinstance(reply, dict) else reply)


def _fields(flat: Sequence[Any] | None) -> dict[Any, Any]:
    if not flat:
        return {}
    it = iter(flat)
    return dict(zip(it, it, strict=True))


class HeldReads:
    """Blocking reads on one connection of ``redis``'s pool, held between calls (see the
    module docstring). One task uses it at a time."""

    def __init__(self, redis: AnyRedis) -> None:
        self.redis: Any = redis  # its pool is read: not part of the client protocol
        self._conn: Any = None

    @property
    def usable(self) -> bool:
        """Has the client a pool to take a connection from (standalone, Sentinel)?"""
        return getattr(self.redis, "connection_pool", None) is not None and not hasattr(
            self.redis, "nodes_manager"
        )

    async def call(self, *words: Any, timeout_s: float | None) -> Any:
        """Send ``words`` and read their reply (``timeout_s``: how long to wait for it,
        None: as long as it takes); an error reply raises as redis-py raises it. No reply
        within ``timeout_s``: None, and the connection is dropped (its reply may still
        come, and must not be read as the next call's)."""
        conn = self._conn
        if conn is None:
            conn = self._conn = await self.redis.connection_pool.get_connection()
        try:
            await conn.send_command(*words)
            try:
                with expire_after(timeout_s):  # (a limit without a timer of its own)
                    return await conn.read_response(timeout=math.inf, disconnect_on_error=False)
            except TimeoutError:
                pass
        except BaseException:
            await self._drop_held(conn)
            raise
        await self._drop_held(conn)
        return None

    async def _drop_held(self, conn: Any) -> None:
        self._conn = None
        with anyio.CancelScope(shield=True):  # the socket must go, cancelled or not
            await _drop(self.redis, conn)

    async def aclose(self) -> None:
        """Give the connection back to the pool (none held: nothing to do)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await self.redis.connection_pool.release(conn)


async def _drop(redis: Any, conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    finally:
        await redis.connection_pool.release(conn)

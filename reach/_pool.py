"""A bounded asyncio connection pool whose callers wait for a free connection
(re-exported by :mod:`reach.connection`, which builds every pool)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import Any

import redis.asyncio as aredis
from redis import exceptions as rexc

POOL_WAIT_S = 60.0
"""How long a command waits for a free connection before :class:`ConnectionsExhausted`.
Generous on purpose: waiting is normal under load (thousands of calls share the pool);
running out of it means the commands holding connections are stuck."""

_POOL_EMPTY = "No connection available."

# The options of every connection reach opens from a URL (a pool's, a Cluster node's, a
# Sentinel-managed master's health checks).
_KW: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "health_check_interval": 15,
    "retry_on_timeout": True,
}


class _WaitingPool(aredis.ConnectionPool):
    """redis-py's asyncio pool, bounded by ``max_connections``, whose callers wait (first
    come, first served) for a free connection instead of getting ``MaxConnectionsError``.

    redis-py's ``BlockingConnectionPool`` does the same under a lock and a timeout for
    every command (~15 µs of CPU each here); this one costs nothing until the pool is
    full. After ``timeout`` seconds of waiting: ``ConnectionError("No connection
    available.")``, which :func:`unreachable` turns into :class:`ConnectionsExhausted`.
    """

    def __init__(self, *args: Any, timeout: float = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout = timeout or POOL_WAIT_S
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._waiters or not self.can_get_connection():
            await self._wait_turn(first=False)
        while True:
            try:
                return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
            except rexc.MaxConnectionsError:  # taken meanwhile (e.g. while the lock was held)
                await self._wait_turn(first=True)

    async def _wait_turn(self, *, first: bool) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            fut = asyncio.get_running_loop().create_future()
            if first:
                self._waiters.appendleft(fut)
            else:
                self._waiters.append(fut)
            try:
                # Woken by release(); the periodic look covers capacity freed without one
                # (a reset of the pool after a failover).
                async with asyncio.timeout(min(1.0, max(0.0, deadline - time.monotonic()))):
                    await fut
                return
            except TimeoutError:
                pass
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._wake()  # our turn came as we were cancelled: pass it on
                raise
            finally:
                if not fut.done():
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(fut)
            if self.can_get_connection():
                return
            if time.monotonic() >= deadline:
                raise rexc.ConnectionError(_POOL_EMPTY)
            first = True

    def _wake(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def release(self, connection: Any) -> None:
        try:
            await super().release(connection)
        finally:
            if self._waiters:
                self._wake()

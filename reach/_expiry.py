"""Time limits for single awaits on the hot path: one loop timer for all of them.

Every round trip of a request passes a few time limits: the bound on a socket write, on a
reply's read, on the caller's wait for its reply. ``asyncio.timeout`` costs about 4.5 µs a
use on this project's test machine (a timer handle made, pushed on the loop's heap and
cancelled, each time) and ``anyio.move_on_after`` 6 (``python bench/expiry_cost.py``); a
lone request crosses about nine of them, caller and worker (``bench/request_calls.py``). Most limits are long (seconds) and their awaits end within microseconds, so, as the
worker's :class:`~reach._worker.cancelling.Deadlines` does for handlers, :class:`expire_after`
notes each limit in a heap of its event loop and keeps one timer per loop, armed for the
earliest limit noted; the timer moves only when a limit earlier than all the others
starts.

The contract is ``asyncio.timeout``'s: at the limit the task's await is cancelled, and
that cancellation (only that one) comes out of the block as :class:`TimeoutError`; a
cancellation from anyone else passes through as it is.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import weakref
from types import TracebackType
from typing import Self


class _Limits:
    """The limits under way on one event loop, in a heap by when each expires, and its one
    timer, armed for the earliest. A limit whose block ended stays in the heap, marked
    ended, until it comes to the top or the ended ones outnumber the others (then the heap
    is rebuilt without them): most limits end long before they expire (a request's wait
    may be an hour long), and taking one out of the middle of a heap is not cheaper."""

    __slots__ = ("__weakref__", "_at", "_count", "_timer", "ended", "heap", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, expire_after]] = []  # (expires at, order, limit)
        self.ended = 0  # limits in the heap whose block ended first
        self._count = itertools.count()  # the order of equal times (limits do not compare)
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires

    def add(self, limit: expire_after, at: float) -> None:
        heapq.heappush(self.heap, (at, next(self._count), limit))
        if at < self._at:
            self._arm(at)

    def end(self) -> None:
        """A limit's block ended before the limit (it stays in the heap, marked)."""
        self.ended += 1
        if self.ended > _COMPACT_AT and 2 * self.ended > len(self.heap):
            self.heap = [e for e in self.heap if e[2].live]
            heapq.heapify(self.heap)
            self.ended = 0

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = self.loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        heap = self.heap
        # The loop runs a timer up to its clock's resolution early: a limit due within a
        # millisecond is taken as due (not the timer armed again for it at once).
        now = self.loop.time() + 0.001
        while heap and (heap[0][0] <= now or not heap[0][2].live):
            limit = heapq.heappop(heap)[2]
            if limit.live:
                limit._expire()
            else:
                self.ended -= 1
        if heap:
            self._arm(heap[0][0])


_COMPACT_AT = 64  # ended limits a heap holds at least before it is rebuilt without them


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Limits] = (
    weakref.WeakKeyDictionary()
)
_last: _Limits | None = None  # the loop looked up last: most processes run one


def _limits(loop: asyncio.AbstractEventLoop) -> _Limits:
    global _last
    last = _last
    if last is not None and last.loop is loop:
        return last
    got = _by_loop.get(loop)
    if got is None:
        got = _by_loop[loop] = _Limits(loop)
    _last = got
    return got


class expire_after:
    """Raise :class:`TimeoutError` out of the block if it has not ended within ``delay_s``
    seconds (None: no limit), cancelling the task's await at that moment, as
    ``asyncio.timeout(delay_s)`` does. A plain (not async) context manager, entered inside
    a task: ``with expire_after(5.0): reply = await read()``."""

    __slots__ = ("_cancelling", "_delay_s", "_fired", "_table", "_task", "live")

    def __init__(self, delay_s: float | None) -> None:
        self._delay_s = delay_s
        self._table: _Limits | None = None
        self._fired = False
        self.live = False  # noted in its loop's table, its block not ended, not expired

    def __enter__(self) -> Self:
        delay_s = self._delay_s
        if delay_s is None:
            return self
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("expire_after() is used inside a task, within its event loop")
        self._task = task
        # Cancellations asked before the block are not ours to take back (asyncio.timeout
        # counts them the same way).
        self._cancelling = task.cancelling()
        loop = task.get_loop()
        table = self._table = _limits(loop)
        self.live = True
        table.add(self, loop.time() + delay_s)
        return self

    def _expire(self) -> None:
        self.live = False
        self._fired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        table = self._table
        if table is None:
            return
        if self.live:
            self.live = False
            table.end()
        # Ours fired: its cancellation is taken back; it ended the block (a CancelledError
        # coming out of it) only if no other cancellation is pending besides it.
        if (
            self._fired
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc

    @property
    def expired(self) -> bool:
        """Whether the limit was reached (the block was cancelled for it)."""
        return self._fired

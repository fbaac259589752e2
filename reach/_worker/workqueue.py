"""The handler pool's queue (:class:`WorkQueue`): claimed deliveries in order, for the
pool's tasks of :class:`reach._worker.execution.Execution`."""

from __future__ import annotations

import asyncio
from collections import deque

from .items import Delivery


class WorkQueue:
    """The handler pool's queue: claimed deliveries in order, for the pool's tasks.

    A task that finishes a handler takes the next item at once, without a trip through
    the event loop, so a batch of quick handlers runs in one go (an anyio memory stream
    pays a checkpoint and a wake-up per item). Idle tasks are woken one at a time: a put
    wakes one only when no wake-up is on its way already, and a task that takes an item
    while more wait wakes the next. So a batch put at once costs about two wake-ups, not
    one per item (a wake-up is a future, a loop callback and a task step: more than a
    quick handler), while a handler that waits still lets the rest of its batch start,
    one more task per event-loop turn. The worker runs on asyncio (redis-py's asyncio
    client), hence asyncio futures.
    """

    def __init__(self) -> None:
        self._items: deque[Delivery] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._retiring: deque[asyncio.Future[None]] = deque()
        self._woken = 0  # idle tasks woken that have not run yet

    @property
    def waiting(self) -> int:
        """Items put and not taken yet."""
        return len(self._items)

    def put(self, it: Delivery) -> None:
        self._items.append(it)
        if not self._woken:  # else the task on its way takes it, or wakes the next
            self._wake()

    def _wake(self) -> None:
        while self._idle:
            fut = self._idle.popleft()
            if not fut.done():
                fut.set_result(None)
                self._woken += 1
                return

    def take_all(self) -> list[Delivery]:
        """Every item put and not taken yet (the queue is left empty)."""
        items = list(self._items)
        self._items.clear()
        return items

    def retire(self) -> asyncio.Future[None]:
        """Ask one task to leave the pool (a handler that waited for input takes its
        slot): the next task to ask for an item, ahead of the items queued, gets None and
        ends. The future is done once one has."""
        fut = asyncio.get_running_loop().create_future()
        self._retiring.append(fut)
        self._wake()
        return fut

    def take(self) -> Delivery | None:
        """The next item, if one waits and no task is to retire now; else None (then
        :meth:`get` waits, or retires this task)."""
        if not self._items or self._retiring:
            return None
        it = self._items.popleft()
        if self._items and not self._woken:
            self._wake()  # as in get
        return it

    async def get(self) -> Delivery | None:
        """The next item, waiting for one if none is there; None: this task retires."""
        while not self._items:
            if self._retiring:
                self._retire()
                return None
            fut = asyncio.get_running_loop().create_future()
            self._idle.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():  # woken as it was cancelled
                    self._woken -= 1
                    if self._items or self._retiring:
                        self._wake()  # pass the item on
                raise
            self._woken -= 1
        if self._retiring:
            self._retire()
            return None
        it = self._items.popleft()
        if self._items and not self._woken:
            # The rest of the batch: taken by this task after its handler if that one
            # returns at once, else by the task woken here while it waits.
            self._wake()
        return it

    def _retire(self) -> None:
        fut = self._retiring.popleft()
        if not fut.done():
            fut.set_result(None)
        if (self._items or self._retiring) and not self._woken:
            self._wake()  # this task leaves: another takes up what waits

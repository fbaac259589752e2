"""Handlers waiting for input (``ctx.ask``, reach.asking) give their slot back.

The handler pool has ``concurrency`` tasks, each running one handler at a time. A handler
that waits for an answer would hold its task, and so its slot, for as long as a person
takes; instead its slot is given back: the pool gets one more task (which takes the next
message), and the inflight count, which the consumer reads ahead by, drops by one. When the
answer comes the handler takes a slot again: the pool's next task to come round for work
retires instead (:meth:`reach._worker.workqueue.WorkQueue.retire`), ahead of any message
queued, and the handler goes on in the slot it left. At most ``max_waiting_handlers``
handlers wait so; the next ones wait in their slots.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import WorkerState
    from .workqueue import WorkQueue


class WaitingSlots:
    """The slots of handlers waiting for input, lent back to the pool (reach.asking.Slots)."""

    def __init__(self, state: WorkerState, work: WorkQueue, *, limit: int) -> None:
        self.state = state
        self.work = work
        self.limit = limit
        self.spawn: Callable[[], Any] | None = None  # one more pool task (set by the pool)
        self.waiting = 0  # handlers waiting now with their slots given back

    def give_back(self) -> bool:
        if self.waiting >= self.limit or self.spawn is None:
            return False
        self.waiting += 1
        self.state.inflight -= 1
        self.spawn()
        self.state.slot_freed()
        return True

    async def take_again(self) -> None:
        turn: asyncio.Future[None] = self.work.retire()
        try:
            await turn
        finally:  # cancelled meanwhile: a task still retires (the pool has one too many)
            self.waiting -= 1
            self.state.inflight += 1

    def forget(self) -> None:
        self.waiting -= 1
        self.state.inflight += 1
        self.work.retire()

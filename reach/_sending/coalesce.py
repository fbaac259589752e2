"""Coalesced single deliveries: the inbox writes of concurrent ``Client.send`` and
``Client.request`` calls, gathered into batches (standalone Redis).

A delivery issued while no call awaits Redis goes out at once, as its own ``send.lua``
call (a lone caller waits for nothing); the others go out together at the end of the
event-loop turn, one ``send.lua`` call of the batch form per agent, as ``send_many`` sends
them. (Sending the first of every turn alone, as before, made a busy client alternate
calls of one message with calls of the rest: 1,024 of 1,422 calls carried one message in
``reach bench``'s streaming phase, each paying a script call's fixed cost.) At most
``SENDS_IN_FLIGHT`` such calls await Redis at once: the messages issued while they do wait
for one to return and then go out together, so a busy client's batches grow with its load
(as Nagle's algorithm groups a socket's small writes) instead of being cut at every turn.
A lone call waits for nothing; many concurrent ones cost Redis and the client one script
call per agent and batch instead of one per message.
"""

from __future__ import annotations

import asyncio

from .._autopipe import AutoPipeline
from ..keys import Keys
from ..scripts import inbox

# Coalesced single deliveries: at most this many send.lua calls of one client await Redis
# at once; messages issued meanwhile wait for one to return and go out together. Two keep
# Redis busy while the client reads an answer and writes the next batch; one more call
# (a third in flight) only splits the same messages into smaller batches, each paying a
# script call's fixed cost in Redis.
SENDS_IN_FLIGHT = 2


class Coalescer:
    """Adds single messages to inboxes through ``commands`` (standalone Redis), coalescing
    concurrent ones: see the module docstring."""

    def __init__(self, commands: AutoPipeline, keys: Keys, *, ttl_ms: int) -> None:
        self.commands = commands
        self.keys = keys
        self.ttl_ms = ttl_ms
        self._turn = False  # an end-of-turn flush is scheduled
        self._in_flight = 0  # send.lua calls awaiting Redis (at most SENDS_IN_FLIGHT)
        self._group: list[tuple[inbox.Delivery, asyncio.Future[inbox.Sent]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, d: inbox.Delivery) -> inbox.Sent:
        """Add ``d.message`` to the inbox of ``d.agent_id`` (see :func:`reach.scripts.inbox.send`;
        errors raise as there)."""
        loop = asyncio.get_running_loop()
        if not self._in_flight and not self._turn and not self._group:
            # Nothing in flight, nothing waiting: at once, alone (a lone caller waits for
            # nothing). With a call in flight it waits for the turn's end and goes with
            # the others: the batches then grow with the load.
            self._turn = True
            loop.call_soon(self._end_turn)
            self._in_flight += 1
            try:
                return await inbox.send(
                    self.commands,
                    self.keys,
                    d.message,
                    cluster=False,
                    agent_id=d.agent_id,
                    priority=d.priority,
                    ttl_ms=self.ttl_ms,
                    max_queue=d.max_queue,
                    claim_for=d.claim_for,
                    claim_lease_ms=d.claim_lease_ms,
                )
            finally:
                self._returned()
        fut: asyncio.Future[inbox.Sent] = loop.create_future()
        self._group.append((d, fut))
        if not self._turn:
            self._turn = True
            loop.call_soon(self._end_turn)
        return await fut

    def _end_turn(self) -> None:
        self._turn = False
        if self._in_flight < SENDS_IN_FLIGHT:
            self._flush()
        # else the group waits for a call to return (_returned flushes it)

    def _returned(self) -> None:
        """A send.lua call returned: what waits goes out now, unless the turn's end will
        send it anyway."""
        self._in_flight -= 1
        if not self._turn:
            self._flush()

    def _flush(self) -> None:
        group, self._group = self._group, []
        group = [(d, f) for d, f in group if not f.done()]  # a cancelled caller: not sent
        if group:
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send_group(group))
            self._tasks.add(task)  # held until done (the loop keeps weak references)
            task.add_done_callback(self._group_done)

    def _group_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._returned()

    async def _send_group(
        self, group: list[tuple[inbox.Delivery, asyncio.Future[inbox.Sent]]]
    ) -> None:
        try:
            sent = await inbox.send_many(
                self.commands, self.keys, [d for d, _ in group], cluster=False, ttl_ms=self.ttl_ms
            )
        except BaseException as e:  # send_many reports in place: only a bug or cancellation
            for _, fut in group:
                if fut.done():
                    continue
                if isinstance(e, Exception):
                    fut.set_exception(e)
                else:
                    fut.cancel()
            raise
        for (_, fut), x in zip(group, sent, strict=True):
            if fut.done():
                continue
            if isinstance(x, Exception):
                fut.set_exception(x)
            else:
                fut.set_result(x)

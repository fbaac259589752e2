"""Cancelling: what the worker does when a message it holds is cancelled.

``cancel.lua`` (reach._cancel) marks the message's idempotency record ``cancelled`` and
raises its fence; then every claim of it answers CANCELLED and any completion of the run
it fenced out is refused. That alone is correct but slow for a running handler (it would
run to its end, and its entry would wait for the next pending scan). So the worker also
reads the namespace's cancel notices (``Keys.cancels``: a non-blocking ``XREAD`` every
:data:`POLL_S` on the shared command connection while it runs handlers, none while it
runs none) and, for a message it holds:

* not started yet (read ahead, or claimed at send and waiting for a slot): the handler is
  never called; it is settled as cancelled;
* running: ``ctx.cancelled`` is set at once (``await ctx.wait_cancelled()`` returns), the
  messages the handler sent through ``ctx.client`` are cancelled, and after
  ``cancel_grace_s`` the handler's cancel scope is cancelled. Whatever it returns, the
  message ends cancelled.

"Settled as cancelled": its caller gets a ``dead`` reply with reason ``cancelled``
(:class:`reach.Cancelled`), the dead letter is filed (reason ``cancelled``), the entry is
acked; the record is not completed (it says ``cancelled`` already, and its fence refuses
this run's completion).

One runtime per process and namespace reads the notices (one read per poll, whatever the
number of agents the process hosts: :class:`CancelPeers`) and hands each to every agent of
that namespace in the process; when it stops, another takes over from the last notice read.

A notice is a hint, not an order: it is anyone's to write (garbage, a forged msg_id). The
worker acts on one only after reading the record's status (``cancelled``), and only for a
record it holds; a notice it cannot read is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from typing import Any

import anyio
from redis import exceptions as rexc

from .._cancel import cancel_message
from ..envelope import Envelope
from ..outcomes import DeadReason, Outcome, Status
from ..untrusted import safe_text
from .state import Part, Shared

log = logging.getLogger("reach.runtime")

HEARD_KEPT = 10_000
"""Records named by notices while nothing here ran them: kept (newest) so a message read
after its cancel notice is checked before it starts."""
POLL_S = 0.05
"""How often the notices are read while a handler runs (none are read while none runs)."""
READ_COUNT = 256


class Run:
    """One handler run that may be cancelled: ``requested`` once its message is
    (``ctx.cancelled``; :meth:`wait` returns then); the handler's task (``task``: an async
    handler) or cancel scope (``scope``: a plain one, in a thread) is cancelled after the
    grace (``cut``) or at the deadline (``expired``, an async handler: :meth:`expire`);
    ``children`` are the msg_ids it sent through ``ctx.client``."""

    __slots__ = (
        "_cancels",
        "_event",
        "children",
        "cut",
        "expired",
        "msg_id",
        "preempted",
        "preemptible",
        "record",
        "requested",
        "scope",
        "task",
        "timer",
    )

    def __init__(self, record: str, msg_id: str, cancels: Cancels) -> None:
        self._cancels = cancels
        self.record = record
        self.msg_id = msg_id
        self.requested = False
        self._event: anyio.Event | None = None  # made when a handler waits for it
        self.scope: anyio.CancelScope | None = None
        self.task: asyncio.Task[Any] | None = None
        self.children: list[str] = []
        self.cut = False  # the grace passed and the handler was cancelled
        self.expired = False  # its deadline passed and the handler was cancelled
        self.timer: asyncio.TimerHandle | None = None
        self.preemptible = False  # a low-priority run that may be cut for high work
        self.preempted = False  # it was cut for high work: requeued, not cancelled

    async def wait(self) -> None:
        """Return once the message is cancelled (reach.context.CancelState)."""
        if not self.requested:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()

    def child(self, msg_id: str) -> None:
        """The handler sent ``msg_id`` through ``ctx.client`` (reach.context.CancelState)."""
        self._cancels.added_child(self, msg_id)

    def request(self) -> None:
        self.requested = True
        if self._event is not None:
            self._event.set()

    def expire(self) -> None:
        """The message's deadline passed while its async handler ran: cancel its task
        (the worker's loop timer calls this; reach._worker.execution ends it timed out)."""
        if self.task is not None and not self.cut:
            self.expired = True
            self.task.cancel()

    def cut_now(self) -> None:
        self.cut = True
        if self.scope is not None:
            self.scope.cancel()
        elif self.task is not None:
            self.task.cancel()  # the handler's own task: _call takes the cancel back


class Deadlines:
    """Ends async handlers at their message's deadline (:meth:`Run.expire`) with one loop
    timer for every run of a worker, armed for the earliest deadline of the runs going on.
    A timer (or an anyio cancel scope) per message cost more than a quick handler: most
    deadlines are far off (a send's default is an hour) and their runs end long before,
    so adding and removing a run is a dict write, and the timer moves only when a run
    with an earlier deadline starts."""

    def __init__(self) -> None:
        self._runs: dict[Run, float] = {}  # run -> its deadline on the loop's clock
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires
        # The worker's loop, looked up at the first run (on Python 3.11 each lookup asks
        # the kernel for the process id): each runtime's run makes its own Deadlines, on
        # the one loop it runs on.
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, run: Run, timeout_s: float) -> None:
        """``run``'s handler must end within ``timeout_s`` (<= 0: at once)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        at = loop.time() + max(timeout_s, 0.0)
        self._runs[run] = at
        if at < self._at:
            self._arm(loop, at)

    def discard(self, run: Run) -> None:
        """``run`` ended (its timer, if it is the earliest, fires later and finds none)."""
        self._runs.pop(run, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = loop.call_at(at, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._at = None, math.inf
        now = loop.time()
        for run, at in [(r, a) for r, a in self._runs.items() if a <= now]:
            del self._runs[run]
            run.expire()
        if self._runs:
            self._arm(loop, min(self._runs.values()))


def cancelled_outcome(env: Envelope, *, running: bool) -> Outcome:
    """How a cancelled message ends: dead, reason ``cancelled``."""
    why = "cancelled while it ran" if running else "cancelled before it started"
    return Outcome(Status.DEAD, DeadReason.CANCELLED, why, "Cancelled")


class CancelPeers:
    """The runtimes of one namespace in one process (and event loop): the notices are read
    by one of them (``reader``) for all (``members``), from ``last_id`` on."""

    def __init__(self) -> None:
        self.members: list[Cancels] = []
        self.reader: Cancels | None = None
        self.last_id: Any = None  # the last notice read (None: start from the newest)
        self.changed = anyio.Event()  # the reader left
        self.busy = anyio.Event()  # set when a handler starts: the reader reads again
        self.busy_set = False  # whether busy is set (read per handler start: no calls)

    def running(self) -> bool:
        """Some member runs a handler now."""
        return any(m.runs for m in self.members)


class Cancels(Part):
    """The runs of this worker that a cancel may reach, and the reader of the notices."""

    def __init__(self, shared: Shared, *, client: Any, peers: CancelPeers | None = None) -> None:
        super().__init__(shared)
        self.client = client  # ctx.client's Client: cancels the children
        self.runs: dict[str, Run] = {}  # idempotency record -> its run here
        self.heard: OrderedDict[str, None] = OrderedDict()
        self.peers = peers if peers is not None else CancelPeers()
        self.notices_read = 0  # notices read (tests, and `reach top` one day)
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the runs ---------------------------------------------------------------------
    def begin(self, record: str, msg_id: str) -> Run:
        run = self.runs[record] = Run(record, msg_id, self)
        peers = self.peers
        if not peers.busy_set:
            peers.busy_set = True
            peers.busy.set()
        return run

    def end(self, run: Run) -> None:
        if self.runs.get(run.record) is run:
            del self.runs[run.record]
        if run.timer is not None:
            run.timer.cancel()

    def heard_of(self, record: str) -> bool:
        """A notice named ``record`` (check it with :meth:`confirmed` before running)."""
        return record in self.heard

    async def confirmed(self, record: str) -> bool:
        """True when ``record`` says its message is cancelled. A failed read says False:
        the handler runs, and its fenced completion ends it as cancelled anyway."""
        try:
            status = await self.redis.hget(record, "status")
        except (rexc.RedisError, OSError) as e:
            log.warning("reading the status of %s failed (%s); it runs", record, e)
            return False
        return status is not None and safe_text(status) == Status.CANCELLED

    def added_child(self, run: Run, msg_id: str) -> None:
        """The handler of ``run`` sent ``msg_id`` through ``ctx.client``; sent after its
        own cancel, it is cancelled at once."""
        run.children.append(msg_id)
        if run.requested:
            self._spawn(self._cancel_children(run.msg_id, [msg_id]))

    # -- the notices ------------------------------------------------------------------
    async def watch_when_free(self) -> None:
        """Take part in the process's notices for this namespace until stopped: read them
        for every member while no other member does (the first one reads; when it stops,
        the next takes over from the last notice read)."""
        peers = self.peers
        peers.members.append(self)
        try:
            while True:
                if peers.reader is None:
                    peers.reader = self
                    try:
                        await self.watch()
                    finally:
                        peers.reader = None
                        peers.changed.set()
                        peers.changed = anyio.Event()
                await peers.changed.wait()
        finally:
            peers.members.remove(self)

    async def watch(self) -> None:
        """Read the cancel notices and hand each to every member: every :data:`POLL_S`
        while a member runs a handler, on the shared command connection (no blocking read:
        no connection of its own); nothing while none runs. Never dies (errors are logged,
        the read goes on from where it was)."""
        peers = self.peers
        delay = 0.1
        while True:
            try:
                if peers.last_id is None:
                    # Where the notices end now, before any handler runs here: a notice
                    # added after this is read, whenever the first read comes.
                    peers.last_id = await self._tail()
                if not peers.running():
                    ev = peers.busy = anyio.Event()
                    peers.busy_set = False
                    if not peers.running():
                        await ev.wait()
                res = await self.redis.xread({self.keys.cancels: peers.last_id}, count=READ_COUNT)
                delay = 0.1
                n = 0
                for _, entries in res or ():
                    for entry_id, fields in entries:
                        n += 1
                        peers.last_id = entry_id
                        self.notices_read += 1
                        for member in list(peers.members):
                            await member._on_notice(fields)
                if n < READ_COUNT:
                    await anyio.sleep(POLL_S)
            except (rexc.RedisError, OSError) as e:
                self.outages.failed("cancel notices read", e)
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except Exception:  # a bug, not data (notices are parsed defensively)
                log.exception("cancel watcher error; it goes on")
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _tail(self) -> Any:
        """The id of the newest notice now (read from there on), '0-0' when none; a key of
        another type is read from '0-0' (and fails, logged, until it is a stream)."""
        try:
            last = await self.redis.xrevrange(self.keys.cancels, count=1)
        except rexc.ResponseError:
            return "0-0"
        return last[0][0] if last else "0-0"

    async def _on_notice(self, fields: Any) -> None:
        if not isinstance(fields, dict):
            return
        record = fields.get(b"k")
        if not isinstance(record, bytes) or not record or len(record) > 2048:
            return
        key = safe_text(record)  # bytes that are no UTF-8 name no run: not an error
        run = self.runs.get(key)
        if run is None:
            self.heard[key] = None
            self.heard.move_to_end(key)
            while len(self.heard) > HEARD_KEPT:
                self.heard.popitem(last=False)
            return
        if run.requested or not await self.confirmed(key):
            return
        self.cancel_run(run)

    def cancel_run(self, run: Run) -> None:
        """Tell the handler (``ctx.cancelled``), cancel its children, and cut it after the
        grace."""
        if run.requested:
            return
        run.request()
        log.info("message %s cancelled while it runs", run.msg_id[:64])
        if run.children:
            self._spawn(self._cancel_children(run.msg_id, list(run.children)))
        grace = self.opts.cancel_grace_s
        if grace <= 0:
            run.cut_now()
        else:
            run.timer = asyncio.get_running_loop().call_later(grace, run.cut_now)

    async def _cancel_children(self, parent: str, children: list[str]) -> None:
        for child in children:
            try:
                await cancel_message(
                    self.client.commands,
                    self.keys,
                    child,
                    cluster=self.cluster,
                    by=f"the cancel of its parent {parent[:64]}",
                    audited=False,  # the parent's own cancel is recorded
                )
            except Exception as e:  # noqa: BLE001 - one child's failure is logged alone
                log.warning("cancelling child %s of %s failed: %s", child, parent, e)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # held until done (the loop keeps weak references)
        task.add_done_callback(self._tasks.discard)

"""Priority preemption: make room for high-priority work on an agent saturated with
low-priority handlers (``RuntimeOptions.preempt_after_s``; off by default).

While every handler slot is taken and some of the runs are low-priority runs of
preemptible handlers, the worker looks at its high-priority inbox every
``preempt_after_s / 2``: the entries there that it has not read (``XLEN`` minus those it
holds) are high-priority messages waiting for a slot. Once one has waited
``preempt_after_s``, the worker cuts as many low-priority runs as there are such messages
(the youngest first: the least work lost). A cut run's handler sees ``ctx.cancelled`` and
its task or cancel scope is cancelled at once; the message goes back, through the delayed
set, to be routed again, its attempt not counted (execution.py settles it so), and the
freed slot reads the high-priority inbox first (``fetch.lua``).

Aging: a message carries how often it was preempted (the envelope's ``preempts``, a
field the runtime rewrites, outside the sender's signature); at ``max_preempts`` it is no longer preemptible and runs to its
end, so low priority still progresses under sustained high load (besides the starvation
guard of ``fetch.lua``, which keeps slots for lower priorities).
"""

from __future__ import annotations

import logging
import time

import anyio
from redis import exceptions as rexc

from ..connection import as_text
from ..envelope import Envelope
from .cancelling import Cancels, Run
from .state import Part, Shared

log = logging.getLogger("reach.runtime")


def preempted_times(env: Envelope) -> int:
    """How many times ``env`` was preempted."""
    return env.preempts


class Preemption(Part):
    """Watches the high-priority inbox while low-priority work fills every slot."""

    def __init__(self, shared: Shared, *, cancels: Cancels) -> None:
        super().__init__(shared)
        self.cancels = cancels
        self.high = self.keys.inbox(self.agent_id, "high")
        self.preempted = 0  # runs cut for high work (tests, bench)
        self._waiting_since: float | None = None

    def victims(self) -> list[Run]:
        """The runs that may be cut now, the youngest first."""
        runs = [r for r in self.cancels.runs.values() if r.preemptible and not r.requested]
        return runs[::-1]  # dict order is start order

    async def watch(self) -> None:
        """Look at the high inbox while saturated; never dies."""
        after = self.opts.preempt_after_s
        if after is None:
            return
        every = max(0.01, after / 2)
        while True:
            await anyio.sleep(every)
            try:
                await self.check(after)
            except (rexc.RedisError, OSError) as e:
                self.outages.failed("preemption check", e)
            except Exception:  # a bug: log, go on
                log.exception("preemption check failed; it goes on")

    async def check(self, after: float) -> None:
        st = self.state
        if st.inflight < self.opts.concurrency or not any(
            r.preemptible for r in self.cancels.runs.values()
        ):
            self._waiting_since = None
            return
        held = sum(1 for stream, _ in st.held if stream == self.high)
        waiting = int(await self.redis.xlen(self.high)) - held
        if waiting <= 0:
            self._waiting_since = None
            return
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since < after:
            return
        self._waiting_since = None
        for run in self.victims()[:waiting]:
            self.preempt(run)

    def preempt(self, run: Run) -> None:
        run.preempted = True
        self.preempted += 1
        log.info("message %s preempted for high-priority work", as_text(run.msg_id)[:64])
        run.request()  # ctx.cancelled
        run.cut_now()

"""The sweeper task: cluster-wide chores, done by whichever agent holds the sweeper lock.

Each pass (every ``sweep_interval_s``, jittered) runs sweep.lua on the registry shards
whose sweeper lock this process holds, and tries a few others in turn
(:func:`shards_to_try`: a quarter of them, at least one), so a fleet of processes sends
about ``shards / 4`` refused sweep calls per process and pass, not one per shard, and the
shards of a holder that died are taken over within 4 passes of its locks' expiry (leases,
evictions, the lock: on a Cluster several processes may sweep different shards). For the
holder of shard 0's lock,
the chores of reach.sweeper (due retries, evicted inboxes, parked messages...), and
between passes due retries and scheduled sends as they come due. Every few
seconds the registry is counted for the ``on_registry_counts`` hook (shard 0's lock
holder's counts; the others report none): one ``count_agents.lua`` call per shard reading
at most ``metrics.COUNT_SAMPLE`` records in all, so the count costs the same at 10,000
agents as at 1,000 (exact up to that many, sampled above), and only while a hook uses
the counts (the metrics' gauges: while they are scraped, ``metrics.COUNTS_WANTED_S``).
"""

from __future__ import annotations

import logging
import random
import time

import anyio
from redis import exceptions as rexc

from .. import metrics
from ..client import Client
from ..clock import now_ms
from ..errors import RedisUnavailable
from ..registry import MAX_LOCK_MS, Registry
from ..sweeper import SCHEDULED_BATCH, move_due, move_scheduled, sweep_chores
from .state import Shared

log = logging.getLogger("reach.runtime")

DUE_POLL_S = 0.2
"""Between two passes, how often the chores' holder looks at the delayed set while it holds
entries: a retry or a message held back by a rate limit is moved when it is due, not up
to a whole sweep interval later (a rate-limited backlog would otherwise drain at one start
per pass)."""
MIN_DUE_SLEEP_S = 0.005
SCHEDULE_ROUND_S = 0.01
"""The shortest time between two rounds of the scheduled sends' mover: sends due within it
of each other are taken and placed together (each round costs a script call, the
placements and a removal), so a steady stream of due sends is moved in rounds of many,
each at most this late on their account."""
SCHEDULE_POLL_S = 0.05
"""The longest the mover waits between two takes: a send scheduled meanwhile with an
earlier due time than the mover knew of (one due in less than this, scheduled while the
set was idle) is seen within it. The mover sleeps locally, never in a blocking read: a
worker process keeps its two connections per node (a blocking read would hold a third,
and its timeout fires up to a server tick late: 100 ms at Redis's default ``hz 10``)."""


def shards_to_try(shards: int, held: set[int], turn: int) -> list[int]:
    """The shards a sweep pass tries: those whose lock this process ``held`` after the last
    pass, and ``ceil(shards / 4)`` of the others, the ``turn``-th group of them in turn."""
    others = [k for k in range(shards) if k not in held]
    if not others:
        return sorted(held)
    per = max(1, -(-shards // 4))
    groups = -(-len(others) // per)
    at = (turn % groups) * per
    return sorted(held | set(others[at : at + per]))


async def _move_due_between_passes(shared: Shared, client: Client, pause_s: float) -> None:
    """Sleep ``pause_s``, moving delayed entries to inboxes as they come due meanwhile.

    Only while the delayed set holds something: an empty one is looked at again at the
    next pass (an idle namespace costs one ZRANGE per pass, not one every
    :data:`DUE_POLL_S`)."""
    redis, keys = shared.redis, shared.keys
    end = time.monotonic() + pause_s
    while (left := end - time.monotonic()) > 0:
        try:
            first = await redis.zrange(keys.delayed, 0, 0, withscores=True)
            if not first:
                await anyio.sleep(left)
                return
            due_in = (float(first[0][1]) - now_ms()) / 1000  # move_due's clock
            if due_in > 0:
                await anyio.sleep(max(MIN_DUE_SLEEP_S, min(due_in, DUE_POLL_S, left)))
                continue
            moved = await move_due(redis, keys, client, dlq_maxlen=shared.opts.dlq_maxlen)
            if moved.retried == 0:  # due, but nowhere to go yet: not a busy loop
                await anyio.sleep(min(DUE_POLL_S, max(0.0, end - time.monotonic())))
            else:
                await anyio.lowlevel.checkpoint()
        except (rexc.RedisError, OSError, ValueError, TypeError, IndexError) as e:
            # Redis away or a delayed set that is not ours to read: the pass deals with it.
            log.debug("moving due entries between passes failed: %s", e)
            await anyio.sleep(max(0.0, end - time.monotonic()))
            return


class _Scheduler:
    """Sends scheduled sends as they come due (reach.scheduling), while this process holds
    the namespace's chores (:meth:`hold`, after each sweep pass).

    Each round takes what is due (``take_due.lua``) and places it, then sleeps until the
    next due time the take reported, at most :data:`SCHEDULE_POLL_S` and at least
    :data:`SCHEDULE_ROUND_S`. Idle, it costs one script call every ``SCHEDULE_POLL_S``,
    in the one process holding the chores; in the others, nothing."""

    def __init__(self, shared: Shared, client: Client) -> None:
        self.shared, self.client = shared, client
        self.holding = False
        self._changed = anyio.Event()

    def hold(self, holding: bool) -> None:
        if holding != self.holding:
            self.holding = holding
            self._changed.set()

    async def run(self) -> None:
        while True:
            if not self.holding:
                self._changed = anyio.Event()
                await self._changed.wait()
                continue
            try:
                await self._round()
            except (rexc.RedisError, OSError, RedisUnavailable) as e:
                # Redis away, or keys that are not ours to read: the passes log it.
                log.debug("moving scheduled sends failed: %s", e)
                await anyio.sleep(DUE_POLL_S)
            except Exception:  # entries have their own barrier: this is a bug, not data
                log.exception("moving scheduled sends failed; trying again")
                await anyio.sleep(self.shared.opts.sweep_interval_s)

    async def _round(self) -> None:
        shared = self.shared
        redis, keys = shared.redis, shared.keys
        _, taken = await move_scheduled(redis, keys, self.client, dlq_maxlen=shared.opts.dlq_maxlen)
        if len(taken.entries) >= SCHEDULED_BATCH:  # more may be due already
            await anyio.lowlevel.checkpoint()
            return
        wait_s = SCHEDULE_POLL_S
        if taken.next_ms >= 0:
            wait_s = min(wait_s, (taken.next_ms - taken.now_ms) / 1000)
        # Sends due close together go in one round.
        await anyio.sleep(max(SCHEDULE_ROUND_S, wait_s))


async def sweep_forever(shared: Shared, *, client: Client, registry: Registry) -> None:
    """Sweep until cancelled; failures are logged and the next pass tries again. While
    this process holds the chores, its :class:`_Scheduler` sends scheduled sends as they
    come due, beside the passes."""
    scheduler = _Scheduler(shared, client)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scheduler.run)
        await _sweep_passes(shared, client, registry, scheduler)


async def _sweep_passes(
    shared: Shared, client: Client, registry: Registry, scheduler: _Scheduler
) -> None:
    opts, redis, keys, hooks = shared.opts, shared.redis, shared.keys, shared.hooks
    lock_ms = min(int(max(opts.sweep_interval_s * 3, 1.0) * 1000), MAX_LOCK_MS)
    counted = 0.0
    held: set[int] = set()
    turn = random.randrange(max(1, registry.shards))  # processes start at different shards
    chores = False  # this process held shard 0's lock at the last pass: it runs the chores
    while True:
        pause_s = opts.sweep_interval_s * (0.8 + 0.4 * random.random())
        if chores:
            await _move_due_between_passes(shared, client, pause_s)
        else:
            await anyio.sleep(pause_s)
        turn += 1
        try:
            res = await registry.sweep(
                owner=shared.state.instance_id,
                lock_ms=lock_ms,
                shadow_ttl_ms=int(opts.shadow_ttl_s * 1000),
                shards=shards_to_try(registry.shards, held, turn),
            )
            held = set(res.held)
            chores = res.chores
            scheduler.hold(res.chores)
            if res.evicted:
                log.warning("evicted: %s", ", ".join(res.evicted))
            if res.chores:
                await sweep_chores(redis, keys, client, registry, dlq_maxlen=opts.dlq_maxlen)
            if time.monotonic() - counted >= max(5.0, opts.sweep_interval_s):
                counted = time.monotonic()  # registry gauges: only shard 0's lock holder's
                if not res.chores or not hooks.wants_registry_counts():
                    hooks.on_registry_counts(None, 0)
                else:
                    hooks.on_registry_counts(
                        *await registry.count_states(sample=metrics.COUNT_SAMPLE)
                    )
        except (rexc.RedisError, OSError) as e:
            shared.outages.failed("sweep", e)
        except Exception:  # entries have their own barrier: this is a bug, not data
            log.exception("sweep failed; the next one tries again")

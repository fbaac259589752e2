"""The sweeper task: cluster-wide chores, done by whichever agent holds the sweeper lock.

Each pass (every ``sweep_interval_s``, jittered) runs sweep.lua on the registry shards
whose sweeper lock this process holds, and tries a few others in turn
(:func:`shards_to_try`: a quarter of them, at least one), so a fleet of processes sends
about ``shards / 4`` refused sweep calls per process and pass, not one per shard, and the
shards of a holder that died are taken over within 4 passes of its locks' expiry (leases,
evictions, the lock: on a Cluster several processes may sweep different shards). For the
holder of shard 0's lock,
the chores of reach.sweeper (due retries, evicted inboxes, parked messages...). Every few
seconds the registry is counted for the ``on_registry_counts`` hook (shard 0's lock
holder's counts; the others report none): one ``count_agents.lua`` call per shard reading
at most ``metrics.COUNT_SAMPLE`` records in all, so the count costs the same at 10,000
agents as at 1,000 (exact up to that many, sampled above).
"""

from __future__ import annotations

import logging
import random
import time

import anyio
from redis import exceptions as rexc

from .. import metrics
from ..client import Client
from ..registry import MAX_LOCK_MS, Registry
from ..sweeper import sweep_chores
from .state import Shared

log = logging.getLogger("reach.runtime")


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


async def sweep_forever(shared: Shared, *, client: Client, registry: Registry) -> None:
    """Sweep until cancelled; failures are logged and the next pass tries again."""
    opts, redis, keys, hooks = shared.opts, shared.redis, shared.keys, shared.hooks
    lock_ms = min(int(max(opts.sweep_interval_s * 3, 1.0) * 1000), MAX_LOCK_MS)
    counted = 0.0
    held: set[int] = set()
    turn = random.randrange(max(1, registry.shards))  # processes start at different shards
    while True:
        await anyio.sleep(opts.sweep_interval_s * (0.8 + 0.4 * random.random()))
        turn += 1
        try:
            res = await registry.sweep(
                owner=shared.state.instance_id,
                lock_ms=lock_ms,
                shadow_ttl_ms=int(opts.shadow_ttl_s * 1000),
                shards=shards_to_try(registry.shards, held, turn),
            )
            held = set(res.held)
            if res.evicted:
                log.warning("evicted: %s", ", ".join(res.evicted))
            if res.chores:
                await sweep_chores(redis, keys, client, registry, dlq_maxlen=opts.dlq_maxlen)
            if time.monotonic() - counted >= max(5.0, opts.sweep_interval_s):
                counted = time.monotonic()  # registry gauges: only shard 0's lock holder's
                if not res.chores:
                    hooks.on_registry_counts(None, 0)
                else:
                    hooks.on_registry_counts(
                        *await registry.count_states(sample=metrics.COUNT_SAMPLE)
                    )
        except (rexc.RedisError, OSError) as e:
            shared.outages.failed("sweep", e)
        except Exception:  # entries have their own barrier: this is a bug, not data
            log.exception("sweep failed; the next one tries again")

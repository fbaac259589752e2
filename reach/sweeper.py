"""Cluster-wide chores that any runtime (or ``reach sweep``) may do.

Lease sweeping itself is ``lua/sweep.lua`` (via :meth:`reach.registry.Registry.sweep`);
this module moves work that waits in Redis back into inboxes.
"""

from __future__ import annotations

import logging

from .client import Client
from .connection import AnyRedis
from . import scripts
from .envelope import BadEnvelope, Envelope, Reply, decode_envelope, encode, now_ms
from .keys import Keys
from .tasks import TASK_TTL_MS, dead_letter_op

log = logging.getLogger("reach.sweeper")


async def move_due(redis: AnyRedis, keys: Keys, client: Client, *, limit: int = 200) -> int:
    """Route retries whose backoff is over from the delayed set to a live agent's inbox.

    An entry is removed from the delayed set only after it was added to an inbox, so a
    crash in between delivers it twice at worst (and idempotency runs it once).
    Returns how many were moved; entries with no agent to take them wait for a later sweep.
    """
    due = await redis.zrangebyscore(keys.delayed, "-inf", now_ms(), start=0, num=limit)
    moved = 0
    for data in due:
        try:
            env = decode_envelope(data)
        except BadEnvelope as e:
            log.error("unreadable entry in the delayed set dropped: %s", e)
            await redis.zrem(keys.delayed, data)
            continue
        if env.deadline_ms and env.deadline_ms <= now_ms():
            await expire(redis, keys, env, reason="expired", error="deadline passed while waiting")
            await redis.zrem(keys.delayed, data)
            continue
        try:
            await client.deliver(env)
        except Exception as e:  # no live agent now: it waits for a later sweep
            log.info("retry of %s waits: %s", env.msg_id, e)
            continue
        await redis.zrem(keys.delayed, data)
        moved += 1
    return moved


async def expire(redis: AnyRedis, keys: Keys, env: Envelope, *, reason: str, error: str) -> None:
    """Dead-letter a message whose deadline passed outside any handler, tell the caller."""
    reply = Reply(msg_id=env.msg_id, status="expired", reason=reason, error=error,
                  error_type="DeadlineExceeded", attempt=env.attempt)  # fmt: skip
    rec = keys.idem(env.key)
    ops: list[tuple[object, ...]] = [
        dead_letter_op(keys, capability=env.capability, reason=reason, data=encode(env),
                       error=error, error_type="DeadlineExceeded", attempts=env.attempt,
                       msg_id=env.msg_id),
        ("HSET", rec, "status", "expired", "error", error, "updated_ms", now_ms()),
        ("PEXPIRE", rec, TASK_TTL_MS),
    ]  # fmt: skip
    if env.reply_to:
        rk = keys.replies(env.reply_to)
        ops += [("XADD", rk, "*", "r", encode(reply)), ("PEXPIRE", rk, TASK_TTL_MS)]
    await scripts.run_pipeline(redis, ops)

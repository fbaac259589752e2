"""Cluster-wide chores that any runtime (or ``reach sweep``) may do.

Lease sweeping itself is ``lua/sweep.lua`` (via :meth:`reach.registry.Registry.sweep`);
this module moves work that waits in Redis back into inboxes:

* :func:`move_due` - retries whose backoff is over;
* :func:`reroute_evicted` - the whole inbox (pending and unread, every priority) of an
  agent evicted for good goes to live agents of the capability through the normal policy
  (a session's messages follow their new ring owner); with no live agent they are parked;
* :func:`release_parked` - parked messages go out once an agent of their capability is
  back; parked messages whose deadline passed are dead-lettered as ``expired``.

Every move adds the message to its new place before deleting it from the old one, so a
crash in between delivers it twice at worst, and idempotency runs it once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from . import metrics, scripts
from .client import Client
from .connection import AnyRedis, as_text
from .envelope import BadEnvelope, Envelope, Reply, decode_envelope, decode_reply, encode, now_ms
from .errors import NoAgentAvailable
from .keys import GROUP, Keys
from .registry import Registry
from .tasks import MALFORMED_CAP, TASK_TTL_MS, dead_letter_op

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
        except Exception as e:  # noqa: BLE001 - no live agent now: it waits for a later sweep
            log.info("retry of %s waits: %s", env.msg_id, e)
            continue
        await redis.zrem(keys.delayed, data)
        moved += 1
    return moved


async def expire(redis: AnyRedis, keys: Keys, env: Envelope, *, reason: str, error: str) -> None:
    """Dead-letter a message whose deadline passed outside any handler, tell the caller.

    A record already completed (a duplicate of a message that succeeded) keeps its status.
    """
    if await _give_up(redis, keys, env, status="expired", reason=reason, error=error,
                      error_type="DeadlineExceeded"):  # fmt: skip
        metrics.expired(env.capability, reason)


async def _dead(redis: AnyRedis, keys: Keys, env: Envelope, *, reason: str, error: str) -> None:
    if await _give_up(redis, keys, env, status="dead", reason=reason, error=error,
                      error_type="Rejected"):  # fmt: skip
        metrics.dead_lettered(env.capability, reason)


async def _give_up(
    redis: AnyRedis, keys: Keys, env: Envelope, *, status: str, reason: str, error: str,
    error_type: str,
) -> bool:  # fmt: skip
    """File a dead letter for a message no handler will run, set its status and tell its
    caller. False (and nothing written) when its key had already completed."""
    if await _completed(redis, keys, env):
        return False
    reply = Reply(msg_id=env.msg_id, status=status, reason=reason, error=error,
                  error_type=error_type, attempt=env.attempt)  # fmt: skip
    rec = keys.idem(env.key)
    ops: list[tuple[Any, ...]] = [
        dead_letter_op(keys, capability=env.capability, reason=reason, data=encode(env),
                       error=error, error_type=error_type, attempts=env.attempt,
                       msg_id=env.msg_id),
        ("HSET", rec, "status", status, "error", error, "updated_ms", now_ms()),
        ("PEXPIRE", rec, TASK_TTL_MS),
    ]  # fmt: skip
    if env.reply_to:
        rk = keys.replies(env.reply_to)
        ops += [("XADD", rk, "*", "r", encode(reply)), ("PEXPIRE", rk, TASK_TTL_MS)]
    await scripts.run_pipeline(redis, ops)
    return True


async def _completed(redis: AnyRedis, keys: Keys, env: Envelope) -> bool:
    """True when the message's key already completed (this is a duplicate): its caller
    gets the stored reply, and nothing is dead-lettered."""
    done, stored = await redis.hmget(keys.idem(env.key), "done", "reply")
    if done not in (b"1", "1"):
        return False
    if env.reply_to and stored:
        reply = msgspec.structs.replace(decode_reply(stored), msg_id=env.msg_id)
        rk = keys.replies(env.reply_to)
        await scripts.run_pipeline(redis, [("XADD", rk, "*", "r", encode(reply)),
                                           ("PEXPIRE", rk, TASK_TTL_MS)])  # fmt: skip
    return True


@dataclass
class Moved:
    """What one compensation pass did."""

    rerouted: int = 0
    parked: int = 0
    released: int = 0
    expired: int = 0
    dead: int = 0


async def _relocate(
    redis: AnyRedis, keys: Keys, client: Client, env: Envelope, data: bytes, out: Moved
) -> bool:
    """Deliver ``env`` to a live agent, else park it. False when it could not be placed."""
    try:
        await client.deliver(env)
        out.rerouted += 1
        return True
    except NoAgentAvailable:
        pass
    await scripts.run_pipeline(redis, [
        ("XADD", keys.parked(env.capability), "*", "e", data),
        ("SADD", keys.parked_caps, env.capability),
    ])  # fmt: skip
    out.parked += 1
    return True


async def reroute_evicted(
    redis: AnyRedis, keys: Keys, client: Client, registry: Registry, *, batch: int = 200
) -> Moved:
    """Move the inboxes of evicted agents (listed by sweep.lua) to live agents."""
    out = Moved()
    for raw in await redis.smembers(keys.reroute):
        agent_id = as_text(raw)
        info = await registry.get(agent_id)
        if info is not None and info.state != "evicted":
            await redis.srem(keys.reroute, agent_id)  # it came back: its inbox is its own
            continue
        for stream in keys.inboxes(agent_id):
            while True:
                rows = await redis.xrange(stream, "-", "+", count=batch)
                if not rows:
                    break
                for entry_id, fields in rows:
                    data = fields.get(b"e") or fields.get("e") or b""
                    await _move_one(redis, keys, client, agent_id, data, out)
                    await scripts.run_pipeline(redis, [
                        ("XACK", stream, GROUP, entry_id), ("XDEL", stream, entry_id),
                    ])  # fmt: skip
        log.warning("inbox of evicted agent %s moved: %s", agent_id, out)
        await redis.srem(keys.reroute, agent_id)
    return out


async def _move_one(
    redis: AnyRedis, keys: Keys, client: Client, agent_id: str, data: bytes, out: Moved
) -> None:
    try:
        env = decode_envelope(data)
    except BadEnvelope as e:
        await scripts.run_pipeline(redis, [dead_letter_op(
            keys, capability=MALFORMED_CAP, reason=e.reason, data=data, error=e.detail,
            agent_id=agent_id,
        )])  # fmt: skip
        metrics.dead_lettered(MALFORMED_CAP, e.reason)
        out.dead += 1
        return
    if env.deadline_ms and env.deadline_ms <= now_ms():
        await expire(redis, keys, env, reason="expired", error="deadline passed while its agent was down")
        out.expired += 1
        return
    if env.policy == "broadcast":
        # A broadcast copy belongs to that one agent; the others have theirs.
        await _dead(redis, keys, env, reason="target_gone",
                    error=f"agent {agent_id} was evicted before handling its broadcast copy")
        out.dead += 1
        return
    if env.target:
        env = msgspec.structs.replace(env, target="")  # its agent is gone: any live one
    await _relocate(redis, keys, client, env, encode(env), out)


async def release_parked(
    redis: AnyRedis, keys: Keys, client: Client, *, batch: int = 200
) -> Moved:
    """Send parked messages to agents that are now available; expire the overdue ones."""
    out = Moved()
    for raw in await redis.smembers(keys.parked_caps):
        cap = as_text(raw)
        stream = keys.parked(cap)
        blocked = False  # no agent for this capability yet: only expire overdue entries
        start = "-"
        while True:
            rows = await redis.xrange(stream, start, "+", count=batch)
            if not rows:
                break
            start = f"({as_text(rows[-1][0])}"
            for entry_id, fields in rows:
                data = fields.get(b"e") or fields.get("e") or b""
                try:
                    env = decode_envelope(data)
                except BadEnvelope:
                    await redis.xdel(stream, entry_id)
                    continue
                if env.deadline_ms and env.deadline_ms <= now_ms():
                    await expire(redis, keys, env, reason="expired",
                                 error="deadline passed while parked (no agent)")  # fmt: skip
                    out.expired += 1
                elif blocked:
                    continue
                else:
                    try:
                        await client.deliver(env)
                    except NoAgentAvailable:
                        blocked = True
                        continue
                    out.released += 1
                await redis.xdel(stream, entry_id)
        if await redis.xlen(stream) == 0:
            await redis.srem(keys.parked_caps, cap)
            if await redis.xlen(stream) > 0:  # parked meanwhile: keep it listed
                await redis.sadd(keys.parked_caps, cap)
    return out

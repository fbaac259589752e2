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

Everything these chores read may have been written by anyone holding the namespace's
keys, so each entry passes a barrier: bytes that are not an envelope are dead-lettered
as ``malformed`` (their raw bytes kept, bounded), a message no router will ever accept
as ``unroutable``, anything else that fails on one entry as ``unprocessable``. The entry
leaves its place either way; only a Redis error stops a pass (the next one goes on).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
from redis import exceptions as rexc

from . import metrics, scripts
from .client import Client
from .connection import AnyRedis, as_text
from .envelope import (
    CAPABILITY_PATTERN,
    BadEnvelope,
    Envelope,
    Reply,
    decode_envelope,
    decode_reply,
    encode,
    now_ms,
)
from .errors import DeadlineExceeded, NoAgentAvailable, RedisUnavailable
from .keys import GROUP, Keys, clean_id
from .logs import OutageLog
from .registry import Registry
from .tasks import DLQ_MAXLEN, MALFORMED_CAP, TASK_TTL_MS, dead_letter_op, raw_dead_letter_op
from .untrusted import strict_text

log = logging.getLogger("reach.sweeper")
_CAP = re.compile(CAPABILITY_PATTERN)


# Errors that say "not now" (Redis away, no agent yet): the entry stays where it is.
_TRANSIENT = (rexc.ConnectionError, rexc.TimeoutError, OSError, RedisUnavailable)


async def sweep_chores(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    registry: Registry,
    *,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> Moved:
    """One pass of every chore, as the holder of the sweeper lock does it.

    The chores are independent: one refused by Redis (a key of the wrong type where the
    delayed set should be, say) is logged, at most every 30 s, and the others still run.
    """
    out = Moved()
    chores: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("retries", partial(move_due, redis, keys, client, dlq_maxlen=dlq_maxlen)),
        (
            "evicted inboxes",
            partial(reroute_evicted, redis, keys, client, registry, dlq_maxlen=dlq_maxlen),
        ),
        ("parked messages", partial(release_parked, redis, keys, client, dlq_maxlen=dlq_maxlen)),
    ]
    for name, chore in chores:
        try:
            part = await chore()
        except rexc.ResponseError as e:
            if not scripts.is_data_error(e):
                raise
            _REFUSED.setdefault(name, OutageLog(log, f"sweeper: {name}")).failed(e)
            continue
        _REFUSED.pop(name, None)
        if isinstance(part, int):
            out.rerouted += part
            continue
        for f in ("rerouted", "parked", "released", "expired", "dead"):
            setattr(out, f, getattr(out, f) + getattr(part, f))
    return out


_REFUSED: dict[str, OutageLog] = {}  # chores Redis refuses, each logged as one outage


async def _guarded(
    redis: AnyRedis,
    keys: Keys,
    data: bytes,
    where: str,
    out: Moved,
    dlq_maxlen: int,
    step: Awaitable[bool],
) -> bool:
    """Await ``step``, the handling of one entry (True: the entry leaves its place). An
    error that is not Redis being away dead-letters the entry's bytes (``unprocessable``,
    and True), so one bad entry never stops or loops a sweep."""
    try:
        return await step
    except _TRANSIENT:
        raise
    except Exception as e:
        if isinstance(e, rexc.ResponseError) and not scripts.is_data_error(e):
            raise  # the server refuses for now (OOM, READONLY...): the pass stops
        log.error("entry of %s dead-lettered as unprocessable: %s: %s", where, type(e).__name__, e)
        await _dead_raw(
            redis,
            keys,
            data,
            reason="unprocessable",
            error=f"{where}: {type(e).__name__}: {e}",
            maxlen=dlq_maxlen,
        )
        out.dead += 1
        return True


async def _dead_raw(
    redis: AnyRedis,
    keys: Keys,
    data: bytes,
    *,
    reason: str,
    error: str,
    agent_id: str = "",
    maxlen: int = DLQ_MAXLEN,
) -> None:
    await scripts.run_pipeline(
        redis,
        [
            raw_dead_letter_op(
                keys, reason=reason, data=data, error=error, agent_id=agent_id, maxlen=maxlen
            )
        ],
    )
    metrics.dead_lettered(MALFORMED_CAP, reason)


async def _place(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    env: Envelope,
    *,
    out: Moved,
    dlq_maxlen: int,
) -> bool | None:
    """Deliver ``env`` through the router. True: delivered; None: dead-lettered because no
    router will ever take it (``unroutable``), or expired; False: no agent now (it waits)."""
    try:
        await client.deliver(env)
        return True
    except (NoAgentAvailable, *_TRANSIENT):
        return False
    except DeadlineExceeded:
        await expire(redis, keys, env, reason="expired", error="deadline passed while waiting")
        out.expired += 1
        return None
    except rexc.ResponseError as e:
        if scripts.is_data_error(e):
            # The chosen agent's inbox refused it (a key of the wrong type there): not this
            # message's fault; it waits, and the next pass may pick another agent.
            log.warning("%s not placed now: %s", env.msg_id, e)
            return False
        raise
    except Exception as e:  # noqa: BLE001 - e.g. a policy its fields make impossible
        await _dead(
            redis,
            keys,
            env,
            reason="unroutable",
            error=f"{type(e).__name__}: {e}",
            maxlen=dlq_maxlen,
        )
        out.dead += 1
        return None


async def move_due(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    *,
    limit: int = 200,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> int:
    """Route retries whose backoff is over from the delayed set to a live agent's inbox.

    An entry is removed from the delayed set only after it was added to an inbox (or
    dead-lettered), so a crash in between delivers it twice at worst (and idempotency runs
    it once). Returns how many were moved; entries with no agent to take them wait for a
    later sweep.
    """
    due = await redis.zrangebyscore(keys.delayed, "-inf", now_ms(), start=0, num=limit)
    out = Moved()
    for data in due:
        step = _due_one(redis, keys, client, data, out, dlq_maxlen)
        if await _guarded(redis, keys, data, "the delayed set", out, dlq_maxlen, step):
            await redis.zrem(keys.delayed, data)
    return out.rerouted


async def _due_one(
    redis: AnyRedis, keys: Keys, client: Client, data: bytes, out: Moved, dlq_maxlen: int
) -> bool:
    try:
        env = decode_envelope(data)
    except BadEnvelope as e:
        await _dead_raw(
            redis,
            keys,
            data,
            reason=e.reason,
            maxlen=dlq_maxlen,
            error=f"in the delayed set: {e.detail}",
        )
        out.dead += 1
        return True
    if env.deadline_ms and env.deadline_ms <= now_ms():
        await expire(redis, keys, env, reason="expired", error="deadline passed while waiting")
        out.expired += 1
        return True
    placed = await _place(redis, keys, client, env, out=out, dlq_maxlen=dlq_maxlen)
    if placed is False:
        log.info("retry of %s waits: no agent for %s", env.msg_id, env.capability)
        return False
    out.rerouted += bool(placed)
    return True


async def expire(redis: AnyRedis, keys: Keys, env: Envelope, *, reason: str, error: str) -> None:
    """Dead-letter a message whose deadline passed outside any handler, tell the caller.

    A record already completed (a duplicate of a message that succeeded) keeps its status.
    """
    if await _give_up(
        redis,
        keys,
        env,
        status="expired",
        reason=reason,
        error=error,
        error_type="DeadlineExceeded",
    ):
        metrics.expired(env.capability, reason)


async def _dead(
    redis: AnyRedis,
    keys: Keys,
    env: Envelope,
    *,
    reason: str,
    error: str,
    maxlen: int = DLQ_MAXLEN,
) -> None:
    if await _give_up(
        redis,
        keys,
        env,
        status="dead",
        reason=reason,
        error=error,
        error_type="Rejected",
        maxlen=maxlen,
    ):
        metrics.dead_lettered(env.capability, reason)


async def _give_up(
    redis: AnyRedis,
    keys: Keys,
    env: Envelope,
    *,
    status: str,
    reason: str,
    error: str,
    error_type: str,
    maxlen: int = DLQ_MAXLEN,
) -> bool:
    """File a dead letter for a message no handler will run, set its status and tell its
    caller. False (and nothing written) when its key had already completed."""
    if await _completed(redis, keys, env):
        return False
    reply = Reply(
        msg_id=env.msg_id,
        status=status,
        reason=reason,
        error=error,
        error_type=error_type,
        attempt=env.attempt,
    )
    rec = keys.idem(env.key)
    ops: list[tuple[Any, ...]] = [
        dead_letter_op(
            keys,
            capability=env.capability,
            reason=reason,
            data=encode(env),
            error=error,
            error_type=error_type,
            attempts=env.attempt,
            msg_id=env.msg_id,
            maxlen=maxlen,
        ),
        ("HSET", rec, "status", status, "error", error, "updated_ms", now_ms()),
        ("PEXPIRE", rec, TASK_TTL_MS),
    ]
    if env.reply_to:
        rk = keys.replies(env.reply_to)
        ops += [("XADD", rk, "*", "r", encode(reply)), ("PEXPIRE", rk, TASK_TTL_MS)]
    await scripts.run_pipeline(redis, ops)
    return True


async def _completed(redis: AnyRedis, keys: Keys, env: Envelope) -> bool:
    """True when the message's key already completed (this is a duplicate): its caller
    gets the stored reply, and nothing is dead-lettered. A stored reply that cannot be
    read counts as not completed: the message is then dead-lettered like any other."""
    done, stored = await redis.hmget(keys.idem(env.key), "done", "reply")
    if done not in (b"1", "1"):
        return False
    if env.reply_to and stored:
        try:
            reply = msgspec.structs.replace(decode_reply(stored), msg_id=env.msg_id)
        except BadEnvelope as e:
            log.warning("stored reply of key %r unreadable (%s)", env.key, e)
            return False
        rk = keys.replies(env.reply_to)
        await scripts.run_pipeline(
            redis, [("XADD", rk, "*", "r", encode(reply)), ("PEXPIRE", rk, TASK_TTL_MS)]
        )
    return True


@dataclass
class Moved:
    """What one compensation pass did."""

    rerouted: int = 0
    parked: int = 0
    released: int = 0
    expired: int = 0
    dead: int = 0


async def reroute_evicted(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    registry: Registry,
    *,
    batch: int = 200,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> Moved:
    """Move the inboxes of evicted agents (listed by sweep.lua) to live agents, then drop
    the emptied inbox streams (an agent id that comes back creates them anew)."""
    out = Moved()
    for raw in await redis.smembers(keys.reroute):
        agent_id = strict_text(raw)
        if agent_id is None or not agent_id or clean_id(agent_id) != agent_id:
            log.error("reroute set member %r is no agent id: removed", raw)
            await redis.srem(keys.reroute, raw)
            continue
        try:
            moved = await _reroute_one(redis, keys, client, registry, agent_id, batch, dlq_maxlen)
        except rexc.ResponseError as e:
            if not scripts.is_data_error(e):
                raise
            # Its record or an inbox stream is of another type: nothing reach can move.
            log.error("inbox of %s cannot be moved (%s): removed from the reroute set", agent_id, e)
            await redis.srem(keys.reroute, agent_id)
            continue
        for f in ("rerouted", "parked", "released", "expired", "dead"):
            setattr(out, f, getattr(out, f) + getattr(moved, f))
    return out


async def _reroute_one(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    registry: Registry,
    agent_id: str,
    batch: int,
    dlq_maxlen: int,
) -> Moved:
    """Move one evicted agent's inbox (unless it came back), then drop it when empty."""
    moved = Moved()
    info = await registry.get(agent_id)
    if info is not None and info.state != "evicted":
        await redis.srem(keys.reroute, agent_id)  # it came back: its inbox is its own
        return moved
    for stream in keys.inboxes(agent_id):
        while True:
            rows = await redis.xrange(stream, "-", "+", count=batch)
            if not rows:
                break
            for entry_id, fields in rows:
                data = fields.get(b"e") or fields.get("e") or b""
                step = _move_one(redis, keys, client, agent_id, data, moved, dlq_maxlen)
                await _guarded(
                    redis, keys, data, f"the inbox of {agent_id}", moved, dlq_maxlen, step
                )
                await scripts.run_pipeline(
                    redis,
                    [
                        ("XACK", stream, GROUP, entry_id),
                        ("XDEL", stream, entry_id),
                    ],
                )
    if await scripts.call(redis, "drop_inbox", keys.inboxes(agent_id), []):
        log.info("inbox of %s emptied and dropped", agent_id)
    if moved != Moved():
        log.warning("inbox of evicted agent %s moved: %s", agent_id, moved)
    await redis.srem(keys.reroute, agent_id)
    return moved


async def _move_one(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    agent_id: str,
    data: bytes,
    out: Moved,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> bool:
    """Place one entry of an evicted agent's inbox: rerouted, parked or dead-lettered."""
    try:
        env = decode_envelope(data)
    except BadEnvelope as e:
        await _dead_raw(
            redis, keys, data, reason=e.reason, error=e.detail, agent_id=agent_id, maxlen=dlq_maxlen
        )
        out.dead += 1
        return True
    if env.deadline_ms and env.deadline_ms <= now_ms():
        await expire(
            redis, keys, env, reason="expired", error="deadline passed while its agent was down"
        )
        out.expired += 1
        return True
    if env.policy == "broadcast":
        # A broadcast copy belongs to that one agent; the others have theirs.
        await _dead(
            redis,
            keys,
            env,
            reason="target_gone",
            maxlen=dlq_maxlen,
            error=f"agent {agent_id} was evicted before handling its broadcast copy",
        )
        out.dead += 1
        return True
    if env.target or env.policy == "direct":
        # Its agent is gone for good: any live agent of the capability takes it, by the
        # capability's own policy (a 'direct' policy without its target routes nowhere).
        env = msgspec.structs.replace(env, target="", policy="")
    placed = await _place(redis, keys, client, env, out=out, dlq_maxlen=dlq_maxlen)
    if placed is not False:
        out.rerouted += bool(placed)
        return True
    await scripts.run_pipeline(
        redis,
        [
            ("XADD", keys.parked(env.capability), "*", "e", encode(env)),
            ("SADD", keys.parked_caps, env.capability),
        ],
    )
    out.parked += 1
    return True


async def release_parked(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    *,
    batch: int = 200,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> Moved:
    """Send parked messages to agents that are now available; expire the overdue ones."""
    out = Moved()
    for raw in await redis.smembers(keys.parked_caps):
        cap = strict_text(raw)
        if cap is None or not _CAP.fullmatch(cap):
            log.error("parked set member %r is no capability: removed", raw)
            await redis.srem(keys.parked_caps, raw)
            continue
        try:
            await _release_cap(redis, keys, client, cap, batch, out, dlq_maxlen)
        except rexc.ResponseError as e:
            if not scripts.is_data_error(e):
                raise
            log.error(
                "parked messages of %s cannot be read (%s): removed from the parked set", cap, e
            )
            await redis.srem(keys.parked_caps, cap)
    return out


async def _release_cap(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    cap: str,
    batch: int,
    out: Moved,
    dlq_maxlen: int,
) -> None:
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
            step = _parked_one(redis, keys, client, cap, data, blocked, out, dlq_maxlen)
            if await _guarded(
                redis, keys, data, f"the parked messages of {cap}", out, dlq_maxlen, step
            ):
                await redis.xdel(stream, entry_id)
            else:
                blocked = True
    if await redis.xlen(stream) == 0:
        await redis.srem(keys.parked_caps, cap)
        if await redis.xlen(stream) > 0:  # parked meanwhile: keep it listed
            await redis.sadd(keys.parked_caps, cap)


async def _parked_one(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    cap: str,
    data: bytes,
    blocked: bool,
    out: Moved,
    dlq_maxlen: int,
) -> bool:
    """One parked entry: released, expired or dead-lettered (True), or it waits (False)."""
    try:
        env = decode_envelope(data)
    except BadEnvelope as e:
        await _dead_raw(
            redis,
            keys,
            data,
            reason=e.reason,
            maxlen=dlq_maxlen,
            error=f"parked under {cap}: {e.detail}",
        )
        out.dead += 1
        return True
    if env.deadline_ms and env.deadline_ms <= now_ms():
        await expire(
            redis, keys, env, reason="expired", error="deadline passed while parked (no agent)"
        )
        out.expired += 1
        return True
    if blocked:
        return False
    placed = await _place(redis, keys, client, env, out=out, dlq_maxlen=dlq_maxlen)
    if placed is False:
        return False
    out.released += bool(placed)
    return True

"""Scheduled sends: a message kept in Redis until its due time, then sent as any message
(``Client.send(..., at=...)`` or ``delay_s=``; docs/concepts.md, *Scheduled sends*).

At schedule time the envelope is built and sealed (signed by its sender when signing is
on, its deadline counted from the due time), its task record is written with status
``scheduled`` (``mark_scheduled.lua``, in the record's slot; a caller's idempotency key
gets its msg_id pointer first), then the envelope goes to the namespace's scheduled set
(``schedule.lua``: a zset msg_id -> due ms and a hash msg_id -> envelope, in the
namespace's slot). Nothing is held in the caller's process:
every process may restart, and Redis too (with AOF), before it is due.

When it is due, a mover (:func:`reach.sweeper.move_scheduled`: the runtime holding the
namespace's chores, woken at the earliest due time) takes it under a lease
(``take_due.lua``), routes it to an agent live at that moment as the sweeper places a
retry (its sender's signature travels, nothing is re-signed), and removes it
(``unschedule.lua``). A mover that dies between the take and the removal leaves the entry
to be taken again once its lease is over: placed twice at worst, run once (idempotency).

``Client.cancel`` of a message still scheduled (reach._cancel) cancels its record with
``cancel.lua`` first, then removes the entry (``unschedule.lua``), so it is never sent (a mover that took it just before sends a copy that no worker runs: its record
says cancelled).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
from redis import exceptions as rexc

from . import logs
from ._redis_url import unreachable
from ._sending.delivery import seal
from .connection import AnyRedis
from .envelope import BadEnvelope, decode_envelope, encode, now_ms
from .errors import ConfigError
from .keys import Keys
from .scripts.scheduling import mark_scheduled_call, schedule_call
from .tasks import TASK_TTL_MS
from .untrusted import safe_text

if TYPE_CHECKING:  # annotations only: reach.client imports this module
    from .client import Client, MessageOptions

MAX_AHEAD_S = 364 * 24 * 3600
"""How far ahead a send may be scheduled (its task record lives until then plus a day,
and a record lives at most 365 days)."""

At = datetime | int | float
"""When a scheduled send is due: a timezone-aware datetime, or epoch seconds."""


def due_ms_of(at: At | None, delay_s: float | None, *, now: int) -> int | None:
    """The due time (epoch ms) ``at`` or ``delay_s`` asks for (``now``: the current epoch
    ms), or None when neither is given. :class:`ConfigError` for both, a naive datetime, a
    number that is not finite or not positive, or a time more than a year ahead."""
    if at is None and delay_s is None:
        return None
    if at is not None and delay_s is not None:
        raise ConfigError("Give either at= or delay_s= for a scheduled send, not both.")
    if delay_s is not None:
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float):
            raise ConfigError(f"delay_s must be a number of seconds, got {delay_s!r}.")
        if not math.isfinite(delay_s) or delay_s < 0:
            raise ConfigError(f"delay_s must be a finite number of seconds >= 0, got {delay_s}.")
        due = now + math.ceil(delay_s * 1000)
    elif isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise ConfigError(
                f"at={at.isoformat()} has no timezone: give an aware datetime, e.g. "
                "datetime.now(timezone.utc) + timedelta(minutes=5)."
            )
        due = math.ceil(at.timestamp() * 1000)
    elif isinstance(at, int | float) and not isinstance(at, bool):
        if not math.isfinite(at) or at <= 0:
            raise ConfigError(f"at must be epoch seconds > 0 or a datetime, got {at}.")
        due = math.ceil(at * 1000)
    else:
        raise ConfigError(f"at must be a datetime or epoch seconds, got {type(at).__name__}.")
    if due - now > MAX_AHEAD_S * 1000:
        raise ConfigError(
            f"A send can be scheduled at most {MAX_AHEAD_S // 86400} days ahead; "
            f"this one is due in {(due - now) / 86_400_000:.0f} days."
        )
    return due


def _deadline_from_due(client: Client, due: int, opts: MessageOptions) -> None:
    """A scheduled send's deadline counts from its due time: ``timeout_s`` (else the
    client's ``default_send_timeout_s``) after it, bounded by an absolute ``deadline_ms``,
    which must itself be after the due time."""
    timeout_s = opts.pop("timeout_s", None)
    deadline = opts.get("deadline_ms")
    if timeout_s is None and deadline is None:
        timeout_s = client.default_send_timeout_s
    if timeout_s is not None:
        if timeout_s <= 0:
            raise ConfigError("timeout_s must be > 0.")
        dl = due + int(timeout_s * 1000)
        deadline = min(deadline, dl) if deadline else dl
    if deadline and deadline <= due:
        raise ConfigError(
            f"deadline_ms {deadline} is not after the due time {due}: the message would "
            "expire before it is sent. Give a later deadline_ms, or timeout_s (counted from "
            "the due time)."
        )
    opts["deadline_ms"] = deadline or None


async def schedule(
    client: Client,
    capability: str,
    payload: Any,
    due_ms: int,
    where: Mapping[str, Any] | None,
    opts: MessageOptions,
) -> str:
    """Keep a message until ``due_ms`` (see the module docstring); returns its msg_id."""
    if where:
        raise ConfigError(
            "where= is not kept with a scheduled send: the agent is chosen at the due time "
            "among every eligible one. Use target= for one agent, or send when it is due."
        )
    _deadline_from_due(client, due_ms, opts)
    env = client.build(capability, payload, reply=False, **opts)
    # Sealed now, by its sender: the mover places it as it is (docs/security.md).
    seal(env, client.signer, tracing=logs.tracing())
    data = encode(env)
    keys, redis = client.keys, client.commands
    key = env.key
    ttl_ms = min(max(0, due_ms - now_ms()) + TASK_TTL_MS, 365 * 86_400_000)
    try:
        if env.idempotency_key:  # the msg_id -> key pointer, in the msg_id's slot
            await redis.set(keys.task(env.msg_id), key, px=ttl_ms)
        await mark_scheduled_call(
            keys.idem(key),
            capability=env.capability,
            msg_id=env.msg_id,
            due_ms=due_ms,
            ttl_ms=ttl_ms,
        ).run(redis)
        await schedule_call(keys, msg_id=env.msg_id, due_ms=due_ms, envelope=data).run(redis)
    except (rexc.ConnectionError, rexc.TimeoutError) as e:
        # Not held in the outage buffer: the caller learns now that nothing was kept.
        raise unreachable(client.redis_url, e) from e
    return env.msg_id


class ScheduledSend(msgspec.Struct, kw_only=True):
    """One send waiting in the scheduled set (``reach tasks --scheduled``)."""

    msg_id: str
    capability: str
    due_ms: int
    """When it is due (epoch ms); a send a mover is placing shows its lease end."""
    priority: str = ""
    target: str = ""
    source: str = ""


async def list_scheduled(redis: AnyRedis, keys: Keys, *, limit: int = 100) -> list[ScheduledSend]:
    """The ``limit`` scheduled sends due first, earliest first (an entry whose envelope is
    unreadable is listed with capability ``?``)."""
    if limit < 1:
        raise ConfigError("limit must be >= 1.")
    rows = await redis.zrange(keys.scheduled, 0, limit - 1, withscores=True)
    if not rows:
        return []
    ids = [safe_text(m) for m, _ in rows]
    envs = await redis.hmget(keys.scheduled_envelopes, ids)
    out = []
    for (_, score), msg_id, data in zip(rows, ids, envs, strict=True):
        item = ScheduledSend(msg_id=msg_id, capability="?", due_ms=int(score))
        if data:
            try:
                env = decode_envelope(data)
            except BadEnvelope:
                pass
            else:
                item.capability, item.priority = env.capability, env.priority
                item.target, item.source = env.target, env.source
        out.append(item)
    return out


async def count_scheduled(redis: AnyRedis, keys: Keys) -> int:
    """How many sends wait in the scheduled set."""
    return int(await redis.zcard(keys.scheduled))

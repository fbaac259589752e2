"""Cluster-wide chores that any runtime (or ``reach sweep``) may do.

Lease sweeping itself is ``lua/sweep.lua`` (via :meth:`reach.registry.Registry.sweep`);
this module moves work that waits in Redis back into inboxes:

* :func:`move_due` - retries whose backoff is over;
* :func:`move_scheduled` - scheduled sends that are due (reach.scheduling);
* :func:`reroute_evicted` - the whole inbox (pending and unread, every priority) of an
  agent evicted for good, or deregistered, goes to live agents of the capability through
  the normal policy (a session's messages follow their new ring owner); with no live agent
  they are parked. For :data:`REROUTE_GRACE_MS` after it left, what callers with a stale
  registry view still send it is moved the same way;
* :func:`release_parked` - parked messages go out once an agent of their capability is
  back; parked messages whose deadline passed are dead-lettered as ``expired``.

:func:`sweep_chores` runs the three; :func:`reach.admin.sweep_once` is a whole pass
(leases, then the chores), as ``reach sweep`` runs it.

Every move adds the message to its new place before deleting it from the old one, and
deletes it only when every write of the move succeeded (each reply of a pipeline is
checked: a full Redis refuses writes with ``OutOfMemoryError``, which stops the pass and
leaves the entry where it was). A crash in between delivers it twice at worst, and
idempotency runs it once.

Everything these chores read may have been written by anyone holding the namespace's
keys, so each entry passes a barrier: bytes that are not an envelope are dead-lettered
as ``malformed`` (their raw bytes kept, bounded), a message no router will ever accept
as ``unroutable``, anything else that fails on one entry as ``unprocessable``. The entry
leaves its place either way; only a Redis error stops a pass (the next one goes on).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import anyio
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
    encode,
    now_ms,
)
from .errors import DeadlineExceeded, NoAgentAvailable, RedisFull, RedisUnavailable
from .keys import GROUP, Keys, clean_id
from .logs import OutageLog
from .outcomes import DeadReason, Status
from .registry import Registry
from .scripts import delivery, inbox
from .scripts.codes import DropInboxCode, StreamBound
from .scripts.delivery import GivenUp
from .scripts.scheduling import UNSCHEDULE_MAX, Taken, take_due_call, unschedule_call
from .signing import Signer
from .tasks import DLQ_MAXLEN, MALFORMED_CAP, TASK_TTL_MS, dead_letter_op, raw_dead_letter_op
from .untrusted import strict_text

REROUTE_GRACE_MS = 30_000
"""How long after its eviction or deregistration an agent stays in its shard's reroute
set: a message a caller sends it meanwhile (a registry view that has not read the change
yet: up to its event poll, 0.25 s, its consistency check, ``refresh_s``, 2 s, when events
were lost, or ``max_staleness_s``, 5 s, when its tail broke) is moved on by the next pass
instead of waiting forever in a stream nobody reads. A pass reads, in one pipeline per
registry shard, when the listed agents left and whether their inboxes exist; only an
evicted one, one with an inbox or one past its grace costs more reads (its record)."""

log = logging.getLogger("reach.sweeper")
_CAP = re.compile(CAPABILITY_PATTERN)


# Errors that say "not now" (Redis away, no agent yet): the entry stays where it is.
_TRANSIENT = (rexc.ConnectionError, rexc.TimeoutError, OSError, RedisUnavailable)


@dataclass
class Moved:
    """What one compensation pass did."""

    rerouted: int = 0
    parked: int = 0
    released: int = 0
    expired: int = 0
    dead: int = 0
    retried: int = 0
    """Retries moved from the delayed set to an inbox (:func:`move_due`)."""
    scheduled: int = 0
    """Scheduled sends moved to an inbox when due (:func:`move_scheduled`)."""

    def add(self, other: Moved) -> None:
        """Count what ``other`` did in this one too."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


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
    chores: list[tuple[str, Callable[[], Awaitable[Moved]]]] = [
        ("retries", partial(move_due, redis, keys, client, dlq_maxlen=dlq_maxlen)),
        (
            "scheduled sends",
            partial(move_all_scheduled, redis, keys, client, dlq_maxlen=dlq_maxlen),
        ),
        (
            "evicted inboxes",
            partial(reroute_evicted, redis, keys, client, registry, dlq_maxlen=dlq_maxlen),
        ),
        ("parked messages", partial(release_parked, redis, keys, client, dlq_maxlen=dlq_maxlen)),
    ]
    for name, chore in chores:
        try:
            out.add(await chore())
        except rexc.ResponseError as e:
            if not scripts.is_data_error(e):
                raise
            _REFUSED.setdefault(name, OutageLog(log, f"sweeper: {name}")).failed(e)
            continue
        _REFUSED.pop(name, None)
    return out


_REFUSED: dict[str, OutageLog] = {}  # chores Redis refuses, each logged as one outage


# -- dead letters -------------------------------------------------------------------------
class _Letters:
    """Filing dead letters in one namespace, and giving up on messages no handler will run
    (their status set, their caller told)."""

    def __init__(
        self, redis: AnyRedis, keys: Keys, dlq_maxlen: int, signer: Signer | None = None
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.dlq_maxlen = dlq_maxlen
        self.signer = (
            signer  # signs the replies it writes (a caller with a secret drops unsigned ones)
        )

    async def raw(self, data: bytes, *, reason: str, error: str, agent_id: str = "") -> None:
        """File bytes that are no usable envelope (under ``_malformed``, bounded)."""
        op = raw_dead_letter_op(
            self.keys,
            reason=reason,
            data=data,
            error=error,
            agent_id=agent_id,
            maxlen=self.dlq_maxlen,
        )
        await scripts.run_checked(self.redis, [op])
        metrics.dead_lettered(MALFORMED_CAP, reason)

    async def give_up(self, env: Envelope, *, status: str, reason: str, error: str) -> None:
        """Give up on a message no handler will run: set its status (``expired`` or
        ``dead``), file a dead letter and tell its caller.

        ``lua/give_up.lua`` checks and writes the record in one step, so a key that
        completed meanwhile (a duplicate of a message that succeeded) keeps its status,
        nothing is filed and its caller gets the stored reply. A stored reply that cannot
        be read is not forwarded: the message is then dead-lettered and its caller told
        like any other (the record still keeps its status).
        """
        call = delivery.give_up(
            self.keys.idem(env.key), status=status, error=error, ttl_ms=TASK_TTL_MS
        )
        given = await call.run(self.redis)
        if given.done and await self._forward_stored(env, given):
            return
        error_type = "DeadlineExceeded" if status == Status.EXPIRED else "Rejected"
        letter = dead_letter_op(
            self.keys,
            capability=env.capability,
            reason=reason,
            data=encode(env),
            error=error,
            error_type=error_type,
            attempts=env.attempt,
            msg_id=env.msg_id,
            maxlen=self.dlq_maxlen,
        )
        reply = Reply(
            msg_id=env.msg_id,
            status=status,
            reason=reason,
            error=error,
            error_type=error_type,
            attempt=env.attempt,
        )
        await scripts.run_checked(self.redis, [letter, *self._reply_ops(env, reply)])
        if status == Status.EXPIRED:
            metrics.expired(env.capability, reason)
        else:
            metrics.dead_lettered(env.capability, reason)

    def _reply_ops(self, env: Envelope, reply: Reply) -> list[tuple[Any, ...]]:
        """The commands that hand ``reply`` to the caller of ``env`` (none for a send)."""
        if not env.reply_to:
            return []
        rk = self.keys.replies(env.reply_to)
        # Signed only for a message that verifies: an entry anyone may have written names
        # its caller (reply_to, msg_id) without proof, and a signed 'expired' or 'dead'
        # reply would tell a signing caller, in the runtime's name, that its real message
        # ended. Unsigned, it reaches callers that sent unsigned messages (no keys) only.
        if self.signer is not None and not reply.sig and self.signer.check_envelope(env) is None:
            self.signer.sign_reply(reply)
        return [
            ("XADD", rk, "MAXLEN", "~", int(StreamBound.REPLIES), "*", "r", encode(reply)),
            ("PEXPIRE", rk, TASK_TTL_MS),
        ]

    async def _forward_stored(self, env: Envelope, given: GivenUp) -> bool:
        """Hand the stored reply of a key that completed to the caller of ``env`` (a
        duplicate). False when the reply cannot be read."""
        if env.reply_to and given.reply:
            try:
                # Renamed to this copy's msg_id: the old signature no longer covers it.
                reply = msgspec.structs.replace(
                    given.stored(env.key), msg_id=env.msg_id, kid="", sig=b""
                )
            except BadEnvelope as e:
                log.warning("stored reply of key %r unreadable (%s)", env.key, e)
                return False
            await scripts.run_checked(self.redis, self._reply_ops(env, reply))
        return True


async def expire(
    redis: AnyRedis,
    keys: Keys,
    env: Envelope,
    *,
    reason: str,
    error: str,
    maxlen: int = DLQ_MAXLEN,
    signer: Signer | None = None,
) -> None:
    """Dead-letter a message whose deadline passed outside any handler, tell the caller
    (the reply signed by ``signer`` when given).

    A record already completed (a duplicate of a message that succeeded) keeps its status.
    """
    await _Letters(redis, keys, maxlen, signer).give_up(
        env, status=Status.EXPIRED, reason=reason, error=error
    )


# -- the chores -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Place:
    """Where the entries a chore reads wait, as its messages name it."""

    name: str
    """In errors about an entry that is no envelope ('' = the error alone)."""
    waiting: str
    """How an expired message waited: 'deadline passed while <waiting>'."""
    agent_id: str = ""
    """The agent whose inbox it is, if any (kept with a raw dead letter)."""


_DELAYED = _Place("in the delayed set", "waiting")
_SCHEDULED = _Place("in the scheduled set", "scheduled")


class _Chores(_Letters):
    """One run of a chore: where it reads and writes, the client that places messages
    through the router, and what it did (``out``)."""

    def __init__(self, redis: AnyRedis, keys: Keys, client: Client, dlq_maxlen: int) -> None:
        super().__init__(redis, keys, dlq_maxlen, client.signer)
        self.client = client
        self.out = Moved()

    # -- one entry ----------------------------------------------------------------------
    async def guarded(self, data: bytes, where: str, step: Awaitable[bool]) -> bool:
        """Await ``step``, the handling of one entry (True: the entry leaves its place). An
        error that is not Redis being away dead-letters the entry's bytes
        (``unprocessable``, and True), so one bad entry never stops or loops a sweep."""
        try:
            return await step
        except _TRANSIENT:
            raise
        except Exception as e:
            if isinstance(e, rexc.ResponseError) and not scripts.is_data_error(e):
                raise  # the server refuses for now (OOM, READONLY...): the pass stops
            name = type(e).__name__
            log.error("entry of %s dead-lettered as unprocessable: %s: %s", where, name, e)
            await self.raw(data, reason=DeadReason.UNPROCESSABLE, error=f"{where}: {name}: {e}")
            self.out.dead += 1
            return True

    async def live_envelope(self, data: bytes, place: _Place) -> Envelope | None:
        """The envelope in ``data`` when it still has to go somewhere; None when it was
        dead-lettered here: bytes that are no envelope, or a message whose deadline passed
        while it waited (its caller is told)."""
        try:
            env = decode_envelope(data)
        except BadEnvelope as e:
            error = f"{place.name}: {e.detail}" if place.name else e.detail
            await self.raw(data, reason=e.reason, error=error, agent_id=place.agent_id)
            self.out.dead += 1
            return None
        if env.deadline_ms and env.deadline_ms <= now_ms():
            await self.expire(env, f"deadline passed while {place.waiting}")
            return None
        return env

    async def expire(self, env: Envelope, error: str) -> None:
        await self.give_up(env, status=Status.EXPIRED, reason=DeadReason.EXPIRED, error=error)
        self.out.expired += 1

    async def dead(self, env: Envelope, reason: str, error: str) -> None:
        await self.give_up(env, status=Status.DEAD, reason=reason, error=error)
        self.out.dead += 1

    async def place(self, env: Envelope) -> bool | None:
        """Deliver ``env`` through the router. True: delivered; None: dead-lettered because
        no router will ever take it (``unroutable``), or expired; False: no agent now (it
        waits)."""
        try:
            await self.client.deliver(env, quota=False)  # accepted once: no quota refuses it
            return True
        except (NoAgentAvailable, *_TRANSIENT):
            return False
        except DeadlineExceeded:
            await self.expire(env, "deadline passed while waiting")
            return None
        except RedisFull as e:  # the server refuses writes for now: the pass stops
            raise e.__cause__ or e
        except rexc.ResponseError as e:
            if scripts.is_data_error(e):
                # The chosen agent's inbox refused it (a key of the wrong type there): not
                # this message's fault; it waits, and the next pass may pick another agent.
                log.warning("%s not placed now: %s", env.msg_id, e)
                return False
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a policy its fields make impossible
            await self.dead(env, DeadReason.UNROUTABLE, f"{type(e).__name__}: {e}")
            return None

    async def each_member(
        self,
        set_key: str,
        parse: Callable[[Any], str | None],
        handle: Callable[[str], Awaitable[None]],
        *,
        junk: str,
        refused: str,
        members: Collection[Any] | None = None,
        on: AnyRedis | None = None,
    ) -> None:
        """Call ``handle`` for each member of the set ``set_key`` that ``parse`` accepts
        (``members``: the set as just read, else it is read here).

        A member ``parse`` refuses (None) is logged (``junk % member``) and removed, and so
        is one whose keys Redis refuses to handle (``refused % (member, error)``: a key of
        the wrong type); any other error stops the loop. ``on``: the Redis holding the set
        (the registry's, for a reroute set: the control plane may be apart).
        """
        r = self.redis if on is None else on
        if members is None:
            members = await r.smembers(set_key)
        for raw in members:
            member = parse(raw)
            if member is None:
                log.error(junk, raw)
                await r.srem(set_key, raw)
                continue
            try:
                await handle(member)
            except rexc.ResponseError as e:
                if not scripts.is_data_error(e):
                    raise
                log.error(refused, member, e)
                await r.srem(set_key, member)

    # -- retries --------------------------------------------------------------------
    async def move_due(self, limit: int) -> Moved:
        delayed = self.keys.delayed
        due = await self.redis.zrangebyscore(delayed, "-inf", now_ms(), start=0, num=limit)
        for data in due:
            if await self.guarded(data, "the delayed set", self._due_one(data)):
                await self.redis.zrem(delayed, data)
        return self.out

    async def _due_one(self, data: bytes) -> bool:
        env = await self.live_envelope(data, _DELAYED)
        if env is None:
            return True
        placed = await self.place(env)
        if placed is False:
            log.info("retry of %s waits: no agent for %s", env.msg_id, env.capability)
            return False
        self.out.retried += bool(placed)
        return True

    # -- scheduled sends ------------------------------------------------------------------
    async def move_scheduled(self, limit: int, lease_ms: int) -> Taken:
        taken = await take_due_call(self.keys, limit=limit, lease_ms=lease_ms).run(self.redis)
        if not taken.entries:
            return taken
        placed: list[str] = []
        errors: list[Exception] = []

        async def one(msg_id: str, data: bytes) -> None:
            try:
                if await self.guarded(data, "the scheduled set", self._scheduled_one(data)):
                    placed.append(msg_id)
            except Exception as e:  # noqa: BLE001 - raised below, once the others are done
                errors.append(e)

        # Placed side by side: their inbox writes go out in the client's shared pipelines.
        async with anyio.create_task_group() as tg:
            for msg_id, data in taken.entries:
                tg.start_soon(one, msg_id, data)
        for i in range(0, len(placed), UNSCHEDULE_MAX):
            await unschedule_call(self.keys, placed[i : i + UNSCHEDULE_MAX]).run(self.redis)
        if errors:  # Redis away or refusing writes: the rest waits for their lease to end
            raise errors[0]
        return taken

    async def _scheduled_one(self, data: bytes) -> bool:
        env = await self.live_envelope(data, _SCHEDULED)
        if env is None:
            return True
        placed = await self.place(env)
        if placed is False:
            log.info("scheduled %s waits: no agent for %s", env.msg_id, env.capability)
            return False  # taken again when its lease is over
        self.out.scheduled += bool(placed)
        return True

    # -- inboxes of evicted agents -------------------------------------------------------
    async def reroute_evicted(self, registry: Registry, batch: int) -> Moved:
        for k in range(registry.shards):  # each registry shard lists its own evicted agents
            reroute = registry.keys.reroute_of(k)
            members = await registry.redis.smembers(reroute)
            quiet = await self._quiet(members, registry.keys.left_of(k), registry.redis)

            async def one(agent_id: str, reroute: str = reroute, quiet: set[str] = quiet) -> None:
                if agent_id in quiet:
                    return
                mine = _Chores(self.redis, self.keys, self.client, self.dlq_maxlen)
                await mine._reroute_one(registry, agent_id, batch, reroute)
                self.out.add(mine.out)

            await self.each_member(
                reroute,
                _agent_id,
                one,
                junk="reroute set member %r is no agent id: removed",
                # Its record or an inbox stream of another type: nothing reach can move.
                refused="inbox of %s cannot be moved (%s): removed from the reroute set",
                members=members,
                on=registry.redis,
            )
        return self.out

    async def _quiet(self, members: Collection[Any], left: str, control: AnyRedis) -> set[str]:
        """The ``members`` of a reroute set a pass need not look at: agents that deregistered
        within :data:`REROUTE_GRACE_MS` (their ``left`` score) and have no inbox stream
        (nothing came since). Found in one pipeline, so a deploy that stops many agents
        at once costs a pass one round trip for those, not three per agent (two when the
        registry, ``control``, is on a Redis of its own)."""
        ids = [a for a in map(_agent_id, members) if a is not None]
        if not ids:
            return set()
        ops: list[tuple[Any, ...]] = [("ZMSCORE", left, *ids)]
        exists: list[tuple[Any, ...]] = [("EXISTS", *self.keys.inboxes(a)) for a in ids]
        if control is self.redis:
            scores, *inboxes = await scripts.run_pipeline(self.redis, ops + exists)
        else:
            (scores,) = await scripts.run_pipeline(control, ops)
            inboxes = await scripts.run_pipeline(self.redis, exists)
        if isinstance(scores, Exception):
            return set()  # a left zset Redis refuses to read: each member's own pass tells
        recent = now_ms() - REROUTE_GRACE_MS
        return {
            a
            for a, score, n in zip(ids, scores, inboxes, strict=True)
            if score is not None and float(score) > recent and n == 0
        }

    async def _reroute_one(
        self, registry: Registry, agent_id: str, batch: int, reroute: str
    ) -> None:
        """Move one evicted or deregistered agent's inbox (unless it came back), then drop
        it when empty and, :data:`REROUTE_GRACE_MS` after it left, take it out of
        ``reroute`` (the set that listed it) and of its shard's left zset."""
        redis, keys = self.redis, self.keys
        left = registry.keys.left_of(registry.shard_of(agent_id))
        info = await registry.get(agent_id)
        if info is not None and info.state != "evicted":
            # It came back: its inbox is its own.
            await scripts.run_checked(
                registry.redis, [("SREM", reroute, agent_id), ("ZREM", left, agent_id)]
            )
            return
        # Gone since: its eviction (its record's state_ms) or its deregistration (when
        # deregister.lua listed it; no record is left then).
        since = info.state_ms if info is not None else await registry.redis.zscore(left, agent_id)
        if await redis.exists(*keys.inboxes(agent_id)):  # (none: dropped, and nothing since)
            await self._move_inbox(agent_id, batch)
        # Listed until REROUTE_GRACE_MS after it left: a caller whose view has not read
        # that yet may still send it a message, which lands in (or recreates) an inbox
        # stream nobody reads; the next pass moves it on.
        if since is None or now_ms() - since >= REROUTE_GRACE_MS:
            await scripts.run_checked(
                registry.redis, [("SREM", reroute, agent_id), ("ZREM", left, agent_id)]
            )

    async def _move_inbox(self, agent_id: str, batch: int) -> None:
        redis, keys = self.redis, self.keys
        place = _Place("", "its agent was down", agent_id)
        where = f"the inbox of {agent_id}"
        for stream in keys.inboxes(agent_id):
            # Up to the entry that ends the stream now, never from the start again: an
            # agent id that comes back while its inbox moves is routed to, and what this
            # pass places into its own inbox is its own (moving it again loops).
            last = await redis.xrevrange(stream, "+", "-", count=1)
            if not last:
                continue
            start, end = "-", as_text(last[0][0])
            while rows := await redis.xrange(stream, start, end, count=batch):
                start = f"({as_text(rows[-1][0])}"
                for entry_id, fields_ in rows:
                    data = fields_.get(b"e") or fields_.get("e") or b""
                    # Deleted only once it is in its new place: a write Redis refused (a
                    # full Redis) raised, and the entry waits here for the next pass.
                    if await self.guarded(data, where, self._move_one(place, data)):
                        await scripts.run_checked(
                            redis, [("XACK", stream, GROUP, entry_id), ("XDEL", stream, entry_id)]
                        )
        if await inbox.drop_inbox(keys, agent_id=agent_id).run(redis) is DropInboxCode.DROPPED:
            log.info("inbox of %s emptied and dropped", agent_id)
        if self.out != Moved():
            log.warning("inbox of %s (evicted or gone) moved: %s", agent_id, self.out)

    async def _move_one(self, place: _Place, data: bytes) -> bool:
        """Place one entry of an evicted agent's inbox: rerouted, parked or dead-lettered."""
        env = await self.live_envelope(data, place)
        if env is None:
            return True
        if env.policy == "broadcast":
            # A broadcast copy belongs to that one agent; the others have theirs.
            error = f"agent {place.agent_id} was evicted or left before handling its broadcast copy"
            await self.dead(env, DeadReason.TARGET_GONE, error)
            return True
        if env.target or env.policy == "direct":
            # Its agent is gone for good: any live agent of the capability takes it, by the
            # capability's own policy (a 'direct' policy without its target routes nowhere).
            env = msgspec.structs.replace(env, target="", policy="")
        placed = await self.place(env)
        if placed is not False:
            self.out.rerouted += bool(placed)
            return True
        await scripts.run_checked(
            self.redis,
            [
                ("XADD", self.keys.parked(env.capability), "*", "e", encode(env)),
                ("SADD", self.keys.parked_caps, env.capability),
            ],
        )
        self.out.parked += 1
        return True

    # -- parked messages ---------------------------------------------------------------
    async def release_parked(self, batch: int) -> Moved:
        async def one(cap: str) -> None:
            await self._release_cap(cap, batch)

        await self.each_member(
            self.keys.parked_caps,
            _capability,
            one,
            junk="parked set member %r is no capability: removed",
            refused="parked messages of %s cannot be read (%s): removed from the parked set",
        )
        return self.out

    async def _release_cap(self, cap: str, batch: int) -> None:
        redis, keys = self.redis, self.keys
        stream = keys.parked(cap)
        place = _Place(f"parked under {cap}", "parked (no agent)")
        where = f"the parked messages of {cap}"
        blocked = False  # no agent for this capability yet: only expire overdue entries
        start = "-"
        while rows := await redis.xrange(stream, start, "+", count=batch):
            start = f"({as_text(rows[-1][0])}"
            for entry_id, fields_ in rows:
                data = fields_.get(b"e") or fields_.get("e") or b""
                if await self.guarded(data, where, self._parked_one(place, data, blocked)):
                    await redis.xdel(stream, entry_id)
                else:
                    blocked = True
        if await redis.xlen(stream) == 0:
            await redis.srem(keys.parked_caps, cap)
            if await redis.xlen(stream) > 0:  # parked meanwhile: keep it listed
                await redis.sadd(keys.parked_caps, cap)

    async def _parked_one(self, place: _Place, data: bytes, blocked: bool) -> bool:
        """One parked entry: released, expired or dead-lettered (True), or it waits
        (False)."""
        env = await self.live_envelope(data, place)
        if env is None:
            return True
        if blocked:
            return False
        placed = await self.place(env)
        if placed is False:
            return False
        self.out.released += bool(placed)
        return True


def _agent_id(raw: Any) -> str | None:
    agent_id = strict_text(raw)
    return agent_id if agent_id and clean_id(agent_id) == agent_id else None


def _capability(raw: Any) -> str | None:
    cap = strict_text(raw)
    return cap if cap is not None and _CAP.fullmatch(cap) else None


# -- the chores, one by one -------------------------------------------------------------
async def move_due(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    *,
    limit: int = 200,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> Moved:
    """Route retries whose backoff is over from the delayed set to a live agent's inbox.

    An entry is removed from the delayed set only after it was added to an inbox (or
    dead-lettered), so a crash in between delivers it twice at worst (and idempotency runs
    it once). ``retried`` counts the ones moved; entries with no agent to take them wait
    for a later sweep.
    """
    return await _Chores(redis, keys, client, dlq_maxlen).move_due(limit)


SCHEDULED_BATCH = 500
"""Scheduled sends one ``take_due.lua`` call takes (and places side by side) at most."""
SCHEDULED_LEASE_MS = 10_000
"""How long a mover holds the scheduled sends it took: one that dies (or finds no agent)
leaves them to be taken again after this."""


async def move_scheduled(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    *,
    limit: int = SCHEDULED_BATCH,
    lease_ms: int = SCHEDULED_LEASE_MS,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> tuple[Moved, Taken]:
    """Take the scheduled sends that are due (at most ``limit``, leased ``lease_ms``),
    route each to an agent live now, and remove the placed ones from the scheduled set
    (reach.scheduling). A send with no agent now is taken again when its lease is over;
    one whose deadline passed is dead-lettered ``expired``. Returns what was moved
    (``scheduled``) and the take (the server time, the next due time)."""
    chores = _Chores(redis, keys, client, dlq_maxlen)
    taken = await chores.move_scheduled(limit, lease_ms)
    return chores.out, taken


async def move_all_scheduled(
    redis: AnyRedis, keys: Keys, client: Client, *, dlq_maxlen: int = DLQ_MAXLEN
) -> Moved:
    """:func:`move_scheduled` until nothing more is due (a sweep pass's chore)."""
    out = Moved()
    while True:
        moved, taken = await move_scheduled(redis, keys, client, dlq_maxlen=dlq_maxlen)
        out.add(moved)
        if len(taken.entries) < SCHEDULED_BATCH:
            return out


async def reroute_evicted(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    registry: Registry,
    *,
    batch: int = 200,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> Moved:
    """Move the inboxes of evicted agents (listed by sweep.lua in each registry shard's
    reroute set) to live agents, then drop the emptied inbox streams (an agent id that
    comes back creates them anew)."""
    return await _Chores(redis, keys, client, dlq_maxlen).reroute_evicted(registry, batch)


async def release_parked(
    redis: AnyRedis,
    keys: Keys,
    client: Client,
    *,
    batch: int = 200,
    dlq_maxlen: int = DLQ_MAXLEN,
) -> Moved:
    """Send parked messages to agents that are now available; expire the overdue ones."""
    return await _Chores(redis, keys, client, dlq_maxlen).release_parked(batch)

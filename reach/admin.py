"""Operator operations on a namespace: dead letters, inbox statistics, one sweep pass.

What the ``reach`` command (``reach dlq``, ``reach queues``, ``reach top``, ``reach
sweep``) does is done here; the command only parses its arguments and renders what these
functions return. Every function takes a Redis client (standalone or Cluster; see
:func:`reach.connection.connect`) and the namespace's :class:`~reach.keys.Keys`::

    r = await connect("redis://localhost:6379/0")
    keys = Keys("prod")
    for entry in await list_dead_letters(r, keys, capability="text.summarize"):
        print(entry.letter.reason, entry.letter.error)
    print(await queue_depths(r, keys, ["summarizer-1"]))

Inbox depth (``queue_depths``) has one definition, used by every reader: the number of
entries in the agent's three priority streams (``XLEN``), which is what is queued plus
what is being handled (the runtime deletes an entry once it is settled).

Everything read here may have been written by anyone holding the namespace's keys: a
stream that cannot be read (a key of another type) counts as empty, a dead letter whose
fields are not what reach writes is still listed (see
:func:`reach.tasks.parse_dead_letter`), and key names are kept as Redis has them (maybe
not UTF-8).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from . import audit
from .client import Client
from .connection import AnyRedis, as_text
from .connection import _safe_name as safe_client_name
from .errors import AmbiguousDeadLetterId, BadDeadLetterId, DeadLetterNotFound, ReachError
from .keys import GROUP, PRIORITIES, Keys
from .registry import Registry, normalize_capability
from .sweeper import sweep_chores
from .tasks import DLQ_MAXLEN, MALFORMED_CAP, DeadLetter, parse_dead_letter
from .untrusted import safe_text, strict_text

__all__ = [
    "AmbiguousDeadLetterId",
    "BadDeadLetterId",
    "DeadLetterCount",
    "DeadLetterEntry",
    "DeadLetterNotFound",
    "InboxStats",
    "ReplayFailure",
    "ReplayResult",
    "Replayed",
    "SweepReport",
    "client_name",
    "dead_letter_counts",
    "dead_letter_streams",
    "drain_agent",
    "find_dead_letter",
    "inbox_agents",
    "inbox_stats",
    "list_dead_letters",
    "live_clients",
    "purge_dead_letters",
    "queue_depths",
    "queue_depths_sync",
    "replay_dead_letters",
    "sweep_once",
]


# -- dead letters -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """A dead letter and the stream it is filed in (what replaying or deleting it needs).

    ``stream`` is the key name as Redis has it: bytes when it is not UTF-8 text.
    """

    stream: str | bytes
    letter: DeadLetter


@dataclass(frozen=True, slots=True)
class DeadLetterCount:
    """How many dead letters one capability's stream holds, and how many were ever filed
    there (``added``: Redis' own counter, None when the server does not keep it)."""

    capability: str
    count: int
    added: int | None


@dataclass(frozen=True, slots=True)
class ReplayFailure:
    """A dead letter that was not sent again, and why (it stays where it is)."""

    id: str
    error: str


@dataclass(frozen=True, slots=True)
class Replayed:
    """A dead letter sent again: its message, and the client whose reply stream gets the
    outcome (``reply_to``; ``""``: nobody's, the outcome is in the task record only)."""

    id: str
    msg_id: str
    reply_to: str
    why: str
    """Why the reply goes there: ``caller live``, ``caller gone``, ``caller unknown``
    (CLIENT LIST refused), ``no caller`` (sent without a reply), ``named``
    (``reply_to=``), ``fallback`` (the caller is gone: ``fallback_reply_to``)."""


@dataclass(slots=True)
class ReplayResult:
    """What :func:`replay_dead_letters` did: letters sent again (and deleted from their
    stream) and the ones that could not be."""

    replayed: int = 0
    failed: list[ReplayFailure] = field(default_factory=list)
    sent: list[Replayed] = field(default_factory=list)


_STREAM_ID = re.compile(r"\d{1,20}(-\d{1,20})?")


async def dead_letter_streams(
    redis: AnyRedis, keys: Keys, *, capability: str | None = None
) -> list[str | bytes]:
    """The dead-letter streams to look at: the capability's own (``_malformed`` for bytes
    that were no envelope), or every one of the namespace, sorted.

    A capability name is normalised first; a name that is not one raises
    :class:`~reach.errors.InvalidCapability`.
    """
    if capability:
        cap = capability if capability == MALFORMED_CAP else normalize_capability(capability)
        return [keys.dlq(cap)]
    found = sorted({_raw(k) async for k in redis.scan_iter(match=keys.dlq_pattern, count=1000)})
    return [strict_text(k) or k for k in found]


def _raw(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


async def list_dead_letters(
    redis: AnyRedis,
    keys: Keys,
    *,
    capability: str | None = None,
    limit: int | None = 100,
) -> list[DeadLetterEntry]:
    """Dead letters, oldest first within each capability: at most ``limit`` per
    capability (None: all of them)."""
    out: list[DeadLetterEntry] = []
    for stream in await dead_letter_streams(redis, keys, capability=capability):
        rows = await _xrange(redis, stream, "-", "+", count=limit)
        out += [DeadLetterEntry(stream, parse_dead_letter(i, f)) for i, f in rows]
    return out


async def _xrange(
    redis: AnyRedis, stream: str | bytes, start: str, end: str, count: int | None = None
) -> list[Any]:
    """XRANGE of a dead-letter stream; a key of another type there reads as empty."""
    try:
        return list(await redis.xrange(stream, start, end, count=count))
    except rexc.ResponseError as e:
        if "WRONGTYPE" not in str(e):
            raise
        return []


async def find_dead_letter(
    redis: AnyRedis, keys: Keys, entry_id: str, *, capability: str | None = None
) -> DeadLetterEntry:
    """The dead letter with id ``entry_id`` (as ``reach dlq list`` shows it).

    Raises :class:`BadDeadLetterId` for text that is no entry id,
    :class:`DeadLetterNotFound` when no stream has it, and, without ``capability``,
    :class:`AmbiguousDeadLetterId` when several capabilities' streams have it (an entry id
    is unique within its stream only: letters written in the same millisecond share one).
    """
    if not _STREAM_ID.fullmatch(entry_id):
        raise BadDeadLetterId(
            f"{entry_id!r} is not a dead letter id: they look like 1717171717171-0 "
            "(see `reach dlq list`)."
        )
    found: list[DeadLetterEntry] = []
    for stream in await dead_letter_streams(redis, keys, capability=capability):
        rows = await _xrange(redis, stream, entry_id, entry_id)
        if rows:
            found.append(DeadLetterEntry(stream, parse_dead_letter(*rows[0])))
    if len(found) == 1:
        return found[0]
    if found:
        caps = ", ".join(
            keys.capability_of_dlq(e.stream if isinstance(e.stream, str) else repr(e.stream))
            for e in found
        )
        raise AmbiguousDeadLetterId(
            f"Dead letter {entry_id!r} is in the dead letters of {len(found)} capabilities "
            f"({caps}): name one with --cap (capability=...)."
        )
    raise DeadLetterNotFound(f"No dead letter {entry_id!r} (see `reach dlq list`).")


def client_name(namespace: str, client_id: str) -> str:
    """The name a :class:`reach.Client` gives its Redis connections (``CLIENT LIST``)."""
    return safe_client_name(f"reach:{namespace}:{client_id}")


async def live_clients(redis: AnyRedis, keys: Keys) -> set[str] | None:
    """The client ids of the namespace with a connection open now: every
    :class:`reach.Client` that connected by itself names its connections
    ``reach:<namespace>:<client_id>`` (:func:`client_name`), seen in ``CLIENT LIST`` (on
    every node of a Cluster). None when the server refuses ``CLIENT LIST`` (an ACL)."""
    prefix = client_name(keys.namespace, "")
    try:
        if isinstance(redis, AsyncRedisCluster):
            reply = await redis.execute_command(
                "CLIENT LIST", target_nodes=AsyncRedisCluster.ALL_NODES
            )
        else:
            reply = await redis.execute_command("CLIENT LIST")
    except rexc.NoPermissionError:
        return None
    return {n[len(prefix) :] for n in _client_names(reply) if n.startswith(prefix)}


def _client_names(reply: Any) -> Iterable[str]:
    """The ``name`` of every connection in a ``CLIENT LIST`` reply: parsed (a list of
    dicts), per node (a dict of those), or the raw text (one ``k=v ...`` line each)."""
    if isinstance(reply, dict):
        for v in reply.values():
            yield from _client_names(v)
    elif isinstance(reply, list):
        for c in reply:
            if isinstance(c, dict):
                name = safe_text(c.get("name") or "")
                if name:
                    yield name
            else:
                yield from _client_names(c)
    elif isinstance(reply, (bytes, str)):
        for line in safe_text(reply).splitlines():
            for part in line.split(" "):
                if part.startswith("name=") and len(part) > 5:
                    yield part[5:]


async def replay_dead_letters(
    redis: AnyRedis,
    keys: Keys,
    entries: Sequence[DeadLetterEntry],
    *,
    on_each: Callable[[], None] | None = None,
    reply_to: str | None = None,
    fallback_reply_to: str = "",
    client: Client | None = None,
    as_operator: bool = False,
    control: AnyRedis | None = None,
) -> ReplayResult:
    """Send dead letters again, through the router like any message: the same msg_id and
    idempotency key (a message that did complete meanwhile is not run twice), attempts
    from 1, no deadline. A letter sent again is deleted from its stream; one that cannot
    be sent (bytes that were no envelope, no agent, a full inbox) stays and is listed in
    the result. ``on_each`` is called after each letter (for a progress bar).

    Where the outcome is published: ``reply_to`` (a client id) when given; else the
    original caller while it is live (a connection of its client id is open now: see
    :func:`live_clients`); a caller that is gone, or that cannot be told from a gone
    one, gets nothing: the reply goes to ``fallback_reply_to`` (a client id, e.g. the
    replaying client that waits for it) or nowhere (``""``), never into a dead client's
    reply stream, where it would sit for 24 h. Whatever the choice, the outcome is in the
    message's task record (``reach task MSG_ID``, :meth:`Client.result`).

    ``client`` sends them (its reader gets the replies sent to it); else one is made on
    ``redis`` for the call. A client with keys re-signs only letters whose original
    signature verifies; an unsigned or forged one stays, listed in the result, unless
    ``as_operator`` sends every letter as this client's own message (its ``source`` the
    client's id, signed by it): the handler's ``ctx.sender`` then names the operator.
    ``control``: the control plane's Redis (the audit trail, the registry) when it is not
    ``redis`` (reach.planes).
    """
    out = ReplayResult()
    caps = sorted({keys.capability_of_dlq(safe_text(e.stream)) for e in entries})
    async with audit.operator_action(
        control or redis,
        keys,
        "dlq.replay",
        target=",".join(caps)[:200],
        detail={"letters": [e.letter.id for e in entries][:50], "as_operator": as_operator},
    ) as note:
        await _replay_all(redis, keys, entries, out, on_each, reply_to, fallback_reply_to,
                          client, as_operator, control)  # fmt: skip
        note.detail.update(replayed=out.replayed, failed=len(out.failed))
        note.detail["msg_ids"] = [s.msg_id for s in out.sent][:50]
        if len(entries) == 1 and entries[0].letter.msg_id:
            note.msg_id = entries[0].letter.msg_id
        if out.failed and not out.replayed:
            note.outcome, note.error = "error", out.failed[0].error
    return out


async def _replay_all(
    redis: AnyRedis,
    keys: Keys,
    entries: Sequence[DeadLetterEntry],
    out: ReplayResult,
    on_each: Callable[[], None] | None,
    reply_to: str | None,
    fallback_reply_to: str,
    client: Client | None,
    as_operator: bool,
    control: AnyRedis | None = None,
) -> None:
    live = await live_clients(redis, keys) if reply_to is None else set()
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            made = Client(redis=redis, registry_redis=control, namespace=keys.namespace)
            client = await stack.enter_async_context(made)
        for entry in entries:
            d = entry.letter
            target = _reply_target(d, reply_to, live, fallback_reply_to)
            failed = await _replay_one(redis, client, entry, target[0], as_operator)
            if failed is None:
                out.replayed += 1
                out.sent.append(Replayed(d.id, d.msg_id, *target))
            else:
                out.failed.append(ReplayFailure(d.id, failed))
            if on_each is not None:
                on_each()


def _reply_target(
    d: DeadLetter, named: str | None, live: set[str] | None, fallback: str
) -> tuple[str, str]:
    """(client id to reply to, why): see :func:`replay_dead_letters`."""
    if named is not None:
        return named, "named"
    caller = d.envelope.reply_to if d.envelope is not None else ""
    if not caller:
        why = "no caller"
    elif live is None:
        why = "caller unknown"
    elif caller in live:
        return caller, "caller live"
    else:
        why = "caller gone"
    return (fallback, "fallback") if fallback and caller else ("", why)


async def _replay_one(
    redis: AnyRedis, client: Client, entry: DeadLetterEntry, reply_to: str, as_operator: bool
) -> str | None:
    """Replay one letter: None when sent (and deleted), else why not.

    A replay changes signed fields (``deadline_ms``, ``reply_to``), so a signing client
    signs the copy again, and only for a letter whose original signature verifies (with
    a shared secret its ``source`` stays, so does its sender; with per-identity keys the
    copy is signed by this client's identity). Anyone holding the namespace's keys can write a dead
    letter, so one that is unsigned or forged is refused (it stays), unless
    ``as_operator``: then it is sent as a new message of this client, its ``source`` this
    client's id (``ctx.sender`` names the operator, never the letter's claimed sender).
    A client without keys sends the copy as it is (an agent requiring signatures refuses
    it again)."""
    d = entry.letter
    if d.envelope is None:
        return "not a valid envelope; cannot be replayed"
    original = d.envelope
    env = msgspec.structs.replace(original, attempt=1, deadline_ms=0, reply_to=reply_to)
    signer = client.signer
    if as_operator:
        env = msgspec.structs.replace(env, source=client.client_id, kid="", sig=b"")
    elif signer is not None:
        why = signer.check_envelope(original)
        if why is not None:
            return (
                f"its signature does not verify ({why}): it may be forged, so it is not "
                "signed for its claimed sender. Replay it as your own message "
                "(reach dlq replay --as-operator; as_operator=True), or purge it."
            )
        signer.sign_envelope(env)
    try:
        await client.deliver(env)
    except ReachError as e:
        return str(e)
    await redis.xdel(entry.stream, d.id)
    return None


async def purge_dead_letters(
    redis: AnyRedis, keys: Keys, *, capability: str | None = None, control: AnyRedis | None = None
) -> int:
    """Delete dead letters for good (every capability's, or one's); returns how many.
    ``control``: the audit trail's Redis when not ``redis`` (reach.planes)."""
    async with audit.operator_action(
        control or redis, keys, "dlq.purge", target=capability or "*"
    ) as note:
        n = 0
        for stream in await dead_letter_streams(redis, keys, capability=capability):
            n += int(await redis.xlen(stream))
            await redis.delete(stream)
        note.detail["purged"] = n
    return n


async def drain_agent(redis: AnyRedis, keys: Keys, agent_id: str) -> int:
    """An operator's drain of ``agent_id`` (``reach agents drain``, the console): no new
    work is routed to it, it finishes what it holds, then deregisters. Returns
    :meth:`reach.registry.Registry.drain`'s code (2: it was draining already). Recorded
    in the audit trail (an agent draining itself as it stops is not)."""
    async with audit.operator_action(redis, keys, "agents.drain", target=agent_id) as note:
        code = await Registry(redis, keys.namespace).drain(agent_id)
        note.detail["already_draining"] = code == 2
    return code


async def dead_letter_counts(redis: AnyRedis, keys: Keys) -> list[DeadLetterCount]:
    """Per capability with dead letters: how many there are now, and how many were ever
    filed (for a rate: see ``reach top``). One pipelined round trip after the SCAN."""
    streams = await dead_letter_streams(redis, keys)
    if not streams:
        return []
    pipe = redis.pipeline(transaction=False)
    for stream in streams:
        pipe.xinfo_stream(stream)
    out: list[DeadLetterCount] = []
    for stream, info in zip(streams, await pipe.execute(raise_on_error=False), strict=True):
        if isinstance(info, Exception):  # not a stream (any more)
            continue
        added = _field(info, "entries-added")
        out.append(
            DeadLetterCount(
                capability=keys.capability_of_dlq(safe_text(stream)),
                count=int(_field(info, "length") or 0),
                added=None if added is None else int(added),
            )
        )
    return out


# -- inboxes ------------------------------------------------------------------------------
@dataclass(slots=True)
class InboxStats:
    """One agent's inbox: its three priority streams.

    * ``depth`` - entries per priority (see :func:`queue_depths`); ``queued`` their sum;
    * ``pending`` - entries delivered to the agent and not yet acknowledged;
    * ``oldest_pending_ms`` - epoch ms at which the oldest of those was added (None: none);
    * ``added`` / ``read`` (only with ``counters=True``) - per priority, the entries ever
      added to the stream and the entries the agent's group ever read: Redis keeps both
      counters itself (Redis >= 7), so two readings give message rates. A priority whose
      counter is not known (no stream yet, an older server) is missing.
    """

    agent_id: str
    depth: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRIORITIES, 0))
    pending: int = 0
    oldest_pending_ms: int | None = None
    added: dict[str, int] = field(default_factory=dict)
    read: dict[str, int] = field(default_factory=dict)

    @property
    def queued(self) -> int:
        return sum(self.depth.values())


def _depth(reply: Any) -> int:
    """An XLEN reply as a depth: a stream Redis refused to measure (another type) is 0."""
    return 0 if isinstance(reply, Exception) else int(reply)


async def queue_depths(
    redis: AnyRedis, keys: Keys, agent_ids: Iterable[str]
) -> dict[str, dict[str, int]]:
    """Inbox depth per agent and priority, in one pipelined round trip.

    This is reach's one definition of queue depth: the entries in each priority stream
    (``XLEN``), i.e. messages waiting plus those being handled. A missing stream is 0,
    and so is a key of another type where a stream should be.
    """
    ids = list(dict.fromkeys(agent_ids))
    if not ids:
        return {}
    pipe = redis.pipeline(transaction=False)
    for agent_id in ids:
        for stream in keys.inboxes(agent_id):
            pipe.xlen(stream)
    res = await pipe.execute(raise_on_error=False)
    n = len(PRIORITIES)
    return {
        agent_id: {p: _depth(x) for p, x in zip(PRIORITIES, res[i * n : i * n + n], strict=True)}
        for i, agent_id in enumerate(ids)
    }


def queue_depths_sync(redis: Any, keys: Keys, agent_id: str) -> dict[str, int]:
    """:func:`queue_depths` of one agent on a synchronous client (a heartbeat thread's)."""
    pipe = redis.pipeline(transaction=False)
    for stream in keys.inboxes(agent_id):
        pipe.xlen(stream)
    res = pipe.execute(raise_on_error=False)
    return {p: _depth(x) for p, x in zip(PRIORITIES, res, strict=True)}


async def inbox_agents(redis: AnyRedis, keys: Keys) -> list[str]:
    """The agent ids that have an inbox stream in the namespace (registered or not:
    an evicted agent's inbox waits for the sweeper), sorted."""
    ids = {
        keys.agent_id_of_inbox(safe_text(key))  # a key name may not be UTF-8
        async for key in redis.scan_iter(match=keys.inbox_pattern, count=1000)
    }
    return sorted(ids)


async def inbox_stats(
    redis: AnyRedis, keys: Keys, agent_ids: Iterable[str], *, counters: bool = False
) -> list[InboxStats]:
    """Statistics of each agent's inbox (see :class:`InboxStats`), in the order given.

    Two pipelined round trips whatever the number of agents; ``counters=True`` adds
    Redis' stream counters (two ``XINFO`` per stream: a viewer's cost, not the runtime's).
    """
    ids = list(dict.fromkeys(agent_ids))
    depths = await queue_depths(redis, keys, ids)
    out = [InboxStats(a, depth=depths[a]) for a in ids]
    if not out:
        return out
    streams = [(s, p, keys.inbox(s.agent_id, p)) for s in out for p in PRIORITIES]
    pipe = redis.pipeline(transaction=False)
    for _, _, stream in streams:
        pipe.xpending(stream, GROUP)
        if counters:
            pipe.xinfo_stream(stream)
            pipe.xinfo_groups(stream)
    res = await pipe.execute(raise_on_error=False)
    step = 3 if counters else 1
    for i, (s, prio, stream) in enumerate(streams):
        _add_pending(s, res[i * step])
        if counters:
            _add_counters(s, prio, res[i * step + 1], res[i * step + 2])
    return out


def _add_pending(s: InboxStats, summary: Any) -> None:
    """Add an XPENDING summary (an error: no stream or no group yet, nothing pending)."""
    if not isinstance(summary, dict):
        return
    s.pending += int(summary.get("pending") or 0)
    low = summary.get("min")
    if low:
        ms = int(as_text(low).split("-")[0])
        s.oldest_pending_ms = ms if s.oldest_pending_ms is None else min(s.oldest_pending_ms, ms)


def _add_counters(s: InboxStats, prio: str, info: Any, groups: Any) -> None:
    """Add a stream's entries-added and its group's entries-read (when Redis knows them)."""
    if isinstance(info, Exception):  # no such stream (yet)
        return
    added = _field(info, "entries-added")
    if added is not None:
        s.added[prio] = int(added)
    for g in groups if isinstance(groups, list) else []:
        if safe_text(_field(g, "name")) != GROUP:
            continue
        read = _field(g, "entries-read")
        if read is None and safe_text(_field(g, "last-delivered-id")) == "0-0":
            read = 0  # nothing read yet (Redis reports nil then)
        if read is not None:
            s.read[prio] = int(read)


def _field(d: Any, name: str) -> Any:
    """A field of an XINFO reply, whichever way the client decoded its names."""
    if not isinstance(d, dict):
        return None
    v = d.get(name)
    return d.get(name.encode()) if v is None else v


# -- sweeping -----------------------------------------------------------------------------
@dataclass(slots=True)
class SweepReport:
    """What one sweep pass did.

    Leases (``lua/sweep.lua``): agents moved to probation, evicted (their ids), shadow
    records deleted. Chores (:func:`reach.sweeper.sweep_chores`): retries moved from the
    delayed set to an inbox, messages of evicted agents rerouted or parked, parked
    messages released, messages expired or dead-lettered on the way. ``locked``: another
    sweeper held the lock, nothing was done.
    """

    probation: int = 0
    evicted: list[str] = field(default_factory=list)
    deleted: int = 0
    retries_moved: int = 0
    rerouted: int = 0
    parked: int = 0
    released: int = 0
    expired: int = 0
    dead_lettered: int = 0
    locked: bool = False


async def sweep_once(
    redis: AnyRedis,
    keys: Keys,
    *,
    owner: str = "cli",
    lock_ms: int = 0,
    dlq_maxlen: int = DLQ_MAXLEN,
    control: AnyRedis | None = None,
) -> SweepReport:
    """One pass of the cluster-wide chores, as a runtime holding the sweeper lock does it:
    advance due leases, then move retries, evicted agents' inboxes and parked messages.

    ``lock_ms=0`` sweeps whoever holds the lock (what ``reach sweep`` does when no agent
    runs); with ``lock_ms > 0`` only the lock's holder (``owner``) sweeps. ``control``: the
    control plane's Redis (registry, audit) when not ``redis`` (reach.planes).
    """
    ctl = control or redis
    async with audit.operator_action(ctl, keys, "sweep", target=keys.namespace) as note:
        report = await _sweep(redis, keys, owner, lock_ms, dlq_maxlen, control)
        note.detail.update(
            {k: v for k, v in dataclasses.asdict(report).items() if v and k != "evicted"}
        )
        if report.evicted:
            note.detail["evicted"] = report.evicted[:50]
    return report


async def _sweep(
    redis: AnyRedis,
    keys: Keys,
    owner: str,
    lock_ms: int,
    dlq_maxlen: int,
    control: AnyRedis | None = None,
) -> SweepReport:
    registry = Registry(control or redis, keys.namespace)
    res = await registry.sweep(owner=owner, lock_ms=lock_ms)
    leases = SweepReport(
        probation=res.probation, evicted=list(res.evicted), deleted=res.deleted, locked=res.locked
    )
    if not res.chores:  # another runtime holds shard 0's lock: it does the chores
        return leases
    async with Client(redis=redis, registry_redis=control, namespace=keys.namespace) as client:
        moved = await sweep_chores(redis, keys, client, registry, dlq_maxlen=dlq_maxlen)
    return dataclasses.replace(
        leases,
        retries_moved=moved.retried,
        rerouted=moved.rerouted,
        parked=moved.parked,
        released=moved.released,
        expired=moved.expired,
        dead_lettered=moved.dead,
    )

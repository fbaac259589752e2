"""Typed calls of the inbox scripts: send, enqueue, mark_pending, drop_inbox, reroute
(``lua/<name>.lua``; each header is the contract), and :func:`send_many` (many sends in
one pipeline).

Sending adds the message to the agent's inbox (unless it is at the agent's bound) and
marks its idempotency record pending. On standalone Redis ``send.lua`` does both in one
step. On a Cluster the inbox and the record are in different slots: ``enqueue.lua`` adds
to the inbox within its bound (or a plain XADD when unbounded, followed by the agent's
wake-up ``SPUBLISH`` that enqueue.lua sends itself), then ``mark_pending.lua``
writes the record on its own slot (and a plain SET the msg_id pointer, in a third slot).
:func:`send` takes ``cluster`` and makes that choice; either way the task status is
written by a script.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..connection import AnyRedis
from ..envelope import Envelope
from ..keys import PRIORITIES, Keys
from ._call import Call, as_int, as_text, code_of, run_calls
from ._loader import Op, is_data_error, run_pipeline
from .codes import DropInboxCode, RerouteCode

CLAIM_AT_SEND_FENCE = 1
"""The fence of a claim send.lua makes at send (always a fresh record's first claim)."""

MAX_BOUND = 999_999_999_999_999
"""The largest max_queue send.lua and enqueue.lua take; a larger bound is sent as this."""


# The per-message records below are msgspec Structs rather than frozen dataclasses: a
# sending caller makes several per message, and a Struct is built ten times faster.
class Sent(msgspec.Struct, frozen=True, gc=False):
    """The inbox entry id of the added message, or (``refused``) the depth of the inbox
    (queued + being handled) that was at or over its bound: nothing was written."""

    entry_id: str = ""
    depth: int = 0

    @property
    def refused(self) -> bool:
        return not self.entry_id


def _sent(reply: Any) -> Sent:
    # An integer reply is the depth of a full inbox; anything else the new entry's id.
    return Sent(depth=reply) if isinstance(reply, int) else Sent(entry_id=as_text(reply))


def _bound(max_queue: int) -> int:
    return min(max(0, max_queue), MAX_BOUND)


class Message(msgspec.Struct, frozen=True, gc=False):
    """A message to add to an agent's inbox: its encoded envelope ``data`` and what its
    idempotency record keeps. ``key``: the record's key (the caller's idempotency key, or
    the msg_id; a caller's key scoped as :func:`reach.envelope.scoped_key` makes it);
    ``idempotency_key``: the caller's own, or ``''``."""

    data: bytes
    capability: str
    attempt: int
    msg_id: str
    key: str
    idempotency_key: str = ""

    @classmethod
    def of(cls, env: Envelope, data: bytes) -> Message:
        """What the inbox scripts take of ``env``, encoded as ``data``."""
        return cls(
            data=data,
            capability=env.capability,
            attempt=env.attempt,
            msg_id=env.msg_id,
            key=env.key,
            idempotency_key=env.idempotency_key,
        )

    @property
    def pointer(self) -> str:
        """What the msg_id -> record pointer holds: the record's key when the caller chose
        its own idempotency key, else ``''`` (no pointer: the record is named by the
        msg_id)."""
        return self.key if self.idempotency_key else ""


def send_call(
    keys: Keys,
    m: Message,
    *,
    agent_id: str,
    priority: str,
    ttl_ms: int,
    max_queue: int = 0,
    claim_for: str = "",
    claim_lease_ms: int = 0,
) -> Call[Sent]:
    """One ``send.lua`` call (standalone Redis): add ``m`` to the inbox of ``agent_id`` at
    ``priority`` unless it holds ``max_queue`` entries (0: unbounded), and mark its record
    pending; record and pointer live ``ttl_ms``. ``claim_for`` (``"<agent_id>/<instance_id>"``
    of the runtime it goes to, with ``claim_lease_ms``): claim a key sent for the first
    time for that runtime, which then runs it without a claim round trip (send.lua's
    header)."""
    bound = _bound(max_queue)
    k = [keys.inbox(agent_id, priority), keys.idem(m.key), keys.task(m.msg_id)]
    if bound:
        k += keys.inboxes(agent_id)
    args: tuple[Any, ...] = (
        m.data,
        m.capability,
        m.attempt,
        m.msg_id,
        m.pointer,
        ttl_ms,
        bound,
    )
    if claim_for:
        args += (claim_for, claim_lease_ms)
    return Call("send", tuple(k), args, _sent)


def send_batch_call(
    keys: Keys,
    messages: Sequence[tuple[Message, str]],
    *,
    agent_id: str,
    ttl_ms: int,
    max_queue: int = 0,
    claim_for: str = "",
    claim_lease_ms: int = 0,
) -> Call[list[Sent]]:
    """One ``send.lua`` call in its batch form (standalone Redis): add each ``(message,
    priority)`` of ``messages`` (two at least) to the inbox of ``agent_id``, in order, as
    :func:`send_call` would one by one (the ones past ``max_queue`` refused; with
    ``claim_for``, each fresh key claimed for that runtime); one :class:`Sent` per
    message. Messages alike in priority, capability and attempt, none under a caller's
    key (a coalesced or ``send_many`` batch), go in the script's compact form."""
    if len(messages) < 2:
        raise ValueError("the batch form of send.lua takes two messages at least")
    first, priority = messages[0]
    cap, attempt = first.capability, first.attempt
    if priority in PRIORITIES and all(
        p == priority and m.capability == cap and m.attempt == attempt and not m.idempotency_key
        for m, p in messages
    ):
        return _compact_call(
            keys,
            messages,
            agent_id=agent_id,
            ttl_ms=ttl_ms,
            max_queue=max_queue,
            claim_for=claim_for,
            claim_lease_ms=claim_lease_ms,
        )
    inboxes = dict(zip(PRIORITIES, keys.inboxes(agent_id), strict=True))
    # The first message in the one-message layout, then the batch's own slots per message.
    m, priority = messages[0]
    k: list[str] = [inboxes.get(priority) or keys.inbox(agent_id, priority)]
    k += keys.record_keys(m.key, m.msg_id)
    k += inboxes.values()
    args: list[Any] = [m.data, m.capability, m.attempt, m.msg_id, m.pointer]
    args += (ttl_ms, _bound(max_queue))
    if claim_for:
        args += (claim_for, claim_lease_ms)
    record_keys = keys.record_keys
    for m, priority in messages[1:]:
        k.append(inboxes.get(priority) or keys.inbox(agent_id, priority))
        k += record_keys(m.key, m.msg_id)
        # m.pointer, inlined: hundreds a call
        args += (m.data, m.capability, m.attempt, m.msg_id, m.key if m.idempotency_key else "")
    return Call("send", tuple(k), tuple(args), _sent_each)


def _compact_call(
    keys: Keys,
    messages: Sequence[tuple[Message, str]],
    *,
    agent_id: str,
    ttl_ms: int,
    max_queue: int,
    claim_for: str,
    claim_lease_ms: int,
) -> Call[list[Sent]]:
    """:func:`send_batch_call` of messages that share a priority, a capability and an
    attempt and have no caller's key: ``send.lua``'s compact form, where those are given
    once and each message takes its record key, envelope and msg_id."""
    first, priority = messages[0]
    k = [*keys.inboxes(agent_id)]
    idem = keys.idem
    k += [idem(m.key) for m, _ in messages]
    args: list[Any] = [
        "=",
        PRIORITIES.index(priority) + 1,
        first.capability,
        first.attempt,
        ttl_ms,
        _bound(max_queue),
        claim_for,
        claim_lease_ms if claim_for else 0,
    ]
    for m, _ in messages:
        args += (m.data, m.msg_id)
    return Call("send", tuple(k), tuple(args), _sent_each)


def _sent_each(reply: Any) -> list[Sent]:
    # Entry ids are ASCII digits and '-': decoded as they are (hundreds per reply).
    return [
        Sent(entry_id=x.decode("ascii", "replace")) if isinstance(x, bytes) else _sent(x)
        for x in reply
    ]


def enqueue_call(
    keys: Keys, data: bytes, *, agent_id: str, priority: str, max_queue: int
) -> Call[Sent]:
    """One ``enqueue.lua`` call: add ``data`` to the inbox of ``agent_id`` at ``priority``
    unless it holds ``max_queue`` (at least 1) entries. The record is not written."""
    inbox = keys.inbox(agent_id, priority)
    return Call("enqueue", (inbox, *keys.inboxes(agent_id)), (data, _bound(max_queue)), _sent)


def mark_pending_call(keys: Keys, m: Message, *, ttl_ms: int) -> Call[bool]:
    """One ``mark_pending.lua`` call (a Cluster's record step of a send): mark ``m``'s record
    pending unless its key is done (succeeded) or running (True: marked; False: kept: a
    released key, dead or retrying, runs again and is pending anew), write its capability,
    attempt and msg_id, and let it live ``ttl_ms``."""
    args = (m.capability, m.attempt, m.msg_id, ttl_ms)
    return Call("mark_pending", (keys.idem(m.key),), args, _marked)


def _marked(reply: Any) -> bool:
    return bool(as_int(reply))


def _record_ops(keys: Keys, m: Message, *, ttl_ms: int) -> list[Op]:
    """A Cluster's record step of a send: ``mark_pending.lua`` on the record's slot and,
    with a caller's idempotency key, the msg_id -> key pointer (no status: a plain SET on
    its own slot), as ``send.lua`` writes them on standalone Redis."""
    ops = [mark_pending_call(keys, m, ttl_ms=ttl_ms).op()]
    if m.pointer:
        ops.append(("SET", keys.task(m.msg_id), m.pointer, "PX", ttl_ms))
    return ops


async def send(
    r: AnyRedis,
    keys: Keys,
    m: Message,
    *,
    cluster: bool,
    agent_id: str,
    priority: str,
    ttl_ms: int,
    max_queue: int = 0,
    claim_for: str = "",
    claim_lease_ms: int = 0,
) -> Sent:
    """Add ``m`` to the inbox of ``agent_id`` (refused at ``max_queue``; 0: unbounded) and
    mark its record pending. Standalone: one ``send.lua`` step (claiming a fresh key for
    ``claim_for``, see :func:`send_call`). Cluster: ``enqueue.lua``
    (bounded) or an XADD, then ``mark_pending.lua`` and the pointer, in the same pipeline as
    the XADD when unbounded (their errors are not raised: the message is sent, its record is
    a status only; no claim at send). Errors raise; nothing is sent then."""
    if not cluster:
        return await send_call(
            keys,
            m,
            agent_id=agent_id,
            priority=priority,
            ttl_ms=ttl_ms,
            max_queue=max_queue,
            claim_for=claim_for,
            claim_lease_ms=claim_lease_ms,
        ).run(r)
    record = _record_ops(keys, m, ttl_ms=ttl_ms)
    if _bound(max_queue):
        sent = await enqueue_call(
            keys, m.data, agent_id=agent_id, priority=priority, max_queue=max_queue
        ).run(r)
        if not sent.refused:
            await run_pipeline(r, record)
        return sent
    out = await run_pipeline(
        r,
        [
            ("XADD", keys.inbox(agent_id, priority), "*", "e", m.data),
            ("SPUBLISH", keys.wake(agent_id), ""),  # in the inbox's slot: same node, same write
            *record,
        ],
    )
    if isinstance(out[0], Exception):
        raise out[0]
    return Sent(entry_id=as_text(out[0]))


class Delivery(msgspec.Struct, frozen=True, gc=False):
    """One message of :func:`send_many` and where it goes: the inbox of ``agent_id`` at
    ``priority``, refused at ``max_queue`` entries (0: unbounded)."""

    message: Message
    agent_id: str
    priority: str
    max_queue: int = 0
    claim_for: str = ""
    """Standalone Redis: claim a fresh key for this runtime (``"<agent_id>/<instance_id>"``,
    :func:`send_call`)."""
    claim_lease_ms: int = 0


async def send_many(
    r: AnyRedis, keys: Keys, items: Sequence[Delivery], *, cluster: bool, ttl_ms: int
) -> list[Sent | Exception]:
    """:func:`send` for each of ``items``, in one pipeline: per item its :class:`Sent`, or
    the error that stopped it, in its place (nothing is raised; a connection error is in
    the place of every item it stopped).

    Standalone: the items to one agent go in ``send.lua`` calls of its batch form (at most
    :data:`BATCH` messages each), the calls of all agents in one pipeline (one write on an
    auto-pipelined client, see :mod:`reach._autopipe`); a call refused for a bad argument or
    key (nothing written) is sent again as one call per message, so only the bad one
    fails. Cluster: the inbox step of every
    item (``enqueue.lua`` when bounded, else an XADD together with its record step) in one
    pipeline, which redis-py splits per node, then the record step of the bounded items
    that were added; a record step's error is not reported (the message is sent; its
    record is a status only), as in :func:`send`."""
    if not items:
        return []
    if not cluster:
        return await _send_batches(r, keys, items, ttl_ms=ttl_ms)
    ops: list[Op] = []
    first: list[int] = []  # per item: the index in ops of its inbox step
    for d in items:
        first.append(len(ops))
        if _bound(d.max_queue):
            call = enqueue_call(
                keys,
                d.message.data,
                agent_id=d.agent_id,
                priority=d.priority,
                max_queue=d.max_queue,
            )
            ops.append(call.op())
        else:
            ops.append(("XADD", keys.inbox(d.agent_id, d.priority), "*", "e", d.message.data))
            ops.append(("SPUBLISH", keys.wake(d.agent_id), ""))
            ops += _record_ops(keys, d.message, ttl_ms=ttl_ms)
    replies = await run_pipeline(r, ops)
    out: list[Sent | Exception] = []
    records: list[Op] = []
    for d, i in zip(items, first, strict=True):
        x = replies[i]
        sent = x if isinstance(x, Exception) else _sent(x)
        out.append(sent)
        if _bound(d.max_queue) and isinstance(sent, Sent) and not sent.refused:
            records += _record_ops(keys, d.message, ttl_ms=ttl_ms)
    await run_pipeline(r, records)
    return out


BATCH = 256
"""Messages in one batch call of ``send.lua`` at most (a script holds the server while it
runs: ~1 ms for this many)."""


async def _send_batches(
    r: AnyRedis, keys: Keys, items: Sequence[Delivery], *, ttl_ms: int
) -> list[Sent | Exception]:
    plan = Batches.of(keys, items, ttl_ms=ttl_ms)
    return await plan.finish(r, await run_calls(r, plan.calls))


@dataclass(frozen=True, slots=True)
class Batches:
    """The ``send.lua`` calls of :func:`send_many` on standalone Redis: the items to one
    agent (one bound, one claim) in calls of its batch form, :data:`BATCH` messages each at
    most. ``chunks[c]``: the indexes in ``items`` of the messages of ``calls[c]``. Run the
    calls as one likes (:func:`run_calls`, or submitted to an auto-pipeline without
    waiting), then :meth:`finish` reads their replies."""

    keys: Keys
    items: Sequence[Delivery]
    ttl_ms: int
    chunks: list[list[int]]
    calls: list[Call[Any]]

    @classmethod
    def of(cls, keys: Keys, items: Sequence[Delivery], *, ttl_ms: int) -> Batches:
        groups: dict[tuple[str, int, str], list[int]] = {}
        for i, d in enumerate(items):
            # by the bound as given (one agent's items share it): _bound() per item cost
            # more than the rare extra call of two spellings of one bound
            groups.setdefault((d.agent_id, d.max_queue, d.claim_for), []).append(i)
        chunks: list[list[int]] = []
        calls: list[Call[Any]] = []
        for idx in groups.values():
            for start in range(0, len(idx), BATCH):
                chunk = idx[start : start + BATCH]
                chunks.append(chunk)
                calls.append(_call_for(keys, [items[i] for i in chunk], ttl_ms=ttl_ms))
        return cls(keys, items, ttl_ms, chunks, calls)

    async def finish(self, r: AnyRedis, replies: Sequence[Any]) -> list[Sent | Exception]:
        """Per item its :class:`Sent` or its error, from ``replies`` (the calls' decoded
        replies, or errors, in order). The items of a call refused for a bad argument or
        key (nothing written) are sent again through ``r``, one call each, so only the bad
        one fails."""
        items = self.items
        out: list[Sent | Exception] = [Sent()] * len(items)
        alone: list[int] = []  # items of refused batch calls: sent again one by one
        for chunk, reply in zip(self.chunks, replies, strict=True):
            if isinstance(reply, Exception):
                if len(chunk) > 1 and is_data_error(reply):
                    alone += chunk
                    continue
                for i in chunk:
                    out[i] = reply
            elif isinstance(reply, Sent):
                out[chunk[0]] = reply
            else:
                for i, sent in zip(chunk, reply, strict=True):
                    out[i] = sent
        if alone:
            calls = [_call_for(self.keys, [items[i]], ttl_ms=self.ttl_ms) for i in alone]
            for i, x in zip(alone, await run_calls(r, calls), strict=True):
                out[i] = x
        return out


def _call_for(keys: Keys, ds: Sequence[Delivery], *, ttl_ms: int) -> Call[Any]:
    """The ``send.lua`` call of ``ds`` (one agent, one bound, one claim): the one-message
    form for a single item, else the batch form (the claim's lease: the least of theirs)."""
    d = ds[0]
    if len(ds) == 1:
        return send_call(
            keys,
            d.message,
            agent_id=d.agent_id,
            priority=d.priority,
            ttl_ms=ttl_ms,
            max_queue=d.max_queue,
            claim_for=d.claim_for,
            claim_lease_ms=d.claim_lease_ms,
        )
    return send_batch_call(
        keys,
        [(x.message, x.priority) for x in ds],
        agent_id=d.agent_id,
        ttl_ms=ttl_ms,
        max_queue=d.max_queue,
        claim_for=d.claim_for,
        claim_lease_ms=min([x.claim_lease_ms for x in ds]) if d.claim_for else 0,
    )


def drop_inbox(keys: Keys, *, agent_id: str) -> Call[DropInboxCode]:
    """Delete ``agent_id``'s three inbox streams (and their group) if all are empty:
    DROPPED (or nothing to drop), or KEPT."""
    return Call("drop_inbox", tuple(keys.inboxes(agent_id)), (), code_of(DropInboxCode))


@dataclass(frozen=True, slots=True)
class Rerouted:
    """``reroute.lua``'s answer: its ``code``; the new entry id when MOVED, the new inbox's
    depth when FULL, the record's status when SETTLED."""

    code: RerouteCode
    entry_id: str = ""
    depth: int = 0
    status: str = ""


def _rerouted(reply: Any) -> Rerouted:
    code = RerouteCode(as_int(reply[0]))
    if code == RerouteCode.MOVED:
        return Rerouted(code, entry_id=as_text(reply[1]))
    if code == RerouteCode.FULL:
        return Rerouted(code, depth=as_int(reply[1]))
    return Rerouted(code, status=as_text(reply[1]))


def reroute_call(
    keys: Keys,
    *,
    record: str,
    from_agent: str,
    entry_id: str,
    to_agent: str,
    priority: str,
    max_queue: int = 0,
) -> Call[Rerouted]:
    """One ``reroute.lua`` call (standalone Redis): move the entry ``entry_id`` of
    ``from_agent``'s inbox at ``priority`` to ``to_agent``'s, unless ``from_agent`` read it
    already or ``to_agent``'s inbox holds ``max_queue`` entries (0: unbounded); ``record``
    is the message's idempotency record key (:meth:`reach.keys.Keys.idem`)."""
    k = (
        keys.inbox(from_agent, priority),
        record,
        keys.inbox(to_agent, priority),
        *keys.inboxes(to_agent),
    )
    return Call("reroute", k, (entry_id, _bound(max_queue), to_agent), _rerouted)

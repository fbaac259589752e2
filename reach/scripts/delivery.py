"""Typed calls of the delivery scripts: fetch, claim (which also takes a key over from an
owner judged gone), start (confirms a claim made at send), give_up, complete, settle (``lua/<name>.lua``; each header is the
contract).

Idempotency records live in a slot each. On standalone Redis one call serves a whole batch;
on a Cluster each record needs its own call (pipelined), and ``settle.lua``, whose batch
spans inboxes, records and reply streams, becomes ``complete.lua`` per record and then a
pipeline of the rest. :func:`claim`, :func:`complete` and :func:`settle` take ``cluster``
and make that choice, so a caller writes one code path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import msgspec
from redis import exceptions as rexc

from ..connection import AnyRedis
from ..envelope import Reply, decode_stored
from ..keys import GROUP, Keys
from ..outcomes import Status
from ._call import Arg, Call, as_bytes, as_int, as_text, run_calls
from ._loader import Op, first_error, is_data_error, run_pipeline
from .codes import ClaimCode, FollowUpKind, SettleCode, StreamBound

log = logging.getLogger("reach.scripts")


class Mode(StrEnum):
    """What a completion does with the idempotency key."""

    DONE = "done"
    """Final: the reply is stored, later deliveries of the key replay it."""
    RELEASE = "release"
    """The key may be claimed and run again (a retry, a dead letter that may be replayed)."""


# -- fetch ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Fetched:
    """What ``fetch.lua`` read. ``inboxes``: (stream key, entries) of each priority, high
    first, entries as Redis gives them (``[id, [field, value, ...]]``, untrusted);
    ``*_waiting``: that priority got nothing although it has unread entries."""

    inboxes: tuple[tuple[str, list[Any]], ...]
    normal_waiting: bool
    low_waiting: bool

    @property
    def got(self) -> list[tuple[str, list[Any]]]:
        """The (stream key, entries) of the priorities that gave entries."""
        return [(k, entries) for k, entries in self.inboxes if entries]


def fetch(
    keys: Keys, *, agent_id: str, n: int, keep_normal: int, keep_low: int, group: str = GROUP
) -> Call[Fetched]:
    """Read up to ``n`` new entries of ``agent_id``'s inbox, high priority first, keeping
    ``keep_normal`` and ``keep_low`` slots for the lower priorities while they have work.
    Raises ``ResponseError`` NOGROUP when a stream or its group is missing (nothing read)."""
    inboxes = tuple(keys.inboxes(agent_id))

    def decode(reply: Any) -> Fetched:
        return Fetched(
            tuple(zip(inboxes, (list(e) for e in reply[:3]), strict=True)),
            bool(as_int(reply[3])),
            bool(as_int(reply[4])),
        )

    return Call("fetch", inboxes, (group, agent_id, n, keep_normal, keep_low), decode)


# -- claim ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClaimItem:
    """One key to claim: its idempotency record, the lease of the claim, the delivery;
    ``takeover_from``: the owner read from the record and judged gone (``''``: a plain
    claim). A claim of exactly that owner does not hold the key: it is ended and the key
    claimed in the same call; a claim of anyone else still makes the key BUSY."""

    key: str
    lease_ms: int
    msg_id: str
    takeover_from: str = ""


@dataclass(frozen=True, slots=True)
class Claimed:
    """One key's answer: RUN with ``fence`` (complete with it), REPLAY with the stored
    ``reply`` and the record's ``status``, ``agent_id`` and ``msg_id`` (:meth:`stored`
    rebuilds the reply from them), BUSY with the ``owner`` of the claim that holds it, or
    POISONED. ``runs`` and ``takeovers`` (POISONED): the runs the record counts, and its
    claims that never ended (the takeovers, this one included)."""

    code: ClaimCode
    fence: int = 0
    reply: bytes = b""
    owner: str = ""
    runs: int = 0
    takeovers: int = 0
    status: str = ""
    agent_id: str = ""
    msg_id: str = ""

    def stored(self, key: str) -> Reply:
        """The stored reply (REPLAY), either form, of the record named by ``key`` (its
        msg_id when the record has none); raises BadEnvelope if unreadable."""
        msg_id = self.msg_id or key
        return decode_stored(self.reply, msg_id=msg_id, status=self.status, agent_id=self.agent_id)


# The codes by their integer: a dict lookup per answer instead of an Enum call (a batch
# decodes one per message).
_CLAIM_CODES = {int(c): c for c in ClaimCode}
_SETTLE_CODES = {int(c): c for c in SettleCode}


def decode_claimed(answer: Any) -> Claimed:
    """One key's answer of ``claim.lua`` (``{code, value}``)."""
    raw = answer[0]
    code = _CLAIM_CODES.get(raw) if type(raw) is int else None
    if code is None:
        code = ClaimCode(as_int(raw))
    if code is ClaimCode.RUN:
        return Claimed(code, fence=as_int(answer[1]))
    if code is ClaimCode.POISONED:
        return Claimed(code, runs=as_int(answer[1]), takeovers=as_int(answer[2]))
    if code is ClaimCode.REPLAY:
        return Claimed(
            code,
            reply=as_bytes(answer[1]),
            status=as_text(answer[2]),
            agent_id=as_text(answer[3]),
            msg_id=as_text(answer[4]),
        )
    return Claimed(code, owner=as_text(answer[1]))


def _claims(reply: Any) -> list[Claimed]:
    return [decode_claimed(a) for a in reply]


DEFAULT_MAX_TAKEOVERS = 3
"""How many times a run that never ended may be taken over (RuntimeOptions.max_takeovers)."""


def claim_call(
    items: Sequence[ClaimItem],
    *,
    owner: str,
    ttl_ms: int,
    agent_id: str,
    max_takeovers: int = DEFAULT_MAX_TAKEOVERS,
) -> Call[list[Claimed]]:
    """One ``claim.lua`` call for ``items`` (their keys in one slot: one key, or standalone
    Redis). ``owner``: ``"<agent_id>/<instance_id>"``; ``ttl_ms``: how long records live;
    ``max_takeovers``: a key whose unfinished runs were taken over this many times is
    poisoned at the next takeover (not run)."""
    args: list[Any] = [owner, ttl_ms, agent_id, max_takeovers]
    for it in items:
        args += [it.lease_ms, it.msg_id, it.takeover_from]
    return Call("claim", tuple(it.key for it in items), tuple(args), _claims)


async def claim(
    r: AnyRedis,
    items: Sequence[ClaimItem],
    *,
    cluster: bool,
    owner: str,
    ttl_ms: int,
    agent_id: str,
    max_takeovers: int = DEFAULT_MAX_TAKEOVERS,
) -> list[Claimed | Exception]:
    """Claim ``items``: one answer, or the error that refused it, per item.

    Standalone: one call for the batch. A refusal refuses the whole batch (nothing is
    written); when it is for the data (a record of the wrong type), each item is claimed
    alone, so only the culprit gets the refusal. Cluster: one call per key, pipelined,
    each with its own answer or error. Errors other than a refusal on standalone Redis
    (connection, timeout) raise."""
    if not items:
        return []
    if cluster:
        calls = [
            claim_call(
                [it], owner=owner, ttl_ms=ttl_ms, agent_id=agent_id, max_takeovers=max_takeovers
            )
            for it in items
        ]
        return [x if isinstance(x, Exception) else x[0] for x in await run_calls(r, calls)]
    try:
        return list(
            await claim_call(
                items, owner=owner, ttl_ms=ttl_ms, agent_id=agent_id, max_takeovers=max_takeovers
            ).run(r)
        )
    except rexc.ResponseError as e:
        if len(items) == 1 or not is_data_error(e):
            return [e] * len(items)
    out: list[Claimed | Exception] = []
    for it in items:
        try:
            out += await claim_call(
                [it], owner=owner, ttl_ms=ttl_ms, agent_id=agent_id, max_takeovers=max_takeovers
            ).run(r)
        except rexc.ResponseError as e:
            out.append(e)
    return out


# -- start ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StartItem:
    """A record claimed at send for this runtime (``send.lua``) whose handler started:
    the claim's ``fence`` as the inbox entry gave it, and the ``lease_ms`` it now gets."""

    key: str
    lease_ms: int
    fence: int


def _started(reply: Any) -> list[bool]:
    return [as_int(x) == 1 for x in reply]


def start_call(items: Sequence[StartItem], *, owner: str, ttl_ms: int) -> Call[list[bool]]:
    """One ``start.lua`` call (standalone Redis): mark each record of ``items`` running
    under ``owner``'s lease if the claim send.lua made is still as the entry said; per
    item, True when it was."""
    args: list[Any] = [owner, ttl_ms]
    for it in items:
        args += [it.lease_ms, it.fence]
    return Call("start", tuple(it.key for it in items), tuple(args), _started)


@dataclass(frozen=True, slots=True)
class GivenUp:
    """``give_up.lua``'s answer: ``done`` when the key had completed meanwhile (nothing
    was written; ``reply`` is its stored reply, with the record's ``status``, ``agent_id``
    and ``msg_id`` it is rebuilt from: :meth:`stored`), else the status was written."""

    done: bool
    reply: bytes = b""
    status: str = ""
    agent_id: str = ""
    msg_id: str = ""

    def stored(self, key: str) -> Reply:
        """The stored reply, either form, of the record named by ``key`` (its msg_id when
        the record has none); raises BadEnvelope if unreadable."""
        msg_id = self.msg_id or key
        return decode_stored(self.reply, msg_id=msg_id, status=self.status, agent_id=self.agent_id)


def _given_up(reply: Any) -> GivenUp:
    if reply is None:
        return GivenUp(False)
    return GivenUp(
        True,
        as_bytes(reply[0]),
        status=as_text(reply[1]),
        agent_id=as_text(reply[2]),
        msg_id=as_text(reply[3]),
    )


def give_up(key: str, *, status: str, error: str, ttl_ms: int) -> Call[GivenUp]:
    """Record in idempotency record ``key`` that no handler will run its message
    (``status`` expired or dead, with ``error``), unless the key completed meanwhile."""
    return Call("give_up", (key,), (status, error, ttl_ms), _given_up)


@dataclass(frozen=True, slots=True)
class RenewItem:
    """A claim of a handler this runtime still runs: its record, the claim's ``fence``,
    and the ``lease_ms`` (from now) it is extended to."""

    key: str
    lease_ms: int
    fence: int


def renew_call(items: Sequence[RenewItem], *, owner: str) -> Call[list[bool]]:
    """One ``renew.lua`` call (one call for a batch on standalone Redis, one key per call on
    a Cluster): extend each claim of ``items`` still held by ``owner`` with its fence and
    not done; per item, True when it was."""
    args: list[Any] = [owner]
    for it in items:
        args += [it.lease_ms, it.fence]
    return Call("renew", tuple(it.key for it in items), tuple(args), _started)


# -- complete and settle -------------------------------------------------------------------
class Completion(msgspec.Struct, frozen=True, gc=False):
    """What to store in a claimed idempotency record ``key``, if ``fence`` still holds it:
    the task ``status`` (one of ``reach.outcomes.COMPLETION_STATUSES``) and ``error``; the
    reply too when ``mode`` is DONE. (A msgspec Struct: one is built per message settled,
    ~0.1 µs against a frozen dataclass's ~1 µs.)"""

    key: str
    fence: int
    status: str
    mode: Mode | str
    error: str = ""
    error_type: str = ""
    """The handler's exception type, stored with ``traceback`` (``''``: no failure detail)."""
    traceback: str = ""
    """The handler's traceback (bounded and redacted by the worker), stored in the record."""
    stored: bytes = b""
    """What the record keeps of the reply for later deliveries to replay (mode DONE only):
    its short form, :func:`reach.envelope.encode_stored`."""


def _settle_code(raw: Any) -> SettleCode:
    code = _SETTLE_CODES.get(raw) if type(raw) is int else None
    return SettleCode(as_int(raw)) if code is None else code


def _codes(reply: Any) -> list[SettleCode]:
    return [_settle_code(c) for c in reply]


def complete_call(
    items: Sequence[tuple[Completion, bytes]], *, ttl_ms: int
) -> Call[list[SettleCode]]:
    """One ``complete.lua`` call for (completion, stored reply) pairs (their records in one
    slot; the stored reply: :func:`reach.envelope.encode_stored`). It is sent only for
    DONE: only then is it stored."""
    args: list[Any] = [ttl_ms]
    for c, reply in items:
        args += [c.fence, c.status, reply if c.mode == Mode.DONE else "", c.mode, c.error]
    return Call("complete", tuple(c.key for c, _ in items), tuple(args), _codes)


async def complete(
    r: AnyRedis, items: Sequence[tuple[Completion, bytes]], *, cluster: bool, ttl_ms: int
) -> list[SettleCode | Exception]:
    """Store each completion: SETTLED, FENCED, or the error that refused it, per item.
    Standalone: one call (a refusal answers for every item); Cluster: one per key,
    pipelined. Errors other than a refusal on standalone Redis raise."""
    if not items:
        return []
    if cluster:
        calls = [complete_call([it], ttl_ms=ttl_ms) for it in items]
        return [x if isinstance(x, Exception) else x[0] for x in await run_calls(r, calls)]
    try:
        return list(await complete_call(items, ttl_ms=ttl_ms).run(r))
    except rexc.ResponseError as e:
        return [e] * len(items)


DEAD_LETTER_FIELDS = (
    "reason",
    "error",
    "error_type",
    "attempts",
    "agent_id",
    "msg_id",
    "capability",
    "ts",
    "env",
)
"""The fields of a dead-letter entry, in the order :func:`reach.tasks.dead_letter_op`
writes them and ``settle.lua`` takes their values."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead letter to file: ``XADD stream MAXLEN ~ maxlen * reason .. env ..`` (the
    fields of :data:`DEAD_LETTER_FIELDS`). What a dead letter holds is decided by
    :func:`reach.tasks.dead_letter_op`; :meth:`of_op` takes its command."""

    stream: str
    maxlen: int
    reason: str
    error: str
    error_type: str
    attempts: int
    agent_id: str
    msg_id: str
    capability: str
    ts_ms: int
    env: bytes
    traceback: str = ""
    """The handler's traceback, a last field ``traceback`` when not empty (not one of
    :data:`DEAD_LETTER_FIELDS`: older letters have none)."""

    @classmethod
    def of_op(cls, op: Op) -> DeadLetter:
        """The dead letter that the XADD ``op`` of :func:`reach.tasks.dead_letter_op` (or
        ``raw_dead_letter_op``) files. ValueError for another command: a bug."""
        head, fields = op[:6], op[6:]
        if (
            head[:1] != ("XADD",)
            or head[2:4] != ("MAXLEN", "~")
            or head[5:] != ("*",)
            or tuple(fields[0::2]) != DEAD_LETTER_FIELDS
        ):
            raise ValueError(f"not a dead letter's XADD (reach.tasks.dead_letter_op): {op[:8]!r}")
        return cls(head[1], head[4], *fields[1::2])

    @property
    def values(self) -> tuple[Arg, ...]:
        """The values of its fields, in the order of :data:`DEAD_LETTER_FIELDS`."""
        return (
            self.reason,
            self.error,
            self.error_type,
            self.attempts,
            self.agent_id,
            self.msg_id,
            self.capability,
            self.ts_ms,
            self.env,
        )

    def op(self) -> Op:
        """Its XADD as a command (a Cluster's pipeline): the same as :meth:`of_op`'s."""
        pairs = (x for kv in zip(DEAD_LETTER_FIELDS, self.values, strict=True) for x in kv)
        extra = ("traceback", self.traceback) if self.traceback else ()
        return ("XADD", self.stream, "MAXLEN", "~", self.maxlen, "*", *pairs, *extra)


@dataclass(frozen=True, slots=True)
class Delayed:
    """A message to deliver again later (a retry, or a parked copy of a busy key):
    ``ZADD zset due_ms envelope`` (the delayed set; a sweeper moves it to an inbox when
    due)."""

    zset: str
    due_ms: int
    envelope: bytes

    def op(self) -> Op:
        """Its ZADD as a command (a Cluster's pipeline)."""
        return ("ZADD", self.zset, self.due_ms, self.envelope)


FollowUp = DeadLetter | Delayed
"""What settling an item writes after its reply and before its ack."""


@dataclass(frozen=True, slots=True)
class RecentRows:
    """The index entries of a settled batch (reach.recent): ``XADD stream MAXLEN ~ maxlen
    * m <chunk>`` for each chunk, in the settle call itself."""

    stream: str
    maxlen: int
    chunks: tuple[bytes, ...]

    def ops(self) -> list[Op]:
        return [("XADD", self.stream, "MAXLEN", "~", self.maxlen, "*", "m", c) for c in self.chunks]


@dataclass(frozen=True, slots=True)
class SettleItem:
    """One handled inbox entry to settle, in this order: its ``completion`` (if any; when
    fenced, nothing else is done for it), its ``reply`` published to ``reply_stream``
    (``''``: nobody waits), its ``follow_up`` (a dead letter or a retry), then the ack and
    delete of ``entry_id`` in ``inbox`` (``''``: no ack)."""

    inbox: str
    entry_id: Any
    completion: Completion | None = None
    reply: bytes = b""
    reply_stream: str = ""
    follow_up: FollowUp | None = None


class SettleLike(Protocol):
    """What :func:`settle` reads of an item: a :class:`SettleItem`'s fields. The worker
    hands its own entries over as they are (reach._worker.items), with no copy per message."""

    @property
    def inbox(self) -> str: ...
    @property
    def entry_id(self) -> Any: ...
    @property
    def completion(self) -> Completion | None: ...
    @property
    def reply(self) -> bytes: ...
    @property
    def reply_stream(self) -> str: ...
    @property
    def follow_up(self) -> FollowUp | None: ...


# settle.lua's follow-up kinds as plain strings (redis-py sends an IntEnum's repr), and
# the index of no key.
_NO_FOLLOW_UP = str(int(FollowUpKind.NONE))
_DEAD_LETTER = str(int(FollowUpKind.DEAD_LETTER))
_RETRY = str(int(FollowUpKind.RETRY))
_NO_RECORD = "0"


def settle_call(
    items: Sequence[SettleLike],
    *,
    ttl_ms: int,
    group: str = GROUP,
    recent: RecentRows | None = None,
) -> Call[list[SettleCode]]:
    """One ``settle.lua`` call for ``items`` (standalone Redis: any keys). ``ttl_ms``: how
    long records and reply streams live. The slots of each item are fixed (the script's
    header): 11, then 11 for a dead letter or 3 for a retry; a plain success (succeeded,
    stored, no error, no reply to publish, no follow-up: most of a busy worker's items)
    takes 5, and consecutive ones of one fence and inbox, their records new to the call,
    go as one run of 2 each and 4 more. Then the failure details and ``recent``, the batch's rows of the index of
    recent messages, if any."""
    # Per message, on the worker: key indexes are kept as the strings sent (an int is
    # formatted again at every pack), and the slots go in with one extend per item.
    keys: list[str] = []
    index: dict[str, str] = {}
    plain: dict[str, str] = {}  # a record's '+<index>', the first slot of a plain success

    def ki(key: str) -> str:
        i = index.get(key)
        if i is None:
            keys.append(key)
            i = index[key] = str(len(keys))
        return i

    def plain_ki(key: str) -> str:
        i = plain.get(key)
        if i is None:
            i = plain[key] = "+" + ki(key)
        return i

    args: list[Any] = [ttl_ms, group, len(items)]
    extend = args.extend
    details: list[Any] = []  # (item number, error type, traceback) of failures
    # A run of plain successes with one fence and one inbox whose records are new keys in
    # a row: written as one '*k' item (4 + 2k slots) rather than k of 5 (see settle.lua).
    run: list[Any] = []  # the run's (stored, entry id) pairs
    run_fence: Any = None
    run_inbox = ""
    run_first = 0  # the key index of its first record

    def end_run() -> None:
        if len(run) == 2:  # one item: its own 5 slots are shorter
            extend((plain_ki(keys[run_first - 1]), run_fence, run[0], run_inbox, run[1]))
        elif run:
            extend((f"*{len(run) // 2}", run_fence, run_inbox, str(run_first), *run))
        run.clear()

    for n, it in enumerate(items, 1):
        c = it.completion
        f = it.follow_up
        if (c is not None and c.traceback) or f is not None:
            tb = _traceback_of(c, f)
            if tb:
                details += [n, tb[0], tb[1]]
        # The reply goes in only where it is published: a message nobody waits for
        # (a send) has one too, which the script would never read.
        rs = it.reply_stream
        if (
            c is not None
            and f is None
            and not rs
            and c.mode == Mode.DONE
            and c.status == Status.SUCCEEDED
            and not c.error
            and not c.traceback
        ):
            ib = it.inbox
            ib_i = ki(ib) if ib else _NO_RECORD  # before the record: the run's keys in a row
            key = c.key
            if key in index:  # a record named before: not in a row, so on its own
                end_run()
                extend((plain_ki(key), c.fence, c.stored, ib_i, it.entry_id))
                continue
            if run and (c.fence != run_fence or ib_i != run_inbox):
                end_run()
            i = int(ki(key))
            if not run:
                run_fence, run_inbox, run_first = c.fence, ib_i, i
            run.extend((c.stored, it.entry_id))
            continue
        end_run()
        reply = it.reply if rs else ""
        if c is not None:
            stored = c.stored if c.mode == Mode.DONE else ""
            extend((ki(c.key), c.fence, c.status, stored, c.mode, c.error, reply))
        else:
            extend((_NO_RECORD, "", "", "", "", "", reply))
        ib = it.inbox
        extend((ki(rs) if rs else _NO_RECORD, ki(ib) if ib else _NO_RECORD, it.entry_id))
        if f is None:
            args.append(_NO_FOLLOW_UP)
        elif isinstance(f, DeadLetter):
            extend((_DEAD_LETTER, ki(f.stream), f.maxlen, *f.values))
        else:
            extend((_RETRY, ki(f.zset), f.due_ms, f.envelope))
    end_run()
    if details or (recent is not None and recent.chunks):
        args += [len(details) // 3, *details]
    if recent is not None and recent.chunks:
        args += [ki(recent.stream), recent.maxlen, len(recent.chunks), *recent.chunks]
    return Call("settle", tuple(keys), tuple(args), _codes)


def _traceback_of(c: Completion | None, f: FollowUp | None) -> tuple[str, str] | None:
    """The (error type, traceback) an item carries, on its completion or its dead letter."""
    if c is not None and c.traceback:
        return c.error_type, c.traceback
    if isinstance(f, DeadLetter) and f.traceback:
        return f.error_type, f.traceback
    return None


Refused = Callable[[int, SettleLike, Exception], SettleItem | None]
"""``on_refused(index, item, refusal)``: what to settle instead of item ``index``, whose
completion (or settle) was refused for the data (e.g. its record is not a hash), or None
to only ack it. The replacement must carry no completion."""


async def settle(
    r: AnyRedis,
    items: Sequence[SettleLike],
    *,
    cluster: bool,
    ttl_ms: int,
    group: str = GROUP,
    on_refused: Refused | None = None,
    on_round_trip: Callable[[str], None] | None = None,
    recent: RecentRows | None = None,
) -> list[SettleCode | Exception]:
    """Settle ``items``: per item SETTLED (everything written, acked last), FENCED (its
    record was claimed by another owner since: nothing written, not acked), or an error:
    it was not settled (Cluster: its completion failed and the entry stays pending;
    standalone: it was refused even as ``on_refused``'s replacement, and only acked and
    deleted).

    Standalone Redis: one ``settle.lua`` call, atomic. When refused for the data, each item
    is settled alone, and one refused alone is replaced by ``on_refused``. Other errors
    raise (nothing written). Cluster: ``complete.lua`` per record (a refused one replaced
    by ``on_refused``), then one pipeline of the replies and follow-ups, then one of the
    acks of the items whose writes all succeeded: an item with a write refused (a full
    Redis) is not acked (its error in its place; it stays pending and is settled again).
    ``on_round_trip(script)`` is called before each round trip. ``recent``: the batch's
    rows of the index of recent messages, written with it (not when a refused batch is
    settled one by one).
    """
    if not items:
        return []
    trip = on_round_trip or (lambda _name: None)
    if cluster:
        return await _settle_pipelined(r, list(items), ttl_ms, group, on_refused, trip, recent)
    trip("settle")
    try:
        return list(await settle_call(items, ttl_ms=ttl_ms, group=group, recent=recent).run(r))
    except rexc.ResponseError as e:
        if not is_data_error(e):
            raise
        log.warning("settling a batch of %d failed (%s): settling one by one", len(items), e)
    return [
        await _settle_alone(r, i, it, ttl_ms, group, on_refused, trip) for i, it in enumerate(items)
    ]


async def _settle_alone(
    r: AnyRedis,
    i: int,
    item: SettleLike,
    ttl_ms: int,
    group: str,
    on_refused: Refused | None,
    trip: Callable[[str], None],
) -> SettleCode | Exception:
    """Standalone: settle one item; if refused, its replacement; if that is refused too
    (or there is none), ack and delete its entry: it can never be settled."""

    async def attempt(it: SettleLike) -> SettleCode | Exception:
        trip("settle")
        try:
            return (await settle_call([it], ttl_ms=ttl_ms, group=group).run(r))[0]
        except rexc.ResponseError as e:
            if not is_data_error(e):
                raise
            return e

    res = await attempt(item)
    if isinstance(res, Exception):
        replacement = on_refused(i, item, res) if on_refused else None
        if replacement is not None:
            res = await attempt(replacement)
    if isinstance(res, Exception):
        log.error(
            "entry %r of %s dropped: it cannot be settled (%s)", item.entry_id, item.inbox, res
        )
        if item.inbox:
            await run_pipeline(
                r, [("XACK", item.inbox, group, item.entry_id), ("XDEL", item.inbox, item.entry_id)]
            )
    return res


async def _settle_pipelined(
    r: AnyRedis,
    items: list[SettleLike],
    ttl_ms: int,
    group: str,
    on_refused: Refused | None,
    trip: Callable[[str], None],
    recent: RecentRows | None = None,
) -> list[SettleCode | Exception]:
    out: list[SettleCode | Exception | None] = [None] * len(items)
    completing = [(i, it, it.completion) for i, it in enumerate(items) if it.completion]
    ok = {i for i, it in enumerate(items) if it.completion is None}
    if completing:
        trip("complete")
        res = await complete(
            r, [(c, c.stored) for _, _, c in completing], cluster=True, ttl_ms=ttl_ms
        )
        for (i, it, _), x in zip(completing, res, strict=True):
            if is_data_error(x):  # its record is of the wrong type: what replaces it, and ack
                assert isinstance(x, Exception)
                rep = on_refused(i, it, x) if on_refused else None
                if rep is not None and rep.completion is not None:
                    raise ValueError("settle: a replacement item must carry no completion")
                items[i] = rep or SettleItem(inbox=it.inbox, entry_id=it.entry_id)
                ok.add(i)
            elif isinstance(x, Exception):
                out[i] = x
            elif x is SettleCode.SETTLED:
                ok.add(i)
            else:
                out[i] = SettleCode.FENCED
    done = [i for i in range(len(items)) if i in ok]
    ops: list[Op] = []
    spans: list[tuple[int, int, int]] = []  # item index, its writes in ops: [start, end)
    for i in done:
        it = items[i]
        start = len(ops)
        c = it.completion
        # Its completion was stored: the failure's detail goes with it. (An earlier
        # attempt's detail left on a record that then succeeded is not read:
        # reach.tasks.get_status shows a detail only with a failure's status.)
        if c is not None and c.traceback:
            ops.append(("HSET", c.key, "error_type", c.error_type, "traceback", c.traceback))
        if it.reply_stream:
            ops += [
                (
                    "XADD",
                    it.reply_stream,
                    "MAXLEN",
                    "~",
                    int(StreamBound.REPLIES),
                    "*",
                    "r",
                    it.reply,
                ),
                ("PEXPIRE", it.reply_stream, ttl_ms),
            ]
        if it.follow_up is not None:
            ops.append(it.follow_up.op())
        spans.append((i, start, len(ops)))
    if ops:
        # The writes first, each reply checked; an entry is acked and deleted only when
        # all its writes succeeded. One whose reply, dead letter or retry Redis refused
        # (a full Redis: OutOfMemoryError) stays pending and is settled again later.
        trip("settle")
        replies = await run_pipeline(r, ops)
        for i, start, end in spans:
            err = first_error(replies[start:end])
            if err is not None:
                out[i] = err
                ok.discard(i)
        failed = sum(isinstance(x, Exception) for x in replies)
        if failed:
            log.warning("%d settle commands failed, first: %s", failed, first_error(replies))
    acks: dict[str, list[Any]] = {}
    for i in done:
        it = items[i]
        if i in ok and it.inbox:
            acks.setdefault(it.inbox, []).append(it.entry_id)
    ack_ops: list[Op] = []
    for stream, ids in acks.items():  # acks last: after replies, dead letters, retries
        ack_ops += [("XACK", stream, group, *ids), ("XDEL", stream, *ids)]
    if recent is not None:  # the index of recent messages: a view, written last
        ack_ops += recent.ops()
    if ack_ops:
        trip("settle")
        errs = [x for x in await run_pipeline(r, ack_ops) if isinstance(x, Exception)]
        if errs:  # written, not acked: a later read finds the record settled
            log.warning("%d settle acks failed, first: %s", len(errs), errs[0])
    result: list[SettleCode | Exception] = []
    for i, got in enumerate(out):
        assert got is not None or i in ok
        result.append(SettleCode.SETTLED if got is None else got)
    return result

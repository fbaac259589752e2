"""The codes the Lua scripts answer with (and the few they take), written once.

Each script's codes are an :class:`~enum.IntEnum` here. The scripts do not write the numbers
either: ``--!include codes`` gives them ``lua/includes/codes.lua``, which is rendered from
these enums (:func:`render_lua`) when a script is loaded, ``ClaimCode.RUN`` as the Lua
local ``ClaimCode_RUN``. The file itself is kept in the tree for loaders in other
languages; a test checks it is the rendering of these enums.
"""

from __future__ import annotations

from enum import IntEnum
from pathlib import Path


class RegisterCode(IntEnum):
    """``register.lua``, the first item of its reply: NEW, REPLACED (a registration of the
    same agent_id, of the same or an older version, was replaced), both followed by the
    server time; or STALE (refused: a newer registration is stored), followed by its
    version."""

    NEW, REPLACED, STALE = 1, 2, -1


class HeartbeatCode(IntEnum):
    """``heartbeat.lua``, the first item of its reply (then the draining flag): RENEWED,
    RECOVERED (renewed, back from probation), NOT_REGISTERED (unknown, evicted, or a record
    it cannot read: register again), or STALE (a newer registration of this agent_id
    exists: this process must stop)."""

    RENEWED, RECOVERED, NOT_REGISTERED, STALE = 1, 2, 0, -1


class DeregisterCode(IntEnum):
    """``deregister.lua``: REMOVED, NOT_FOUND (a stray agents-zset entry is removed), or
    OTHER_INSTANCE (kept: another instance owns the registration)."""

    REMOVED, NOT_FOUND, OTHER_INSTANCE = 1, 0, -1


class MarkReadyCode(IntEnum):
    """``mark_ready.lua``: SET, NOT_REGISTERED (register again), or OTHER_INSTANCE (another
    instance owns the registration: nothing changed)."""

    SET, NOT_REGISTERED, OTHER_INSTANCE = 1, 0, -1


class DrainCode(IntEnum):
    """``drain.lua``: DRAINING (now), ALREADY_DRAINING, NOT_FOUND (no live agent of that
    id), or OTHER_INSTANCE (only when an instance is named: nothing changed)."""

    DRAINING, ALREADY_DRAINING, NOT_FOUND, OTHER_INSTANCE = 1, 2, 0, -1


class SweepCode(IntEnum):
    """``sweep.lua`` answers ``{LOCKED}`` when another runtime holds the sweeper lock, else
    the counts of what it did."""

    LOCKED = -1


class ClaimCode(IntEnum):
    """``claim.lua``, the first item of each key's answer: RUN (claimed: run the handler,
    then complete with the fence token, the second item), REPLAY (already done: reply with
    the stored bytes, the second item; do not run again), or BUSY (an unexpired claim of
    the owner in the second item holds the key: do not run this copy now), or CANCELLED
    (``cancel.lua`` cancelled the message before or while it ran: do not run it; settle it
    as cancelled), or POISONED (its runs were taken over ``max_takeovers`` times, each
    owner gone before it ended: not run again; dead-letter it)."""

    RUN, REPLAY, BUSY, CANCELLED, POISONED = 1, 2, 3, 4, 5


class SettleCode(IntEnum):
    """``complete.lua`` and ``settle.lua``, one per key (item): SETTLED, or FENCED (another
    owner claimed the key since: nothing was written for it)."""

    SETTLED, FENCED = 1, 0


class FollowUpKind(IntEnum):
    """An argument, not an answer: what ``settle.lua`` writes after an item's reply and
    before its ack: NONE, a DEAD_LETTER (11 slots follow) or a RETRY (a delayed copy: a
    retry, or a parked copy of a busy key; 3 slots follow)."""

    NONE, DEAD_LETTER, RETRY = 0, 1, 2


class DropInboxCode(IntEnum):
    """``drop_inbox.lua``: DROPPED (or nothing to drop), or KEPT (an inbox holds entries)."""

    DROPPED, KEPT = 1, 0


class StreamBound(IntEnum):
    """A length the scripts take, not an answer: REPLIES is the bound of a client's reply
    stream (``XADD ... MAXLEN ~``), so that replies nobody reads (a caller gone for good,
    or a flood written by someone else) cannot grow it without limit. A client deletes the
    replies it read, so only a caller with more than this many unread replies loses the
    oldest (their outcomes stay in the task records)."""

    REPLIES = 100_000


class CancelCode(IntEnum):
    """``cancel.lua``, the first item of its reply (then a status): CANCELLED (now; the
    status it had), ALREADY_CANCELLED, DONE (over before the cancel: succeeded, dead,
    expired...; the status it ended with), or UNKNOWN (no record: never sent, or expired)."""

    CANCELLED, ALREADY_CANCELLED, DONE, UNKNOWN = 1, 2, 0, -1


class RerouteCode(IntEnum):
    """``reroute.lua``, the first item of its reply: MOVED (then the new entry id), GONE
    (the entry is no longer in its inbox: settled, or moved already), READ (its agent read
    it: it may be running; left where it is), FULL (then the new inbox's depth: at its
    bound, nothing written), or SETTLED (the record is done, cancelled or running: left to
    its agent, which replays or settles it)."""

    MOVED, GONE, READ, FULL, SETTLED = 1, 0, 2, 3, 4


class StepCode(IntEnum):
    """``step.lua``, the first item of its reply: JOURNALED (the step's result is stored;
    then how many are), KEPT (a result of that name was stored already and stays; then its
    bytes), FULL (the journal holds its most results: nothing written), or FENCED (the run
    no longer holds the message's claim, or the key is done: nothing written)."""

    JOURNALED, KEPT, FULL, FENCED = 1, 2, 3, 0


class StepBound(IntEnum):
    """The bounds of a message's step journal (``ctx.step``, docs/concepts.md, *Durable
    steps*), taken by ``step.lua`` as by the runtime: RESULT_BYTES, the most bytes of one
    step's encoded result; STEPS, the most results journaled per idempotency key;
    NAME_BYTES, the longest step name (UTF-8)."""

    RESULT_BYTES, STEPS, NAME_BYTES = 65_536, 100, 200


class KeepCode(IntEnum):
    """``keep_chunks.lua``, the first item of its reply: KEPT (the entry holds chunks not
    kept before: added), KNOWN (every chunk of it is kept already, or it starts past them:
    nothing written), CLOSED (the record is done, or absent: nothing written)."""

    KEPT, KNOWN, CLOSED = 1, 0, -1


class ChunkBound(IntEnum):
    """``keep_chunks.lua``'s bound on one chunk entry's bytes (the most a Redis bulk string
    holds): the runtime's own entries are far smaller (256 chunks, 256 KiB past the first)."""

    ENTRY_BYTES = 512 * 1024 * 1024


class AskCode(IntEnum):
    """``ask.lua`` and ``withdraw_ask.lua``, the first item of their reply: ASKED (the
    question is put, the task waits for input; then 1 when this ask was never put before,
    0 when a re-run put it again), ANSWERED (the ask has its answer; then its bytes),
    WITHDRAWN (``withdraw_ask.lua``: no answer came, the question is taken back), FULL
    (the message has put its most questions: nothing written), or FENCED (the run no longer
    holds the message's claim, or the key is done or cancelled: nothing written)."""

    ASKED, ANSWERED, WITHDRAWN, FULL, FENCED = 1, 2, 3, 4, 0


class AnswerCode(IntEnum):
    """``answer.lua``, the first item of its reply: ANSWERED (stored; then the number of
    the ask it answers), ALREADY (that ask has its answer already: the first one stays;
    then its number), NOT_WAITING (the task waits for no answer; then its status), or
    UNKNOWN (no record: never sent, or expired)."""

    ANSWERED, ALREADY, NOT_WAITING, UNKNOWN = 1, 2, 0, -1


class AskBound(IntEnum):
    """The bounds of human input (``ctx.ask``, docs/concepts.md, *Human input*), taken by
    the scripts as by the runtime: QUESTION_BYTES, the longest question (UTF-8);
    ANSWER_BYTES, the most bytes of one answer (JSON); ASKS, the most questions per
    idempotency key."""

    QUESTION_BYTES, ANSWER_BYTES, ASKS = 4096, 65_536, 100


CODES: tuple[type[IntEnum], ...] = (
    RegisterCode,
    HeartbeatCode,
    DeregisterCode,
    MarkReadyCode,
    DrainCode,
    SweepCode,
    ClaimCode,
    SettleCode,
    FollowUpKind,
    DropInboxCode,
    StreamBound,
    CancelCode,
    RerouteCode,
    StepCode,
    StepBound,
    KeepCode,
    ChunkBound,
    AskCode,
    AnswerCode,
    AskBound,
)

REGENERATE = ".venv/bin/python -c 'from reach.scripts import codes; codes.write_lua()'"


def render_lua() -> str:
    """The text of ``lua/includes/codes.lua``: each member of each enum of :data:`CODES` as a
    Lua local, ``ClaimCode.RUN`` as ``ClaimCode_RUN`` (plain locals: a script's body runs on
    every call, and a table per enum would be built again each time)."""
    lines = [
        "-- codes.lua: the codes the scripts answer with or take (ClaimCode_RUN is ClaimCode.RUN).",
        "-- GENERATED from the IntEnums of reach/scripts/codes.py, where they are written once:",
        "-- do not edit (tests/lua/test_includes.py checks this file). Regenerate with",
        f"--   {REGENERATE}",
    ]
    for enum in CODES:
        names = ", ".join(f"{enum.__name__}_{m.name}" for m in enum)
        lines.append(f"local {names} = {', '.join(str(int(m)) for m in enum)}")
    return "\n".join(lines) + "\n"


def write_lua(path: Path | None = None) -> Path:
    """Write :func:`render_lua` to ``lua/includes/codes.lua`` (of the source tree)."""
    target = path or Path(__file__).resolve().parents[2] / "lua" / "includes" / "codes.lua"
    target.write_text(render_lua(), encoding="utf-8")
    return target

"""One outcome vocabulary: task statuses, dead-letter reasons, routing refusals, and what
each one means for a caller, a circuit breaker and an A2A client; and the words the
watchers use for them (:class:`Settled`: how an inbox entry was settled, for hooks and
metrics; :class:`HandlerResult` and :class:`RequestOutcome`: metric labels).

The values are the strings reach has always written (task records, replies, dead-letter
entries, ``NoAgentAvailable.reason``); each enum is a :class:`~enum.StrEnum`, so a member *is*
its string: it compares equal to it, hashes alike and encodes to the same bytes (msgpack,
JSON), and agents in other languages and records already stored keep working. A value read
back from Redis is a plain ``str``; every predicate here takes one, and a string that is no
member gets the conservative answer (not a rejection, not retryable, blames the agent).

Dead-letter reasons (docs/operations.md lists them for operators; a reply carries all but
the three raw ones)

===================  =========  =========  ======  =======  ====================================
reason               rejection  retryable  blames  refusal  written when
===================  =========  =========  ======  =======  ====================================
``rejected``         yes        no         no      yes      the handler raised ``reach.Reject``
``invalid_payload``  yes        no         no      yes      the payload does not fit the handler
``no_handler``       yes        no         no      yes      the agent has no handler for it
``malformed``        yes        no         no      yes      raw: bytes that are no envelope
``version``          yes        no         no      yes      raw: an unknown envelope version
``too_large``        yes        no         no      yes      raw: over ``max_envelope_bytes``
``unauthenticated``  yes        no         no      yes      unsigned or forged, signing required
``forbidden``        yes        no         no      yes      its verified signer may not call it
``bad_result``       yes        no         yes     no       the result cannot be encoded
``target_gone``      yes        no         yes     no       a broadcast copy's agent was evicted
``unroutable``       yes        no         no      no       no policy can place a moved message
``unprocessable``    yes        no         no      no       handling failed on data next to it
``poisoned``         yes        no         yes     no       its runs never ended: taken over too often
``hop_limit``        yes        no         no      yes      a handler's call deeper than ``max_hops``
``loop``             yes        no         no      yes      a handler's call entering a waiting caller
``refused_by_guard`` yes        no         no      yes      a guard refused its content (reach.guards)
``max_attempts``     no         yes        yes     no       the handler failed every attempt
``timeout``          no         yes        yes     no       the handler ran past the deadline
``expired``          no         no         no      no       no time left to run it (again)
``cancelled``        no         no         no      no       ``client.cancel``: never run, or stopped
===================  =========  =========  ======  =======  ====================================

* **rejection** (:func:`is_rejection`): the message was refused for good; a ``dead`` reply with
  this reason raises :class:`reach.Rejected` in the caller. Sending the same message again
  would meet the same end (docs/protocol.md, *Reply*; docs/concepts.md; docs/reliability.md).
* **retryable** (:func:`is_retryable`): the handler failed; the caller gets
  :class:`reach.RemoteError` with ``retryable=True`` (a later send may succeed). A ``dead``
  reply with any other reason that is not a rejection gives ``retryable=False``.
* **blames** (:func:`blames_agent`): the outcome says something about the agent's health, so
  it counts as a failure in the caller's circuit breaker (docs/routing.md: "a handler error,
  a timeout, not a rejected payload").
* **refusal** (:func:`is_refusal`): the agent refused the message for what it is, before any
  handler produced a result: the A2A task state is ``rejected`` rather than ``failed``
  (docs/a2a.md: "the agent refused the task and will not do it" vs "it tried and failed").

Rejection and refusal are two questions, not one list written twice. Until this module,
``reach.client.REJECTIONS`` answered the first and ``reach.card.REJECTED_REASONS`` the
second, both called "rejected", and they disagreed on ``bad_result``, ``target_gone``,
``unroutable`` and ``unprocessable``. The docs decide each one: the Python caller gets
``Rejected`` for all four (docs/concepts.md names ``bad_result``, docs/reliability.md
``unprocessable`` and ``unroutable``, docs/protocol.md every ``dead`` but ``max_attempts`` and
``timeout``), while A2A says ``failed``: the handler ran (``bad_result``, "it tried and
failed" in docs/a2a.md), the agent vanished (``target_gone``), or reach gave up on delivering
or handling it (``unroutable``, ``unprocessable``) -- no agent decided not to do the task.
So both lists were right for their own question; they now live side by side here, each
named for what it answers.

The raw reasons (``malformed``, ``version``, ``too_large``) are filed under the ``_malformed``
stream with the bytes found and no reply (there is no readable caller to answer): the
columns above only matter for a reply written by another implementation.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import msgspec

__all__ = [
    "BLAMELESS",
    "COMPLETION_STATUSES",
    "DEAD_LETTERED",
    "FINAL_STATUSES",
    "RAW_REASONS",
    "REFUSALS",
    "REJECTIONS",
    "RETRYABLE",
    "STORED_STATUSES",
    "DeadReason",
    "HandlerResult",
    "RequestOutcome",
    "Settled",
    "Status",
    "Unavailable",
    "blames_agent",
    "is_refusal",
    "is_rejection",
    "is_retryable",
]


class Status(StrEnum):
    """The task status of a message, kept in its idempotency record (docs/protocol.md,
    *Task status*)."""

    SCHEDULED = "scheduled"
    """Kept in the scheduled set until its due time (``Client.send(at=...)``), then sent
    and ``pending`` (``mark_scheduled.lua``)."""
    PENDING = "pending"
    """Sent: in an inbox, no handler has it yet (``send.lua``, the client's pipeline)."""
    RUNNING = "running"
    """Claimed by a worker; the handler runs (``claim.lua``)."""
    INPUT_REQUIRED = "input_required"
    """Its handler asked a question (``ctx.ask``, ``ask.lua``) and waits for the answer
    (``client.answer``, ``answer.lua``), which sets it ``running`` again."""
    RETRYING = "retrying"
    """An attempt failed; a retry waits in the delayed set."""
    SUCCEEDED = "succeeded"
    """The handler's result is stored and replied."""
    FAILED = "failed"
    """Reserved: the scripts accept it, the current runtime does not write it (a final
    failure is ``dead``, reason ``max_attempts``)."""
    EXPIRED = "expired"
    """The deadline passed, before or while it ran."""
    DEAD = "dead"
    """Dead-lettered; the :class:`DeadReason` says why."""
    CANCELLED = "cancelled"
    """Cancelled (``cancel.lua``): never run if it had not started, else its handler was
    told and stopped; dead-lettered (reason ``cancelled``) once a worker reaches it."""
    UNKNOWN = "unknown"
    """Never stored: what a read returns when no record exists (never sent, or expired)."""


STORED_STATUSES: Final[tuple[Status, ...]] = (
    Status.SCHEDULED,
    Status.PENDING,
    Status.RUNNING,
    Status.INPUT_REQUIRED,
    Status.SUCCEEDED,
    Status.FAILED,
    Status.RETRYING,
    Status.EXPIRED,
    Status.DEAD,
    Status.CANCELLED,
)
"""Every status a record may hold (all but ``unknown``)."""

COMPLETION_STATUSES: Final = frozenset(
    {Status.SUCCEEDED, Status.FAILED, Status.RETRYING, Status.EXPIRED, Status.DEAD}
)
"""The statuses ``complete.lua`` and ``settle.lua`` accept for a completion."""

FINAL_STATUSES: Final = frozenset({Status.SUCCEEDED, Status.EXPIRED, Status.DEAD})
"""The statuses a reply carries: the message is over."""


class DeadReason(StrEnum):
    """Why a message was dead-lettered (or expired): the ``reason`` of a dead-letter entry
    and of a reply. See the module docstring for what each one means."""

    MAX_ATTEMPTS = "max_attempts"
    REJECTED = "rejected"
    INVALID_PAYLOAD = "invalid_payload"
    NO_HANDLER = "no_handler"
    BAD_RESULT = "bad_result"
    EXPIRED = "expired"
    TIMEOUT = "timeout"
    TARGET_GONE = "target_gone"
    MALFORMED = "malformed"
    VERSION = "version"
    TOO_LARGE = "too_large"
    UNROUTABLE = "unroutable"
    UNPROCESSABLE = "unprocessable"
    UNAUTHENTICATED = "unauthenticated"
    CANCELLED = "cancelled"
    POISONED = "poisoned"
    HOP_LIMIT = "hop_limit"
    LOOP = "loop"
    REFUSED_BY_GUARD = "refused_by_guard"
    FORBIDDEN = "forbidden"


RAW_REASONS: Final = frozenset({DeadReason.MALFORMED, DeadReason.VERSION, DeadReason.TOO_LARGE})
"""Bytes that are no usable envelope: filed under ``_malformed``, answered by no reply."""

RETRYABLE: Final = frozenset({DeadReason.MAX_ATTEMPTS, DeadReason.TIMEOUT})
"""The handler failed: a later send may succeed (``RemoteError.retryable``)."""

REJECTIONS: Final = frozenset(DeadReason) - RETRYABLE - {DeadReason.EXPIRED, DeadReason.CANCELLED}
"""Refused for good: the caller gets ``reach.Rejected`` (a cancelled one gets
``reach.Cancelled``)."""

REFUSALS: Final = RAW_REASONS | {
    DeadReason.REJECTED,
    DeadReason.INVALID_PAYLOAD,
    DeadReason.NO_HANDLER,
    DeadReason.UNAUTHENTICATED,
    DeadReason.HOP_LIMIT,
    DeadReason.LOOP,
    DeadReason.REFUSED_BY_GUARD,
    DeadReason.FORBIDDEN,
}
"""The agent refused the message for what it is: A2A ``rejected`` (else ``failed``)."""

BLAMELESS: Final = REFUSALS | {
    DeadReason.EXPIRED,
    DeadReason.CANCELLED,
    DeadReason.UNROUTABLE,
    DeadReason.UNPROCESSABLE,
}
"""Outcomes that say nothing about the agent's health: the message itself (or data next to
it in Redis, or the clock) was the problem; a circuit breaker counts them as successes."""


def is_rejection(reason: str) -> bool:
    """True when a ``dead`` message with ``reason`` was refused for good (the caller gets
    :class:`reach.Rejected`): sending it again as it is would meet the same end."""
    return reason in REJECTIONS


def is_retryable(reason: str) -> bool:
    """True when ``reason`` says the handler failed (every attempt, or past its deadline),
    so a later send may succeed: the caller's ``RemoteError.retryable``."""
    return reason in RETRYABLE


def is_refusal(reason: str) -> bool:
    """True when the agent refused the message for what it is, before any handler produced
    a result (A2A task state ``rejected``; else ``failed``)."""
    return reason in REFUSALS


def blames_agent(reason: str) -> bool:
    """True when a final outcome with ``reason`` counts against the agent's health (its
    circuit breaker records a failure). A reason reach does not know blames the agent."""
    return reason not in BLAMELESS


class Unavailable(StrEnum):
    """Why no agent could take a message: ``NoAgentAvailable.reason`` (docs/routing.md)."""

    NO_AGENT = "no_agent"
    """No live agent declares the capability."""
    FILTER = "filter"
    """None of them matches the call's ``where`` filter."""
    DRAINING = "draining"
    """All of them are draining (shutting down)."""
    NOT_READY = "not_ready"
    """None of them is ready yet: retry shortly."""
    BREAKER_OPEN = "breaker_open"
    """This client's circuit breaker is open for all of them."""
    OVERLOADED = "overloaded"
    """All of them are at their queue bound (``reach.Overloaded``): back off."""
    TARGET_UNAVAILABLE = "target_unavailable"
    """The ``direct`` target cannot take it (the message says why)."""
    WOULD_DEADLOCK = "would_deadlock"
    """A handler's call to its own agent, which has no free slot, and no other agent
    (``reach.WouldDeadlock``)."""
    VERSION = "version"
    """The capability is split between versions (``reach caps split``) and no agent runs a
    version with a share above 0."""


class Settled(StrEnum):
    """How an inbox entry was settled (written to Redis and acked): the ``outcome`` of
    :meth:`reach.Hooks.after_settle` and the label of ``reach_messages_acked_total``.

    The first four are the message's :class:`Status` (equal to those members); the others
    say why an entry was acked without a handler's outcome."""

    SUCCEEDED = Status.SUCCEEDED.value
    RETRYING = Status.RETRYING.value
    DEAD = Status.DEAD.value
    EXPIRED = Status.EXPIRED.value
    REPLAYED = "replayed"
    """Its idempotency key was already done: the stored reply was sent again."""
    PARKED = "parked"
    """A copy of a message another worker runs: it waits for that one's result."""
    MALFORMED = DeadReason.MALFORMED.value
    """Bytes that are no envelope: filed under ``_malformed`` (the reason says why)."""
    GONE = "gone"
    """The entry was deleted meanwhile (nothing to handle)."""
    ACKED = "acked"
    """The fallback label of an entry settled with no outcome recorded."""


DEAD_LETTERED: Final = frozenset({Settled.DEAD, Settled.EXPIRED, Settled.MALFORMED})
"""Settle outcomes that filed a dead letter (counted in ``reach_messages_dead_lettered``)."""


class HandlerResult(StrEnum):
    """How a handler run ended, as a metric sees it: the ``outcome`` label of
    ``reach_handler_duration_seconds`` (:func:`reach.metrics.handler_outcome`)."""

    SUCCEEDED = Status.SUCCEEDED.value
    """It returned (a result that could not be encoded included: not the handler's error)."""
    TIMEOUT = DeadReason.TIMEOUT.value
    """It ran past the message's deadline."""
    REJECTED = DeadReason.REJECTED.value
    """It raised ``reach.Reject``, or a guard refused its content (``refused_by_guard``)."""
    CANCELLED = DeadReason.CANCELLED.value
    """Its message was cancelled while it ran (``client.cancel``), whatever it did then."""
    ERROR = "error"
    """It raised anything else."""


class RequestOutcome(StrEnum):
    """How a client's ``request()`` ended, as the caller saw it: the ``outcome`` label of
    ``reach_client_requests_total`` and ``reach_client_request_duration_seconds``
    (:func:`reach.metrics.client_outcome` names the one of an exception)."""

    SUCCEEDED = Status.SUCCEEDED.value
    REMOTE_ERROR = "remote_error"
    """``reach.RemoteError``: the handler raised."""
    REJECTED = DeadReason.REJECTED.value
    """``reach.Rejected``: refused for good (any rejection reason, too large included)."""
    NO_AGENT = Unavailable.NO_AGENT.value
    """``reach.NoAgentAvailable`` (``Overloaded`` included), whatever its reason."""
    DEADLINE = "deadline"
    """``reach.DeadlineExceeded`` (or another ``TimeoutError``)."""
    CANCELLED = "cancelled"
    """The caller's task was cancelled while it waited."""
    ERROR = "error"
    """Any other exception."""


class Outcome(msgspec.Struct, frozen=True):
    """How one handling of a message ended, as the worker decided it (reach._worker.outcome)
    and the hooks see it: ``status`` is SUCCEEDED, RETRYING, DEAD or EXPIRED; ``reason`` the
    dead-letter reason of DEAD and EXPIRED. (A msgspec Struct: one is built per message,
    ~0.1 µs against a frozen dataclass's ~1 µs.)"""

    status: Status  # SUCCEEDED, RETRYING, DEAD, EXPIRED
    reason: DeadReason | str = ""  # the dead-letter reason ('' when nothing is dead-lettered)
    error: str = ""  # what went wrong, for the caller and the dead letter
    error_type: str = ""  # the exception's type name (or DeadlineExceeded, Reject...)
    result: msgspec.Raw | None = None  # the encoded result, when succeeded
    retry_delay_ms: int = 0  # retrying: how long the message waits before its next attempt
    exc: BaseException | None = None
    """The exception the handler raised (None: it returned, or reach decided the outcome):
    its traceback is stored with the outcome (reach._worker.outcome.apply)."""

    @property
    def dead_letter(self) -> bool:
        """True when the message is dead-lettered (dead or expired)."""
        return self.status in (Status.DEAD, Status.EXPIRED)

"""The error tree: everything reach raises on purpose is a :class:`ReachError`.

Each message says what happened and what to do about it.
"""

from __future__ import annotations

from typing import Any

from .outcomes import DeadReason, Unavailable


class ReachError(Exception):
    """Base class of every error reach raises on purpose."""


class ConfigError(ReachError, ValueError):
    """An option or argument is invalid (bad capability name, bad URL, bad setting)."""


class InvalidCapability(ConfigError):
    """A capability name does not match ``^[a-z0-9_]+(\\.[a-z0-9_]+)*$``."""


class RedisUnavailable(ReachError, ConnectionError):
    """Redis could not be reached, or no Redis server binary could be found or started."""


class ConnectionsExhausted(RedisUnavailable):
    """Every connection of this process's pool stayed busy for ``POOL_WAIT_S`` seconds.

    Redis itself may be fine: the commands holding the connections are slow (a stalled or
    overloaded server, huge replies) or the bound is too small for the blocking reads this
    process keeps open. A subclass of :class:`RedisUnavailable`, so code that retries on
    an unavailable Redis retries on this too.
    """


class RedisFull(ReachError):
    """Redis refused a write because it is out of memory: its used memory is over its
    ``maxmemory`` setting and its ``maxmemory-policy`` is ``noeviction`` (the policy reach
    needs: an evicting policy would delete messages). Nothing was sent. Messages Redis
    holds already are not lost: they wait there and go on once it has room.

    Free memory (``reach dlq purge`` old dead letters, delete keys you do not need), raise
    ``maxmemory`` (``CONFIG SET maxmemory ...`` and the server's config file) or give Redis
    more memory, then send again. Not a :class:`RedisUnavailable`: Redis answers, and a
    client's outage buffer does not hold new messages for it."""


class NotStarted(ReachError, RuntimeError):
    """A :class:`Client` was used before ``async with`` started it (or after it closed):
    use it inside ``async with reach.Client(...) as client:``. Still a RuntimeError, as it
    was before it had a class of its own."""


class StaleRegistration(ReachError):
    """A registration carries a version older than the one stored for that agent.

    Another, newer process registered under the same ``agent_id``; this one must stop.
    """


class UnknownAgent(ReachError, LookupError):
    """No agent with that id is registered in the namespace."""


class NoAgentAvailable(ReachError):
    """No live agent can take the message; ``reason`` says why."""

    def __init__(self, message: str, *, capability: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.capability = capability
        self.reason = reason


class Overloaded(NoAgentAvailable):
    """The message was not sent because a bound is reached: every eligible agent's inbox
    is at its ``max_queue``, or a quota of the namespace (docs/security.md, *Quotas*)
    refused it. Back off and try again. ``limit`` names the bound: ``"max_queue"`` (the
    agents' own), ``"max_inbox"`` or ``"send_rate"`` (the namespace's quotas);
    ``retry_after_s`` is when the send rate lets this caller send again (0 when unknown)."""

    def __init__(
        self,
        message: str,
        *,
        capability: str = "",
        reason: str = "",
        limit: str = "max_queue",
        retry_after_s: float = 0.0,
    ) -> None:
        super().__init__(message, capability=capability, reason=reason)
        self.limit = limit
        self.retry_after_s = retry_after_s


class RateLimited(ReachError):
    """The capability is over its rate limit right now, and the call asked not to wait
    (``on_rate_limit="raise"``): nothing was sent. ``retry_after_s`` says when a start
    will be allowed again; wait that long, or call with the default ``"wait"``."""

    def __init__(self, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ReachError, TimeoutError):
    """The message's deadline passed before a result arrived."""


class RemoteError(ReachError):
    """The handler raised; ``type`` and ``message`` describe the remote exception."""

    def __init__(self, message: str, *, type: str = "", retryable: bool = False) -> None:
        super().__init__(f"{type}: {message}" if type else message)
        self.type = type
        self.message = message
        self.retryable = retryable


class QuorumFailed(ReachError):
    """:meth:`reach.Client.gather` could not get its quorum of answers: too many copies
    failed (or too few agents were eligible) for the quorum to be met. ``gathered`` (a
    :class:`reach.Gathered`) holds the answers and failures there were."""

    def __init__(self, message: str, *, gathered: Any) -> None:
        super().__init__(message)
        self.gathered = gathered


class StreamTooLarge(ReachError):
    """A streamed call's chunks passed the bytes its caller set for it (the A2A gateway's
    ``--max-task-bytes``): nothing more was kept, and the call ended."""


class ChunksNotKept(ReachError, LookupError):
    """:meth:`reach.Client.resume` asked for chunks that are no longer kept: a stream keeps
    its newest chunks only (the worker's ``stream_keep_chunks`` and ``stream_keep_bytes``),
    for ``stream_keep_s`` after the latest; or there is no such message (never sent, or
    its record expired). ``first`` is the oldest chunk still kept (0: not known);
    ``after`` the chunk the resume had."""

    def __init__(self, message: str, *, msg_id: str, after: int, first: int = 0) -> None:
        super().__init__(message)
        self.msg_id = msg_id
        self.after = after
        self.first = first


class Cancelled(ReachError):
    """The message was cancelled (``client.cancel``, ``reach cancel``, or its caller gave
    up): it never ran, or its handler was told (``ctx.cancelled``) and stopped. Its dead
    letter (reason ``cancelled``) holds it; send it again to have it run."""


class Rejected(ReachError):
    """The message was refused without retry (bad payload, ``reach.Reject``, too large...)."""

    def __init__(self, message: str, *, reason: str = "rejected") -> None:
        super().__init__(message)
        self.reason = reason


class PayloadTooLarge(Rejected, ConfigError):
    """The encoded payload is over the namespace's size limit."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="too_large")


# -- call graphs (reach.callpath: calls made by handlers through ctx.client) ----------------
class Forbidden(Rejected):
    """The capability's agent does not let this caller call it (docs/security.md, *Who
    may call what*): the caller's verified identity is not in its allow list, an operator
    denied it (``reach caps deny``), or the message is unsigned and the capability takes
    only signed callers. Raised before sending when the registry already says so (nothing
    was sent), else from the agent's reply (the message is dead-lettered ``forbidden``
    without running). Call as an identity it allows, or ask its owner to allow yours."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason=DeadReason.FORBIDDEN)


class HopLimitExceeded(Rejected):
    """A handler's call would go deeper than ``max_hops`` calls below the first message
    (the Client's, the Agent's or the capability's limit, 16 by default): nothing was sent,
    or, found by the agent that received it, it was dead-lettered (reason ``hop_limit``)
    without running. A chain this deep is usually agents handing work back and forth: look
    at ``path`` (the calls it descends from) and break the chain, or raise ``max_hops``
    where a chain is meant to be this deep."""

    def __init__(self, message: str, *, hops: int = 0, max_hops: int = 0, path: str = "") -> None:
        super().__init__(message, reason=DeadReason.HOP_LIMIT)
        self.hops = hops
        self.max_hops = max_hops
        self.path = path


class LoopDetected(Rejected):
    """A handler's call would enter a capability on an agent that is already waiting, on
    the same call path, for this very call to finish: A -> B -> A. It could only wait until
    its deadline, so it was refused at once (nothing ran; found by the agent that received
    it, dead-lettered with reason ``loop``). ``path`` names the cycle. Route the inner call
    elsewhere (another capability, or another agent of it), or have the outer handler
    ``send()`` instead of waiting for the result."""

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message, reason=DeadReason.LOOP)
        self.path = path


class GuardRefused(Rejected):
    """A guard refused the message's content (docs/security.md, *Guards*): its input
    before the handler ran, its output before the reply, a streamed chunk, or a call its
    handler made through ``ctx.client`` to a capability outside the handler's allow-list
    (raised in the handler, before anything is sent). Dead-lettered ``refused_by_guard``
    at once, not retried: sending the same content again meets the same guard. ``rule``
    names the rule that refused it (also in the message and the dead letter). Change the
    content, or ask the agent's operator about the rule."""

    def __init__(self, message: str, *, rule: str = "") -> None:
        super().__init__(message, reason=DeadReason.REFUSED_BY_GUARD)
        self.rule = rule


class WouldDeadlock(NoAgentAvailable):
    """A handler called a capability of its own agent while none of that agent's handler
    slots is free, and no other agent of the capability could take the call: the call
    would wait for a slot its own caller holds. Nothing was sent. Start another agent of
    the capability, raise the agent's ``concurrency``, or do the work in the handler
    itself instead of calling through ``ctx.client``."""

    def __init__(self, message: str, *, capability: str = "") -> None:
        super().__init__(message, capability=capability, reason=Unavailable.WOULD_DEADLOCK)


# -- operator operations (reach.admin) -----------------------------------------------------
class BadDeadLetterId(ConfigError):
    """The text given as a dead letter id is not a stream entry id (``1717171717171-0``);
    ``reach dlq list`` shows the ids (:mod:`reach.admin`)."""


class AmbiguousDeadLetterId(ConfigError):
    """The id is in the dead letters of several capabilities (ids are per stream: letters
    written in the same millisecond share one): name the capability
    (``capability=...``, ``reach dlq show/replay ID --cap CAP``) (:mod:`reach.admin`)."""


class DeadLetterNotFound(ReachError, LookupError):
    """No dead letter has that id (in the capability asked for, or in any): it was replayed
    or purged meanwhile, or the id is from another namespace (:mod:`reach.admin`)."""


# -- raised by handlers, not by reach ---------------------------------------------------------
class Reject(Exception):
    """Raise inside a handler to refuse a message for good: no retry, dead letter at once."""


MAX_RETRY_DELAY_S = 7 * 86_400.0


class Retry(Exception):
    """Raise inside a handler to ask for another attempt, after ``delay_s`` seconds::

        raise reach.Retry("rate limited upstream", delay_s=2.5)

    Without ``delay_s`` the usual backoff applies (as for any other exception). It counts
    as an attempt: raised on the message's last attempt, the message is dead-lettered
    ``max_attempts``; a retry that would come after the message's deadline expires it
    instead. The message is delayed, not held: the handler's slot is free meanwhile.
    """

    def __init__(self, message: str = "", *, delay_s: float | None = None) -> None:
        if delay_s is not None and not (0 <= delay_s <= MAX_RETRY_DELAY_S):  # refuses nan
            raise ConfigError(
                f"Retry delay_s must be between 0 and {MAX_RETRY_DELAY_S:g} (a week), "
                f"got {delay_s}."
            )
        super().__init__(message or "the handler asked for a retry")
        self.delay_s = delay_s


# -- durable steps (ctx.step, reach.steps) ----------------------------------------------------
class StepRefused(ReachError, Reject):
    """``ctx.step`` could not journal a step's result, and no later run could either: its
    result cannot be encoded (use JSON-like values or msgspec Structs, as for a handler's
    result), or a subclass's bound is passed. Also a :class:`Reject`: raised out of the
    handler, the message is dead-lettered at once (reason ``rejected``, no retry: each
    retry would run the step's function again, outside effect included, and be refused
    again). The function did run this time: its effect, if it has one, happened."""


class StepTooLarge(StepRefused):
    """A step's result, encoded, is over the journal's bound for one result (64 KiB,
    ``reach.steps.RESULT_MAX_BYTES``). Journal a reference to the data (a key, a URL, an
    id the outside service gave) instead of the data itself."""


class TooManySteps(StepRefused):
    """The message already has the most results its journal keeps (100,
    ``reach.steps.MAX_STEPS``, counted per idempotency key across its runs): the step's
    function was not called. Group small steps into one (a step may return a list), or
    split the work over several messages."""


class StaleRun(ReachError):
    """This run of the message no longer holds its claim, so ``ctx.step`` could not
    journal the step's result: another run took the message over (this worker was paused
    or cut off from Redis past the claim's lease), or the message was cancelled or is
    done. The step's function did run; the other run will not find its result and runs it
    again, which is why a step with an outside effect should also pass an idempotency key
    to the outside service (``ctx.step_key(name)``). Stop: this run's outcome is not
    recorded, the other run's is."""


# -- human input (ctx.ask, client.answer, reach.asking) ---------------------------------------
class AskTimeout(ReachError):
    """No answer came to a handler's question (``ctx.ask``) within its ``timeout_s``: the
    question was taken back and the task is ``running`` again (a late ``client.answer``
    gets :class:`NotWaitingForInput`). Catch it to go on without the answer (a default, a
    reminder, another channel). Raised out of the handler it is a failure like any other:
    retried per ``max_attempts`` (the retry asks again), then dead-lettered."""


class TooManyAsks(ReachError, Reject):
    """The message has already put the most questions one idempotency key may (100,
    ``reach.asking.MAX_ASKS``, counted across its runs): this one was not put. Ask for
    several things in one question, or split the work over several messages. Also a
    :class:`Reject`: raised out of the handler, the message is dead-lettered at once."""


class AnswerRefused(ReachError):
    """``client.answer`` (``reach task answer``, the console, the A2A gateway) could not
    answer the task: a subclass says why. Nothing was stored."""


class UnknownTask(AnswerRefused, LookupError):
    """No task of that msg_id: never sent, or its record expired (a day after it
    finished). Check the msg_id (``reach tasks`` lists recent ones)."""


class NotWaitingForInput(AnswerRefused):
    """The task waits for no answer: its handler asked nothing, or its question was taken
    back (its ``timeout_s`` passed), or it finished. ``status`` is the task's status;
    ``reach task MSG_ID`` shows what it is doing."""

    def __init__(self, message: str, *, status: str = "") -> None:
        super().__init__(message)
        self.status = status


class AlreadyAnswered(AnswerRefused):
    """The question was answered already (by another person, process or retry of this
    call): the first answer stands and was not replaced. ``n`` is the number of the ask
    (the handler's first ask is 1)."""

    def __init__(self, message: str, *, n: int = 0) -> None:
        super().__init__(message)
        self.n = n


class UnknownTenant(ConfigError, LookupError):
    """A tenant id the tenant map does not name, and the map has no default for the rest
    (``[tenants.default]`` in reach.toml). ``tenant`` is the id asked for, ``known`` the
    ids the map names: add the tenant to the map, or give the map a default
    (docs/operations.md, *Tenants on their own Redis*)."""

    def __init__(self, message: str, *, tenant: str = "", known: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.tenant = tenant
        self.known = known

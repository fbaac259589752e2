"""How one handling of a message ends, decided without Redis.

Pure functions: from the envelope, what the handler did (returned, raised, ran out of
time) and the time now, they decide the :class:`Outcome`; :func:`apply` turns it into
what settlement writes. Nothing here does I/O (tests/unit/test_outcome.py checks every
branch with plain values).

``Outcome.status``:

* ``succeeded`` - the handler returned a value that could be encoded;
* ``retrying`` - it raised and an attempt and time remain: the message waits in the
  delayed set for a backoff (or the ``delay_s`` of a ``reach.Retry``), then goes to an
  inbox again (another agent preferred);
* ``dead`` - dead-lettered: ``rejected`` (``reach.Reject``), ``max_attempts`` (it raised
  on its last attempt), ``invalid_payload``, ``no_handler``, ``bad_result`` (a result
  that cannot be encoded), ``poisoned`` (its runs never ended, taken over too often);
* ``expired`` - dead-lettered because of the deadline: ``expired`` (passed before the
  start, or no time left for a retry) or ``timeout`` (the handler ran past it).
"""

from __future__ import annotations

import dataclasses
import traceback as tb_module
from collections.abc import Callable
from typing import Any

import msgspec

from ..envelope import Envelope, Reply, encode, encode_payload, encode_stored
from ..errors import ConfigError, HopLimitExceeded, LoopDetected, Reject, Rejected, Retry
from ..keys import Keys
from ..outcomes import DeadReason, Outcome, Settled, Status
from ..scripts.delivery import Completion, DeadLetter, Delayed, Mode
from ..signing import sign_reply_as
from ..tasks import dead_letter_op
from .guarding import refused_here
from .items import Delivery

_SETTLED: dict[str, Settled] = {s.value: s for s in Settled}
"""``Settled(status)`` as a look-up (an enum's call costs more, once per message)."""

NIL = msgspec.Raw(b"\xc0")  # msgpack nil: the result of an outcome without one

TRACEBACK_MAX_BYTES = 8192
"""The default bound of a stored traceback (``RuntimeOptions.traceback_max_bytes``)."""


def format_traceback(
    exc: BaseException, *, max_bytes: int, redact: Callable[[str], str] | None = None
) -> str:
    """The traceback of ``exc`` as stored with its outcome: passed through ``redact`` (which
    returns the text to keep), then cut to its last ``max_bytes`` bytes of UTF-8, so the
    frames nearest the error and the final ``Type: message`` line stay. ``''`` when
    ``max_bytes`` is 0 (tracebacks off). A ``redact`` that raises stores a note instead:
    the unredacted text is never kept."""
    if max_bytes <= 0:
        return ""
    text = "".join(tb_module.format_exception(exc))
    if redact is not None:
        try:
            text = str(redact(text))
        except Exception as e:  # noqa: BLE001 - a broken hook must not cost the outcome
            text = f"<traceback withheld: the redaction hook raised {type(e).__name__}: {e}>\n"
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    marker = b"[... earlier lines cut]\n"
    keep = data[len(data) - max(0, max_bytes - len(marker)) :]
    newline = keep.find(b"\n")  # start at a line: a cut line reads as noise
    if 0 <= newline < len(keep) - 1:
        keep = keep[newline + 1 :]
    return (marker + keep).decode("utf-8", "ignore")[-max_bytes:]


def expired_before_start(env: Envelope, now_ms: int) -> Outcome | None:
    """The message's deadline passed before its handler could start (None: it did not)."""
    if env.deadline_ms and env.deadline_ms <= now_ms:
        return Outcome(
            Status.EXPIRED, DeadReason.EXPIRED, "deadline passed before start", "DeadlineExceeded"
        )
    return None


def no_handler(env: Envelope, agent_id: str) -> Outcome:
    """No handler for the message's capability on this agent."""
    return Outcome(
        Status.DEAD,
        DeadReason.NO_HANDLER,
        f"agent {agent_id} has no handler for {env.capability}",
        "Reject",
    )


def refused_call(err: Rejected) -> Outcome:
    """A handler's call refused for its call path (reach.callpath: ``hop_limit``,
    ``loop``): dead at once, without running; the caller gets ``err``'s type back."""
    return Outcome(Status.DEAD, err.reason, str(err), type(err).__name__)


def invalid_payload(exc: Exception, expected: Any = None) -> Outcome:
    """The payload does not fit ``expected``, the type the handler's first parameter is
    annotated with: dead at once (another attempt would get the same bytes). msgspec's
    message names the field (``- at `$.items[2].qty```)."""
    name = getattr(expected, "__name__", None) or repr(expected)
    why = f"payload does not fit {name}: {exc}" if expected is not None else str(exc)
    return Outcome(Status.DEAD, DeadReason.INVALID_PAYLOAD, why, "ValidationError")


def poisoned(unfinished: int, max_takeovers: int) -> Outcome:
    """``unfinished`` runs of the message never ended: each agent running it stopped first
    (killed, evicted, its event loop blocked past ``stall_s``), and one more takeover would
    pass ``max_takeovers``. Dead, not run again: a message that takes down whoever runs it
    must not go round every agent of its capability."""
    return Outcome(
        Status.DEAD,
        DeadReason.POISONED,
        f"{unfinished} runs never finished: each agent running it stopped first (killed, "
        f"evicted, or its event loop blocked past stall_s), max_takeovers={max_takeovers}. "
        "Not run again: fix the handler (a blocking call in an async handler? make it a "
        "plain function, run in a thread), then replay it",
        "Poisoned",
    )


def returned(result: Any) -> Outcome:
    """The handler returned ``result``: succeeded, unless it cannot be encoded."""
    try:
        raw = encode_payload(result)
    except ConfigError as e:
        return Outcome(Status.DEAD, DeadReason.BAD_RESULT, str(e), "EncodeError")
    return Outcome(Status.SUCCEEDED, result=raw)


def raised(
    env: Envelope, exc: BaseException, *, timed_out: bool, now_ms: int, backoff_ms: int
) -> Outcome:
    """The handler raised ``exc`` (``timed_out``: it ran past the deadline).

    ``reach.Reject`` is dead-lettered at once, and so is a ``HopLimitExceeded`` or
    ``LoopDetected`` of one of the handler's own calls (reason ``hop_limit`` / ``loop``,
    passed up the path to every waiting caller), and a refusal of the agent's own guards
    (``refused_by_guard``, reach._worker.guarding); any other exception is retried while
    attempts remain (then dead-lettered ``max_attempts``), after ``backoff_ms`` or the
    ``delay_s`` of a ``reach.Retry``, unless the deadline would pass before the retry
    (then it expires).
    """
    etype = type(exc).__name__
    if timed_out:
        return Outcome(
            Status.EXPIRED, DeadReason.TIMEOUT, "handler ran past the deadline", "DeadlineExceeded"
        )
    if isinstance(exc, Reject):
        return Outcome(Status.DEAD, DeadReason.REJECTED, str(exc) or "rejected", etype)
    if isinstance(exc, (HopLimitExceeded, LoopDetected)):
        # A call of this handler was refused for its path (reach.callpath): every attempt
        # would make the same call, so its caller is told at once, up the whole path.
        return refused_call(exc)
    if refused_here(exc):  # this agent's guard refused its content: told at once
        return refused_call(exc)  # type: ignore[arg-type]
    if env.attempt >= env.max_attempts:
        return Outcome(Status.DEAD, DeadReason.MAX_ATTEMPTS, str(exc), etype, exc=exc)
    delay_ms = backoff_ms
    if isinstance(exc, Retry) and exc.delay_s is not None:
        delay_ms = int(exc.delay_s * 1000)
    if env.deadline_ms and now_ms + delay_ms >= env.deadline_ms:
        return Outcome(
            Status.EXPIRED,
            DeadReason.EXPIRED,
            f"no time left for a retry after: {exc}",
            etype,
            exc=exc,
        )
    return Outcome(
        Status.RETRYING, error=str(exc), error_type=etype, retry_delay_ms=delay_ms, exc=exc
    )


def backoff_ms(attempt: int, *, base_s: float, max_s: float, jitter: float = 1.0) -> int:
    """The wait before the attempt after ``attempt``: ``base_s`` doubled per attempt, at
    most ``max_s``, times ``jitter`` (the runtime draws it from [0.5, 1.5])."""
    # The exponent is capped: 2**1000 overflows a float, and max_attempts may be large.
    base = base_s * (2 ** min(max(attempt - 1, 0), 60))
    return int(min(max_s, base) * jitter * 1000)


def apply(
    it: Delivery,
    outcome: Outcome,
    *,
    keys: Keys,
    agent_id: str,
    dlq_maxlen: int,
    now_ms: int,
    traceback_max_bytes: int = TRACEBACK_MAX_BYTES,
    redact_traceback: Callable[[str], str] | None = None,
) -> None:
    """Make ``it`` settle as ``outcome``: the fenced completion of its idempotency key, the
    reply (published when final: a retry's caller waits for the last attempt), and the
    dead letter or the delayed retry that follows. The handler's exception, if it raised,
    is stored with them: its type and its traceback (:func:`format_traceback`), in the
    record and the dead letter."""
    env = it.env
    tb = ""
    if outcome.exc is not None:
        tb = format_traceback(outcome.exc, max_bytes=traceback_max_bytes, redact=redact_traceback)
    reply = Reply(
        msg_id=env.msg_id,
        status=outcome.status,
        result=outcome.result if outcome.result is not None else NIL,
        error=outcome.error,
        error_type=outcome.error_type,
        reason=outcome.reason,
        agent_id=agent_id,
        attempt=env.attempt,
    )
    mode = Mode.DONE if outcome.status == Status.SUCCEEDED else Mode.RELEASE
    # Signed by this agent when it has a secret: the reply is also the one stored for
    # replays of the key, which then carry this signature.
    sign_reply_as(keys.namespace, agent_id, reply)
    it.complete = Completion(
        it.idem or keys.idem(env.key),
        it.fence,
        outcome.status,
        mode,
        outcome.error[:2000],
        outcome.error_type if tb else "",
        tb,
        encode_stored(reply) if mode == Mode.DONE else b"",
    )
    if env.reply_to and outcome.status != Status.RETRYING:  # encoded only to be published
        it.answer(keys, encode(reply), publish=True)
    else:  # nobody waits for it (a send), or a retry's caller waits for the last attempt
        it.reply, it.reply_key = b"", ""
    it.follow_up = None
    if outcome.dead_letter:
        it.follow_up = DeadLetter.of_op(
            dead_letter_op(
                keys,
                capability=env.capability,
                reason=outcome.reason,
                data=encode(env),
                error=outcome.error,
                error_type=outcome.error_type,
                attempts=env.attempt,
                agent_id=agent_id,
                msg_id=env.msg_id,
                maxlen=dlq_maxlen,
            )
        )
        if tb:
            it.follow_up = dataclasses.replace(it.follow_up, traceback=tb)
    if outcome.status == Status.RETRYING:
        # The next attempt prefers another agent than the one it failed on.
        retry = msgspec.structs.replace(env, attempt=env.attempt + 1, avoid=agent_id)
        it.follow_up = Delayed(keys.delayed, now_ms + outcome.retry_delay_ms, encode(retry))
    it.outcome = _SETTLED[outcome.status]
    it.reason = outcome.reason

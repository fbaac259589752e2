"""Dead letters of entries that cannot be handled: the per-entry barrier.

Bytes that are not an envelope, and an entry whose claim, handling or settling raised
anyway (data no check foresaw), are filed under the ``_malformed`` dead-letter stream as
they were read, and acked: the worker goes on, and a poison entry never loops.

A message that fails its signature check on an agent requiring signatures
(:mod:`reach.signing`) is dead-lettered ``unauthenticated`` under its capability, as it
was read (an operator can inspect it; a replay sends it only as the operator's own
message), and its caller is told: it is never claimed, so it takes no idempotency key.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..envelope import BadEnvelope, Envelope, Reply, encode
from ..keys import Keys
from ..outcomes import DeadReason, Outcome, Settled, Status
from ..scripts.delivery import Completion, DeadLetter, Mode
from ..signing import sign_reply_for
from ..tasks import dead_letter_op, describe_error, raw_dead_letter_op
from .hookchain import HookChain
from .items import AckOnly, Delivery, Settleable

log = logging.getLogger("reach.runtime")

REPORTS_PER_WINDOW = 10
"""At most this many dead-letter WARNING lines per :data:`REPORT_WINDOW_S` per worker; the
rest are counted, and the next line says how many were not logged."""
REPORT_WINDOW_S = 10.0


class ReportLimit:
    """A fixed-window limit on log lines: a burst of dead letters (a bad deploy fails
    every message) logs a few lines and a count, not one line per message."""

    def __init__(self, per_window: int = REPORTS_PER_WINDOW, window_s: float = REPORT_WINDOW_S):
        self.per_window = per_window
        self.window_s = window_s
        self._start = -window_s
        self._used = 0
        self.suppressed = 0  # lines not logged since the last one that was

    def take(self, now_s: float | None = None) -> bool:
        """True when a line may be logged now (else it is counted in ``suppressed``)."""
        now = time.monotonic() if now_s is None else now_s
        if now - self._start >= self.window_s:
            self._start, self._used = now, 0
        if self._used < self.per_window:
            self._used += 1
            return True
        self.suppressed += 1
        return False


class DeadLetters:
    """Turns unusable entries into dead letters of their bytes."""

    def __init__(self, *, keys: Keys, agent_id: str, dlq_maxlen: int, hooks: HookChain) -> None:
        self.keys = keys
        self.agent_id = agent_id
        self.dlq_maxlen = dlq_maxlen
        self.hooks = hooks
        self.limit = ReportLimit()

    def report(self, it: Delivery, outcome: Outcome) -> None:
        """Log a message dead-lettered from a handler's outcome: one WARNING line (reason,
        error type, the error's first line; rate-limited), and its traceback at DEBUG.
        A cancelled message is an operator's choice, not a fault: INFO."""
        level = logging.INFO if outcome.reason == DeadReason.CANCELLED else logging.WARNING
        if not log.isEnabledFor(level) or not self.limit.take():
            return
        env = it.env
        first = describe_error(outcome.error_type, outcome.error).strip().splitlines()
        skipped, self.limit.suppressed = self.limit.suppressed, 0
        log.log(
            level,
            "dead-lettered %s (%s, attempt %d/%d): %s: %s%s",
            env.msg_id,
            env.capability,
            env.attempt,
            env.max_attempts,
            outcome.reason,
            first[0][:300] if first else "(no error text)",
            f" [{skipped} more dead letter(s) not logged]" if skipped else "",
        )
        tb = it.follow_up.traceback if isinstance(it.follow_up, DeadLetter) else ""
        if tb and log.isEnabledFor(logging.DEBUG):
            log.debug("traceback of %s:\n%s", env.msg_id, tb.rstrip())

    def _letter(self, reason: str, data: bytes, error: str) -> DeadLetter:
        return DeadLetter.of_op(
            raw_dead_letter_op(
                self.keys,
                reason=reason,
                data=data,
                error=error,
                agent_id=self.agent_id,
                maxlen=self.dlq_maxlen,
            )
        )

    def malformed(self, stream: str, entry_id: Any, data: bytes, e: BadEnvelope) -> AckOnly:
        """An entry that is not an envelope (or too large to read): its letter and ack."""
        log.warning("dead-lettering entry %r of %s: %s", entry_id, stream, e)
        self.hooks.on_dead_letter(None, e.reason, e.detail)
        return AckOnly(
            stream=stream,
            entry_id=entry_id,
            raw=data,
            follow_up=self._letter(e.reason, data, e.detail),
            outcome=Settled.MALFORMED,
            reason=e.reason,
        )

    def unauthenticated(
        self, stream: str, entry_id: Any, data: bytes, env: Envelope, why: str
    ) -> Delivery:
        """A message unsigned or forged, on an agent that requires signatures: its dead
        letter (``unauthenticated``, its bytes as read), its caller's reply, its ack."""
        reason = DeadReason.UNAUTHENTICATED
        error = f"message refused: {why} (this agent requires messages signed with the namespace's secret)"
        log.warning(
            "dead-lettering msg %s (%s, from %r): %s",
            env.msg_id[:64],
            env.capability,
            env.source[:64],
            error,
        )
        self.hooks.on_dead_letter(env, reason, error)
        it = Delivery(stream=stream, entry_id=entry_id, env=env, raw=data)
        reply = Reply(
            msg_id=env.msg_id,
            status=Status.DEAD,
            reason=reason,
            error=error,
            error_type="Unauthenticated",
            agent_id=self.agent_id,
            attempt=env.attempt,
        )
        # Unsigned, on purpose: the message names its caller (reply_to, msg_id) without
        # proof. A caller that sent it unsigned (no keys) reads this reply; a signing caller
        # drops it, so a forged copy of its message cannot make the agent tell it, in the
        # agent's name, that its real message was refused.
        it.answer(self.keys, encode(reply), publish=True)
        it.follow_up = DeadLetter.of_op(
            dead_letter_op(
                self.keys,
                capability=env.capability,
                reason=reason,
                data=data,
                error=error,
                error_type="Unauthenticated",
                attempts=env.attempt,
                agent_id=self.agent_id,
                msg_id=env.msg_id,
                maxlen=self.dlq_maxlen,
            )
        )
        it.outcome, it.reason = Settled.DEAD, reason
        return it

    def poison(self, it: Settleable, exc: BaseException, doing: str, *, tell_caller: bool) -> None:
        """Make ``it`` a dead letter ``unprocessable`` of its bytes (+ ack). With
        ``tell_caller``, also the caller's reply and the release of its claim; without,
        only the letter and the ack (for an entry whose reply or completion itself
        cannot be written)."""
        env = it.env if isinstance(it, Delivery) else None
        log.error(
            "message %s dead-lettered: %s failed with %s: %s",
            env.msg_id if env is not None else repr(it.entry_id),
            doing,
            type(exc).__name__,
            exc,
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
        error = f"{doing} failed: {type(exc).__name__}: {exc}"[:2000]
        self.hooks.on_dead_letter(env, DeadReason.UNPROCESSABLE, error)
        if isinstance(it, Delivery):
            it.complete, it.reply_key, it.reply = None, "", b""
            if tell_caller:
                if it.fence:
                    it.complete = Completion(
                        self.keys.idem(it.key), it.fence, Status.DEAD, Mode.RELEASE, error
                    )
                reply = Reply(
                    msg_id=it.env.msg_id,
                    status=Status.DEAD,
                    reason=DeadReason.UNPROCESSABLE,
                    error=error,
                    error_type=type(exc).__name__,
                    agent_id=self.agent_id,
                    attempt=it.env.attempt,
                )
                signed = sign_reply_for(self.keys.namespace, self.agent_id, reply)
                it.answer(self.keys, signed, publish=True)
        it.follow_up = self._letter(DeadReason.UNPROCESSABLE, it.raw, error)
        it.outcome, it.reason = Settled.DEAD, DeadReason.UNPROCESSABLE

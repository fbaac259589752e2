"""Cancelling a message: the caller's side (``Client.cancel``, ``reach cancel``).

A cancel is one ``cancel.lua`` call on the message's idempotency record (found from its
msg_id as :func:`reach.tasks.get_status` finds it): atomically, a message not finished is
marked ``cancelled`` and whoever runs it is fenced out; one that finished is left as it is
(:attr:`CancelResult.outcome` ``already_done``). The workers are told through the
namespace's cancel notices stream (``Keys.cancels``): on standalone Redis the script adds
the notice in the same step, on a Cluster (the stream is in another slot) it is added
right after. The notice is a hint that makes a running handler stop at once; the record
is what every claim and completion obeys (docs/concepts.md, *Cancellation*).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from . import audit
from .connection import AnyRedis
from .keys import Keys
from .outcomes import Status
from .scripts.cancelling import CANCELS_MAXLEN, cancel_call
from .scripts.codes import CancelCode
from .scripts.scheduling import unschedule_call
from .tasks import TASK_TTL_MS
from .untrusted import safe_text


class CancelOutcome(StrEnum):
    """What a cancel did."""

    CANCELLED = "cancelled"
    """Cancelled now: it will not run, or its handler is told to stop."""
    ALREADY_CANCELLED = "already_cancelled"
    """It was cancelled before (nothing changed)."""
    ALREADY_DONE = "already_done"
    """It had finished (succeeded, dead, expired...): nothing changed, it cannot be cancelled."""
    UNKNOWN = "unknown"
    """No record of it: never sent, or older than its record (24 h)."""


_OUTCOMES = {
    CancelCode.CANCELLED: CancelOutcome.CANCELLED,
    CancelCode.ALREADY_CANCELLED: CancelOutcome.ALREADY_CANCELLED,
    CancelCode.DONE: CancelOutcome.ALREADY_DONE,
    CancelCode.UNKNOWN: CancelOutcome.UNKNOWN,
}


@dataclass(frozen=True, slots=True)
class CancelResult:
    """The answer of ``Client.cancel(msg_id)``: ``outcome`` says what the cancel did;
    ``status`` is the task status the message had when it was cancelled (``pending``,
    ``retrying``, ``running``, ``scheduled``), or the one it had ended with (``already_done``)."""

    msg_id: str
    outcome: CancelOutcome
    status: str = ""

    @property
    def cancelled(self) -> bool:
        """True when the message is cancelled (now, or before)."""
        return self.outcome in (CancelOutcome.CANCELLED, CancelOutcome.ALREADY_CANCELLED)


async def cancel_message(
    redis: AnyRedis,
    keys: Keys,
    msg_id: str,
    *,
    cluster: bool,
    by: str = "",
    audited: bool = True,
    control: AnyRedis | None = None,
) -> CancelResult:
    """Cancel ``msg_id`` (see the module docstring); ``by`` names who asked, kept in the
    record's error text. Recorded in the audit trail (reach.audit), but for the cancels
    reach makes by itself (``audited=False``: a cancelled parent's children, a caller
    that gave up waiting). ``control``: the audit trail's Redis when the control plane is
    apart (reach.planes)."""
    if not audited:
        return await _cancel(redis, keys, msg_id, cluster=cluster, by=by)
    async with audit.operator_action(
        control or redis,
        keys,
        "cancel",
        target=msg_id,
        msg_id=msg_id,
        detail={"by": by} if by else None,
    ) as note:
        res = await _cancel(redis, keys, msg_id, cluster=cluster, by=by)
        note.detail.update(result=str(res.outcome), status=res.status)
        if not res.cancelled:
            note.outcome, note.error = "error", f"not cancelled: {res.outcome}"
    return res


async def _cancel(
    redis: AnyRedis, keys: Keys, msg_id: str, *, cluster: bool, by: str
) -> CancelResult:
    pointer = await redis.get(keys.task(msg_id))
    record = keys.idem(safe_text(pointer) if pointer else msg_id)
    error = f"cancelled by {by}" if by else "cancelled"
    notices = None if cluster else keys.cancels
    answer = await cancel_call(
        record, msg_id=msg_id, error=error, ttl_ms=TASK_TTL_MS, notices=notices
    ).run(redis)
    if answer.code is CancelCode.CANCELLED and answer.status == Status.SCHEDULED:
        await unschedule_call(keys, [msg_id]).run(redis)  # never sent now (reach.scheduling)
    elif cluster and answer.code is CancelCode.CANCELLED:
        await notify(redis, keys, msg_id, record)
    return CancelResult(msg_id, _OUTCOMES[answer.code], answer.status)


async def notify(redis: AnyRedis, keys: Keys, msg_id: str, record: str) -> None:
    """Add the notice of a cancel to the namespace's stream (Cluster: after cancel.lua)."""
    await redis.xadd(
        keys.cancels, {"m": msg_id, "k": record}, maxlen=CANCELS_MAXLEN, approximate=True
    )

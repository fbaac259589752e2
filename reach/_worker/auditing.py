"""The audit entries of settled calls of capabilities marked ``audited``.

``@app.handler(CAP, audited=True)`` lists CAP under the agent's ``metadata["audited"]``;
after each settled batch the settler hands the batch here, and the calls of those
capabilities that were settled (their outcome written: not fenced, not let go) are
appended to the namespace's audit trail (reach.audit) in one pipelined round trip, right
after the settle's. A batch with no audited call costs a set lookup per entry, nothing
in Redis; an agent with no audited capability skips even that.

Who called: the verified signer (what ``ctx.sender`` says) when the message is signed
and verifies with this agent's keys (``auth=signed``), else the ``source`` it claims
(``auth=claimed``). A crash between the settle and this write loses the entry (the
outcome is in the task record: ``reach task MSG_ID``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import audit
from ..envelope import Envelope
from ..outcomes import Settled
from ..registry import AUDITED_KEY
from ..scripts.delivery import DeadLetter
from ..signing import worker as worker_signing
from .items import Delivery, Settleable
from .state import Part, Shared

# How a handled attempt ended, as the trail says it.
OUTCOMES = {
    Settled.SUCCEEDED: "succeeded",
    Settled.RETRYING: "failed",  # this attempt failed; another follows
    Settled.DEAD: "dead",
    Settled.EXPIRED: "expired",
}


class CallAudit(Part):
    """One worker's audited capabilities and the entries of their settled calls."""

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        marked = self.agent.metadata.get(AUDITED_KEY)
        self.capabilities = frozenset(marked if isinstance(marked, list) else ())

    def entries(self, settled: Sequence[Settleable]) -> list[dict[str, str]]:
        """The audit entries of the audited calls among ``settled``."""
        caps = self.capabilities
        return [
            self._entry(it)
            for it in settled
            if isinstance(it, Delivery) and it.env.capability in caps and it.outcome in OUTCOMES
        ]

    async def write(self, settled: Sequence[Settleable]) -> None:
        """Append the entries of ``settled``'s audited calls (no-op when there are none)."""
        if not self.capabilities:
            return
        rows = self.entries(settled)
        if rows:
            await audit.record_many(self.control, self.keys, rows)

    def _who(self, env: Envelope) -> tuple[str, str]:
        w = worker_signing(self.keys.namespace, self.agent_id)
        if w is not None and env.sig and w.keys.check_envelope(env) is None:
            return w.keys.sender(env), "signed"
        return env.source, "claimed"

    def _entry(self, it: Delivery) -> dict[str, str]:
        env = it.env
        who, auth = self._who(env)
        f = it.follow_up
        error = f.error if isinstance(f, DeadLetter) else ""
        if not error and it.complete is not None:
            error = it.complete.error
        fields = {
            "kind": "call",
            "action": "call",
            "target": env.capability,
            "who": who,
            "auth": auth,
            "via": "agent",
            "agent": self.agent_id,
            "outcome": OUTCOMES[it.outcome] if it.outcome is not None else "",
            "reason": it.reason,
            "error": audit._cut(error),
            "msg_id": env.msg_id,
            "attempt": str(env.attempt),
            "trace_id": env.trace_id,
        }
        return {k: v for k, v in fields.items() if v}

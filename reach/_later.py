"""What a :class:`~reach.Client` does about a message after sending it: cancel it when
the caller waiting for it gave up (:func:`abandon`), and fetch its result later, from the
reply stream or the task record (:func:`result`, for a caller that restarted).

Held apart from :mod:`reach.client`, whose methods of these names call them, so the
sending path reads on its own there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from ._cancel import cancel_message
from .envelope import Envelope, Reply
from .errors import DeadlineExceeded
from .outcomes import DeadReason, Status

if TYPE_CHECKING:  # annotations only: reach.client imports this module
    from .client import Client

log = logging.getLogger("reach.client")

ABORT_CANCEL_S = 2.0
"""How long a cancelled request() waits for the cancel of its message to be written."""


async def abandon(client: Client, env: Envelope) -> None:
    """``Client._abandon``: the caller of ``env`` was cancelled while it waited: cancel
    the message too (unless ``cancel_on_abort`` is off), shielded and bounded, so the
    caller's own cancellation waits at most :data:`ABORT_CANCEL_S` for it."""
    if not client.cancel_on_abort or client._redis is None:
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_CANCEL_S):
        try:
            await cancel_message(
                client.commands,
                client.keys,
                env.msg_id,
                cluster=client.commands.cluster,
                by=f"{client.client_id} (its caller was cancelled)",
                audited=False,  # reach's own cancel, not an action of anyone's
            )
        except Exception as e:  # noqa: BLE001 - the caller's cancellation goes on
            log.warning("cancelling %s after its caller gave up failed: %s", env.msg_id, e)


async def result(client: Client, msg_id: str, timeout_s: float | None) -> Any:
    """:meth:`Client.result` (documented there)."""
    client._ensure_reader()
    ev = client._reader.events.setdefault(msg_id, anyio.Event())
    capability = "message"  # named in errors; known once the task record was read
    try:
        with anyio.move_on_after(timeout_s):
            while True:
                if msg_id in client._replies:
                    reply = client._reader.take(msg_id)
                    break
                st = await client.task(msg_id)
                capability = st.capability or capability
                if (
                    st.reply is not None
                    and st.status == Status.SUCCEEDED
                    and (client.signer is None or client.signer.check_reply(st.reply) is None)
                ):
                    reply = msgspec.structs.replace(st.reply, msg_id=msg_id)
                    break
                if st.status in (Status.EXPIRED, Status.DEAD):
                    # The record keeps no dead-letter reason: a dead one reads as a
                    # RemoteError that is not retryable.
                    reason = DeadReason.EXPIRED if st.status == Status.EXPIRED else ""
                    reply = Reply(msg_id=msg_id, status=st.status, error=st.error, reason=reason)
                    break
                with anyio.move_on_after(0.5):  # a reply, or look at the record again
                    await ev.wait()
            return client._outcome_of(capability, msg_id, reply)
    finally:
        client._reader.events.pop(msg_id, None)
    raise DeadlineExceeded(
        f"No result for msg {msg_id} within {timeout_s}s; see `reach task {msg_id}`."
    )

"""The gateway's log: one line per client error, tracebacks only for the gateway's own
faults (docs/a2a.md, *Logs*).

The SDK logs a caller's error (no agent for a capability, a bad capability name, a task
not found) as the tracebacks of its producer and of its consumer, each with the reach
error chained in, and warns about cards and queues on the way: two 30-line tracebacks per
client error, which a busy or hostile caller turns into a flood. :class:`SdkNoise` drops
those records (an exception that is an :class:`~a2a.utils.errors.A2AError` is an answer to
the caller, not a fault); the request handler logs :func:`client_error` instead. Any other
exception, the gateway's own, keeps its traceback.
"""

from __future__ import annotations

import logging

from a2a.server.context import ServerCallContext
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, A2AError

log = logging.getLogger("reach.gateway")

# What the SDK says on the way of a client error, or about a card reach generates from its
# fleet (no skill while no capability is registered): not for the operator's log.
_QUIET = (
    "Dispatcher task was cancelled or finished",
    "agent_card passed to agent_card_to_dict",
    "Request Error (ID:",
)


class SdkNoise(logging.Filter):
    """Drops the SDK's records about client errors (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("a2a"):
            return True
        if record.exc_info and isinstance(record.exc_info[1], A2AError):
            return False
        text = record.getMessage()
        return not any(text.startswith(q) for q in _QUIET)


def code_of(error: A2AError) -> int:
    return JSON_RPC_ERROR_CODE_MAP.get(type(error), -32603)


def client_error(error: A2AError, context: ServerCallContext) -> None:
    """One line for an error a caller gets: its JSON-RPC code, the caller, the method."""
    user = context.user
    caller = user.user_name if user.is_authenticated else "-"
    method = context.state.get("method", "?")
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    log.warning(
        "client error: code %d, caller %s, method %s: %s", code_of(error), caller, method, text
    )


def install(handler: logging.Handler) -> None:
    """Filter the SDK's client-error records out of what ``handler`` writes."""
    handler.addFilter(SdkNoise())

"""Call graphs: what a handler's call descends from, and the calls refused before they wait.

A message a handler sends through ``ctx.client`` carries its **call path**: ``hops``, how
many calls it descends from, and ``path``, those calls oldest first (the last
:data:`~reach.envelope.MAX_PATH`), each a :class:`~reach.envelope.Hop` ``(capability,
agent_id, waits)``: the handler that made the call, the agent it ran on, and whether it
waits for the result (``request``, ``stream``) or sent it and went on (``send``). A message
sent by a caller outside any handler has neither (``hops`` 0, no ``path``): it pays nothing.

Three refusals (docs/concepts.md, *Call graphs*):

- **Hop limit**: a call ``max_hops`` deep already (16 by default; set per Client, Agent
  and handler) is refused at send with :class:`~reach.HopLimitExceeded`; one that reaches
  an agent past its own limit is dead-lettered ``hop_limit`` without running.
- **Loop**: a call to a capability on an agent that is already waiting, on the same path,
  for the call being made (A -> B -> A) could only wait until its deadline: it is routed
  to another agent of the capability if one can take it, else refused with
  :class:`~reach.LoopDetected`, the cycle in its message. *Waiting* follows the ``waits``
  flags back from the newest hop: a ``send`` in between breaks the chain (the sender's
  slot is free again). Calls of a handler to its own capability on its own agent, and
  only those (A -> A -> A: recursion), are self-calls, not loops.
- **Self-call**: a handler that waits for a call to its own agent (any capability of it)
  while none of that agent's handler slots is free would wait for a slot its own caller
  holds: the call goes to another agent of the capability, or is refused at once with
  :class:`~reach.WouldDeadlock`. A slot counts as taken by each such call sent to the
  agent and not yet started there, so concurrent self-calls cannot all count one slot.

Where each is checked: the hop limit and the self-call at send, by ``ctx.client``; the
loop at send (each agent the routing policy proposes is checked, so a loop is avoided when
another agent can take the call) and again by the agent that receives the message, for
senders that do not check (another implementation, a message moved by the sweeper): it
dead-letters it ``loop`` and its caller gets ``LoopDetected`` at once, not at its deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .envelope import MAX_PATH, Envelope, Hop
from .errors import ConfigError, HopLimitExceeded, LoopDetected, WouldDeadlock

__all__ = [
    "DEFAULT_MAX_HOPS",
    "CallGate",
    "Gate",
    "SelfSlots",
    "check_max_hops",
    "child_path",
    "describe",
    "find_loop",
    "hop_limit",
    "loop_error",
    "path_of",
]

DEFAULT_MAX_HOPS = 16
MAX_HOPS_SETTING = 10_000

PATH_MARK = "path: "
"""Comes before the path (oldest first, ended by a comma: no capability or agent id holds
one) in the message of a refused call: a caller told by a reply reads it back from there
(:func:`path_of`), and a log line's first 300 characters show it."""

Gate = Callable[[str], Exception | None]
"""Asked about each agent a message would be routed to (by its id): the error that
refuses it, or None (:class:`CallGate` is one)."""


def check_max_hops(value: int, where: str) -> int:
    """``value`` as a ``max_hops`` setting of ``where`` (1..10,000), else ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HOPS_SETTING:
        raise ConfigError(
            f"{where}: max_hops must be an integer between 1 and {MAX_HOPS_SETTING}, got {value!r}."
        )
    return value


def child_path(parent: Envelope, agent_id: str, *, waits: bool) -> tuple[int, list[Hop]]:
    """The ``hops`` and ``path`` of a call made by the handler of ``parent`` running on
    ``agent_id``; ``waits``: that handler waits for the call's result."""
    path = [*parent.path, Hop(parent.capability, agent_id, waits)]
    return parent.hops + 1, path[-MAX_PATH:]


def _waiting(path: Sequence[Hop]) -> Sequence[Hop]:
    """The newest hops of ``path`` that wait, each for the next: the callers a message of
    this path keeps waiting."""
    i = len(path)
    while i and path[i - 1].waits:
        i -= 1
    return path[i:]


def find_loop(path: Sequence[Hop], capability: str, agent_id: str) -> list[Hop] | None:
    """The hops a message of ``path`` to ``capability`` on ``agent_id`` would close a
    cycle through, from the waiting caller it re-enters to the newest; None when it closes
    none. A chain of self-calls alone (every hop from there on the same capability and
    agent) is no loop: the self-call rule judges those by free slots."""
    chain = _waiting(path)
    for i, h in enumerate(chain):
        if h.capability == capability and h.agent_id == agent_id:
            rest = chain[i + 1 :]
            if any(x.capability != capability or x.agent_id != agent_id for x in rest):
                return list(chain[i:])
            return None
    return None


def describe(hops: Sequence[Hop], capability: str = "", agent_id: str = "") -> str:
    """``hops`` (and the call being made, when given) as ``cap@agent -> cap@agent``."""
    parts = [f"{h.capability}@{h.agent_id}" for h in hops]
    if capability:
        parts.append(f"{capability}@{agent_id}" if agent_id else capability)
    return " -> ".join(parts)


def loop_error(cycle: Sequence[Hop], capability: str, agent_id: str) -> LoopDetected:
    """The error of a call to ``capability`` on ``agent_id`` closing ``cycle``."""
    path = describe(cycle, capability, agent_id)
    return LoopDetected(
        f"Call to {capability!r} refused, a loop: {PATH_MARK}{path}, entering agent "
        f"{agent_id!r} again while it waits for this very call (a wait that could only end "
        "at the deadline). Have the inner handler call another capability or agent, or the "
        "outer one send() instead of waiting for the result.",
        path=path,
    )


def path_of(error: str) -> str:
    """The path in a refused call's error message ('' when there is none)."""
    _, mark, rest = error.partition(PATH_MARK)
    return rest.partition(",")[0] if mark else ""


def hop_limit(env: Envelope, max_hops: int, agent_id: str = "") -> HopLimitExceeded | None:
    """The error of ``env`` when it is deeper than ``max_hops`` calls (``agent_id``: the
    agent that found it, '' at send), else None."""
    if env.hops <= max_hops:
        return None
    path = describe(env.path, env.capability, agent_id)
    at = f"agent {agent_id!r} refused it" if agent_id else "not sent"
    return HopLimitExceeded(
        f"Call to {env.capability!r} refused, {PATH_MARK}{path}, {env.hops} calls deep, "
        f"past the limit of {max_hops} ({at}). Agents handing work back and forth? Break "
        "the chain; or raise max_hops (Client, Agent or @app.handler) where a chain is "
        "meant to be this deep.",
        hops=env.hops,
        max_hops=max_hops,
        path=path,
    )


class SelfSlots:
    """An agent's handler slots as its handlers' calls to their own agent see them:
    ``concurrency`` slots, ``busy()`` of them running or queued for a slot, and
    :attr:`pending`, the msg_ids of calls sent to this agent and not started yet (each
    counts as a slot taken: the worker discards it when it hands the message to a slot,
    the caller when its call ends)."""

    __slots__ = ("_busy", "concurrency", "pending")

    def __init__(self, concurrency: int, busy: Callable[[], int]) -> None:
        self.concurrency = concurrency
        self._busy = busy
        self.pending: set[str] = set()

    def free(self) -> int:
        return self.concurrency - self._busy() - len(self.pending)


class CallGate:
    """Which agents a handler's call ``env`` may be routed to. Delivery calls it with
    each agent the routing policy proposes, before anything is written: it returns the
    error that refuses the agent (the policy then tries the others; when none is left,
    that error is raised), or None, and the call goes there.

    ``agent_id`` is the agent the calling handler runs on; ``slots`` its
    :class:`SelfSlots` when the caller waits for the result (None: a ``send``, which holds
    no slot while the call waits)."""

    __slots__ = ("agent_id", "env", "reserved", "slots")

    def __init__(self, env: Envelope, agent_id: str, slots: SelfSlots | None) -> None:
        self.env = env
        self.agent_id = agent_id
        self.slots = slots
        self.reserved = False

    def __call__(self, agent_id: str) -> Exception | None:
        env = self.env
        if env.path:
            cycle = find_loop(env.path, env.capability, agent_id)
            if cycle is not None:
                return loop_error(cycle, env.capability, agent_id)
        slots = self.slots
        if agent_id == self.agent_id and slots is not None:
            if slots.free() <= 0:
                return WouldDeadlock(
                    f"Call to {env.capability!r} refused: it would go to agent "
                    f"{agent_id!r}, the agent of the handler that calls it, and none of "
                    f"its {slots.concurrency} handler slots is free: the call would wait "
                    "for a slot its own caller holds. Start another agent of "
                    f"{env.capability!r}, raise the agent's concurrency, or do the work "
                    "in the handler itself.",
                    capability=env.capability,
                )
            if not self.reserved:
                slots.pending.add(env.msg_id)
                self.reserved = True
        return None

    def release(self) -> None:
        """The call is over: the slot it counted (if it went to its own agent and never
        started there) is not taken any more."""
        if self.reserved and self.slots is not None:
            self.slots.pending.discard(self.env.msg_id)
            self.reserved = False

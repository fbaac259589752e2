"""Free capacity: which agents have an idle slot now, and how long a message would wait.

An agent reports its ``slots`` (its concurrency) at registration and with every heartbeat,
and with each heartbeat its ``queue_depth`` (the entries of its inboxes: running, read
ahead, unread) and ``handler_us`` (its handlers' recent mean run time). The report is a
few seconds old when a pick reads it (the heartbeat period, then the view's re-read of
load figures), so this client adds what it itself sent since:

    load = max(0, queue_depth - own_at_report) + in_flight + sent_since_report
    free = slots - load

``in_flight`` is this client's requests to the agent still waiting for a reply (exact);
``own_at_report`` is that count when this client first saw the report, the part of the
reported depth that is this client's own (not counted twice); ``sent_since_report`` counts
the untracked sends (``send()``: no reply to wait for) since then. An agent with
``free <= 0`` is full; the router passes over a full agent while another one has room
(:mod:`reach.routing.router`). When every usable agent is full, the message goes where it
waits least:

    expected wait = (load - slots + 1) x mean handler time / slots

(the queued entries ahead of it, plus itself, shared by ``slots`` handlers), which splits
a backlog in proportion to capacity (``2`` beside ``16`` slots: ~1/9 and ~8/9). An agent
that reports no slots (an older version) is never counted as full.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from ..registry import AgentInfo

__all__ = ["Capacity", "expected_wait_us"]

MAX_TRACKED: Final = 100_000  # agents whose last report this client remembers


def expected_wait_us(load: int, slots: int, handler_us: float) -> float:
    """How long a message placed now waits for a slot (µs): 0 with a free slot."""
    ahead = load - slots + 1
    return ahead * handler_us / slots if ahead > 0 else 0.0


class Capacity:
    """This client's estimate of each agent's load (see the module docstring).

    :param inflight: this client's in-flight requests per agent (the router's
        :class:`~reach.routing.eligibility.Inflight`, shared with the caller).
    """

    __slots__ = ("_seen", "inflight")

    def __init__(self, inflight: Mapping[str, int]) -> None:
        self.inflight = inflight
        # agent id -> [last_heartbeat_ms of the report, own in flight then, sent since]
        self._seen: dict[str, list[int]] = {}

    def _entry(self, a: AgentInfo) -> list[int]:
        e = self._seen.get(a.agent_id)
        if e is None or e[0] != a.last_heartbeat_ms:
            if e is None and len(self._seen) >= MAX_TRACKED:
                self._seen.clear()  # agents come and go: forget all rather than grow
            e = [a.last_heartbeat_ms, self.inflight.get(a.agent_id, 0), 0]
            self._seen[a.agent_id] = e
        return e

    def sent(self, agent: AgentInfo, n: int = 1) -> None:
        """``n`` untracked messages (no reply awaited) were sent to ``agent``."""
        self._entry(agent)[2] += n

    def load(self, a: AgentInfo) -> int:
        """The entries the agent holds now, by this client's estimate."""
        e = self._entry(a)
        return max(0, a.queue_depth - e[1]) + self.inflight.get(a.agent_id, 0) + e[2]

    def full(self, a: AgentInfo) -> bool:
        """True when the agent reports its slots and has none free."""
        return a.slots > 0 and self.load(a) >= a.slots

    def least_wait(
        self, agents: Iterable[AgentInfo], capability: str = "", cost: float = 1.0
    ) -> list[AgentInfo]:
        """The agents (of ``agents``) where a message of ``cost`` placed now ends first,
        its wait plus its own run (``cost`` x the mean), ties: all.

        The mean is the agent's for ``capability`` (:meth:`AgentInfo.mean_us`); an agent
        without one is taken to have the mean of those that report one (all alike when
        none does); one without reported slots waits 0.
        """
        pool = list(agents)
        means = [a.mean_us(capability) for a in pool]
        known = [m for m in means if m > 0]
        default = sum(known) / len(known) if known else 1.0
        best: list[AgentInfo] = []
        best_w = 0.0
        for a, m in zip(pool, means, strict=True):
            mean = m or default
            w = cost * mean + (
                expected_wait_us(self.load(a), a.slots, mean) if a.slots > 0 else 0.0
            )
            if not best or w < best_w:
                best, best_w = [a], w
            elif w == best_w:
                best.append(a)
        return best

    def forget(self, agent_id: str) -> None:
        """Drop what is known of an agent that left."""
        self._seen.pop(agent_id, None)

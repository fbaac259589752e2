"""Eligibility: which agents may take a message for a capability now, and why not.

An agent is eligible for a capability when it declares the capability, is ``active``,
matches the ``where`` metadata filter, is not draining, is ready, its breaker on this client
is not open, and it is under its queue bound (``max_queue > 0`` and
``queue_depth + this client's in-flight to it >= max_queue`` means full). :func:`eligible`
applies these checks in that order and, when nothing is left, raises
:class:`~reach.errors.NoAgentAvailable` whose ``reason`` names the stage that removed the
last candidates: ``no_agent``, ``filter``, ``draining``, ``not_ready``, ``breaker_open``, or
:class:`~reach.errors.Overloaded` (``overloaded``). Draining is checked before readiness so
that a mix of draining and starting agents reports ``not_ready`` ("retry soon") rather than
``draining``. The message counts every cause.

The first five checks are *static* (they depend only on the registry snapshot), the last
two *dynamic* (they change with every call); :mod:`reach.routing.cache` caches the static
part, and the router applies the dynamic part to the agent a policy proposes.

:func:`target_refusal` explains the same checks for one named agent (policy ``direct``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import NoAgentAvailable, Overloaded
from ..outcomes import Unavailable
from ..registry import AgentInfo, unknown_capability

__all__ = ["Inflight", "eligible", "over_bound", "target_refusal", "version_missing"]

_EMPTY: Mapping[str, int] = {}


class Inflight(dict[str, int]):
    """This client's in-flight count per agent id (a plain dict with add/done helpers)."""

    def add(self, agent_id: str, n: int = 1) -> None:
        self[agent_id] = self.get(agent_id, 0) + n

    def done(self, agent_id: str, n: int = 1) -> None:
        left = self.get(agent_id, 0) - n
        if left > 0:
            self[agent_id] = left
        else:
            self.pop(agent_id, None)


def over_bound(agent: AgentInfo, local_inflight: Mapping[str, int] = _EMPTY) -> bool:
    """True when ``agent`` is at or over its queue bound (never when ``max_queue`` is 0)."""
    mq = agent.max_queue
    return mq > 0 and agent.queue_depth + local_inflight.get(agent.agent_id, 0) >= mq


def eligible(
    agents: Sequence[AgentInfo],
    *,
    capability: str,
    where: Mapping[str, Any] | None = None,
    is_open: Callable[[str], bool] | None = None,
    local_inflight: Mapping[str, int] | None = None,
) -> list[AgentInfo]:
    """The agents that may take a message for ``capability`` now, in input order.

    Raises :class:`NoAgentAvailable` (or :class:`Overloaded`) with the reason when none is
    left; see the module docstring for the order of the checks.
    """
    inflight = _EMPTY if local_inflight is None else local_inflight
    have = [a for a in agents if capability in a.capabilities]
    if not have:
        raise _no_agent(agents, capability)
    live = [a for a in have if a.state == "active"]
    if not live:
        states = _count(a.state for a in have)
        raise _unavailable(
            capability,
            Unavailable.NO_AGENT,
            f"No live agent has capability {capability!r}: {len(have)} declare it but "
            f"{_fmt_counts(states)} (lease missed). Start an agent or wait for it to "
            "heartbeat again.",
        )
    matched = [a for a in live if a.matches(where)] if where else live
    if not matched:
        raise _unavailable(
            capability,
            Unavailable.FILTER,
            f"No agent of {capability!r} matches where={dict(where or {})!r}: "
            f"{len(live)} live agent(s) have {_seen_values(live, where or {})}.",
        )
    scope = f"of {capability!r}" + (f" matching where={dict(where or {})!r}" if where else "")
    serving = [a for a in matched if not a.draining]
    if not serving:
        raise _unavailable(
            capability,
            Unavailable.DRAINING,
            f"All {len(matched)} agent(s) {scope} are draining (shutting down): "
            f"{_ids(matched)}. Start another agent.",
        )
    ready = [a for a in serving if a.ready]
    if not ready:
        draining = len(matched) - len(serving)
        extra = f" ({draining} other(s) draining)" if draining else ""
        raise _unavailable(
            capability,
            Unavailable.NOT_READY,
            f"No agent {scope} is ready yet: {len(serving)} registered but not ready "
            f"{_ids(serving)}{extra}. Retry shortly (agents call mark_ready() after startup).",
        )
    closed = ready if is_open is None else [a for a in ready if not is_open(a.agent_id)]
    if not closed:
        raise _unavailable(
            capability,
            Unavailable.BREAKER_OPEN,
            f"The circuit breaker of this client is open for all {len(ready)} ready agent(s) "
            f"{scope}: {_ids(ready)}; they failed too often recently. A probe is let through "
            "after the cool-down.",
        )
    room = [a for a in closed if not over_bound(a, inflight)]
    if not room:
        detail = ", ".join(
            f"{a.agent_id} {a.queue_depth}+{inflight.get(a.agent_id, 0)}/{a.max_queue}"
            for a in closed[:5]
        )
        more = f" and {len(closed) - 5} more" if len(closed) > 5 else ""
        raise _unavailable(
            capability,
            Unavailable.OVERLOADED,
            f"All {len(closed)} usable agent(s) {scope} are at their queue bound "
            f"(queued+in-flight/max: {detail}{more}). Back off and retry later.",
            Overloaded,
        )
    return room


def target_refusal(
    agents: Sequence[AgentInfo],
    *,
    capability: str,
    where: Mapping[str, Any] | None,
    target: str,
    is_open: Callable[[str], bool] | None,
    local_inflight: Mapping[str, int],
) -> NoAgentAvailable:
    """Why the agent ``target`` cannot take a message for ``capability`` now.

    Returns (does not raise) a :class:`NoAgentAvailable` with reason ``target_unavailable``
    naming the first check it fails, or an :class:`Overloaded` when only its queue bound is
    in the way. An agent that passes every check is refused because its half-open breaker's
    single probe is already in flight.
    """
    a = next((x for x in agents if x.agent_id == target), None)
    msg = f"Target agent {target!r} cannot take {capability!r} now: "
    if a is None:
        why = "it is not registered (see `reach agents`)."
    elif capability not in a.capabilities:
        why = f"it does not declare this capability (it has {', '.join(a.capabilities)})."
    elif a.state != "active":
        why = f"it is in state {a.state!r} (lease missed)."
    elif where and not a.matches(where):
        why = f"it does not match where={dict(where)!r}."
    elif a.draining:
        why = "it is draining (shutting down)."
    elif not a.ready:
        why = "it is not ready yet; retry shortly."
    elif is_open is not None and is_open(a.agent_id):
        why = "the circuit breaker of this client is open for it (recent failures)."
    elif over_bound(a, local_inflight):
        return _unavailable(
            capability,
            Unavailable.OVERLOADED,
            msg + f"it is at its queue bound ({a.queue_depth} queued + "
            f"{local_inflight.get(target, 0)} in flight / {a.max_queue}). Back off and retry.",
            Overloaded,
        )
    else:
        why = "its half-open breaker probe is already in flight."
    return _unavailable(capability, Unavailable.TARGET_UNAVAILABLE, msg + why)


def version_missing(
    capability: str, versions: Sequence[str], agents: Sequence[AgentInfo]
) -> NoAgentAvailable:
    """The error of a message of a split capability when none of its agents runs one of
    ``versions`` (those with a share above 0): reason ``version``."""
    have = _count(repr(a.app_version) for a in agents if capability in a.capabilities)
    return _unavailable(
        capability,
        Unavailable.VERSION,
        f"No agent of {capability!r} runs a version its split sends messages to "
        f"({', '.join(map(repr, versions))}); its agents run {_fmt_counts(have) or 'none'}. "
        f"Start agents of those versions, or change the split (reach caps split {capability}).",
    )


def _no_agent(agents: Sequence[AgentInfo], capability: str) -> NoAgentAvailable:
    # Only what the caller passed is known here (often the capability's own agents: none);
    # the client replaces this with the registry's figures (Registry.no_agent).
    live = sum(1 for a in agents if a.state == "active")
    return unknown_capability(
        capability, live_agents=live, capabilities=[c for a in agents for c in a.capabilities]
    )


def _unavailable(
    capability: str,
    reason: Unavailable,
    message: str,
    kind: type[NoAgentAvailable] = NoAgentAvailable,
) -> NoAgentAvailable:
    return kind(message, capability=capability, reason=reason)


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _fmt_counts(c: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(c.items()))


def _ids(agents: Sequence[AgentInfo], limit: int = 5) -> str:
    s = ", ".join(a.agent_id for a in agents[:limit])
    return s + (f" and {len(agents) - limit} more" if len(agents) > limit else "")


def _seen_values(agents: Sequence[AgentInfo], where: Mapping[str, Any]) -> str:
    parts = []
    for k in where:
        vals = sorted({str(a.metadata.get(k)) for a in agents})
        shown = ", ".join(vals[:5]) + (", ..." if len(vals) > 5 else "")
        parts.append(f"{k} in {{{shown}}}")
    return "; ".join(parts)

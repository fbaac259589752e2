"""Moving a message a slow agent has not started (``reroute_after_s``).

A caller that asks for it (per call: ``Client.send/request(..., reroute_after_s=5)``; per
capability: its agents' ``metadata={"reroute_after_s": {"text.summarize": 5}}``) has its
client watch the message once it is in an inbox: each ``reroute_after_s`` the client picks
another agent with a free slot and runs ``lua/reroute.lua``, which moves the entry there
only while its first agent has not read it (the move and the removal of the first copy are
one step), so the message runs once and the first copy never starts after the move. A
message read by its agent (running, or about to) stays where it is.

Why the caller: it holds what a move needs already (the entry id, the agent, the routing
view and this client's in-flight counts), so a message without the option costs nothing,
and a move costs one script call. The sweeper would have to scan every inbox for old
entries; the slow agent's peers would have to watch each other's inboxes. The price: a
caller that goes away stops watching (its messages stay queued where they are, and run
there; nothing is lost).

Standalone Redis only: the two inboxes and the record are three slots, which one script
may touch on a single server, not on a Cluster (a per-call ``reroute_after_s`` is then a
:class:`~reach.errors.ConfigError`; an advertised one is not applied, logged once).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Final

import anyio
import anyio.abc
from redis import exceptions as rexc

from .envelope import Envelope, now_ms
from .errors import ConfigError, NoAgentAvailable
from .registry import AgentInfo
from .routing import Router
from .scripts.codes import RerouteCode
from .scripts.inbox import reroute_call

__all__ = ["ADVERTISED", "MAX_MOVES", "Rerouter", "asking", "check_after"]

log = logging.getLogger("reach.client")

ADVERTISED: Final = "reroute_after_s"
"""The metadata key under which agents advertise a capability's ``reroute_after_s``."""
MAX_MOVES: Final = 8
"""A message is moved at most this many times (each move puts it at the end of a queue)."""

# The reroute_after_s of the delivery this task makes (set around one send or request).
_AFTER: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "reach_reroute_after_s", default=None
)

Pick = Callable[[Envelope, Mapping[str, Any] | None, set[str]], Awaitable[AgentInfo | None]]


def check_after(after_s: float | None, env: Envelope, *, cluster: bool) -> float | None:
    """``after_s`` checked for ``env`` (:class:`ConfigError` when it cannot apply)."""
    if after_s is None:
        return None
    if isinstance(after_s, bool) or not isinstance(after_s, (int, float)):
        raise ConfigError(f"reroute_after_s must be a number of seconds, got {after_s!r}.")
    if not math.isfinite(after_s) or after_s <= 0:
        raise ConfigError(f"reroute_after_s must be > 0 seconds, got {after_s!r}.")
    if env.target:
        raise ConfigError(
            "reroute_after_s moves a message to another agent: it does not apply to a "
            f"message sent to one agent (target={env.target!r}). Leave out one of the two."
        )
    if cluster:
        raise ConfigError(
            "reroute_after_s needs a standalone Redis (or Sentinel): on a Cluster a move "
            "would span three hash slots. Leave it out, or use a standalone Redis."
        )
    return float(after_s)


@contextlib.contextmanager
def asking(after_s: float | None, env: Envelope, *, cluster: bool) -> Iterator[None]:
    """Within this block, ``env`` (which this task delivers) is watched every ``after_s``
    (checked first: :func:`check_after`)."""
    token = _AFTER.set(check_after(after_s, env, cluster=cluster))
    try:
        yield
    finally:
        _AFTER.reset(token)


def advertised(agent: AgentInfo, capability: str) -> float | None:
    """The ``reroute_after_s`` ``agent`` advertises for ``capability``, when valid."""
    adv = agent.metadata.get(ADVERTISED)
    if not isinstance(adv, dict):
        return None
    v = adv.get(capability)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        return None
    return float(v)


class Rerouter:
    """A client's watches of the messages it asked to move (see the module docstring).

    :param pick: another agent for a message, passing over the given agent ids (None:
        none usable with a free slot now).
    """

    def __init__(
        self, *, router: Router, commands: Any, keys: Any, cluster: bool, pick: Pick
    ) -> None:
        self.router = router
        self.commands = commands
        self.keys = keys
        self.cluster = cluster
        self.pick = pick
        self.tg: anyio.abc.TaskGroup | None = None  # the client's, set when it starts
        self._watches: dict[str, tuple[anyio.CancelScope, list[str]]] = {}
        self._warned = False
        self.moves = 0  # messages moved by this client (for tests and logs)

    def placed(
        self,
        env: Envelope,
        agent: AgentInfo,
        entry_id: str,
        *,
        tracked: bool,
        where: Mapping[str, Any] | None = None,
    ) -> None:
        """``env`` was added to ``agent``'s inbox as ``entry_id`` (routed under the
        metadata filter ``where``): watch it if asked."""
        after = _AFTER.get()
        if after is None:
            after = advertised(agent, env.capability)
            if after is None or env.target:
                return
            if self.cluster:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "agents advertise reroute_after_s for %s, which needs a standalone "
                        "Redis: not applied on this Cluster",
                        env.capability,
                    )
                return
        if self.tg is None or env.msg_id in self._watches:
            return
        scope = anyio.CancelScope()
        current = [agent.agent_id]
        self._watches[env.msg_id] = (scope, current)
        self.tg.start_soon(self._watch, env, where, current, entry_id, after, tracked, scope)

    def end(self, msg_id: str, agent_id: str) -> str:
        """The call of ``msg_id`` is over: stop watching it; the agent it is with now
        (``agent_id`` when it never moved)."""
        w = self._watches.pop(msg_id, None)
        if w is None:
            return agent_id
        w[0].cancel()
        return w[1][0] if agent_id else agent_id

    async def _watch(
        self,
        env: Envelope,
        where: Mapping[str, Any] | None,
        current: list[str],
        entry_id: str,
        after_s: float,
        tracked: bool,
        scope: anyio.CancelScope,
    ) -> None:
        try:
            with scope:
                await self._moves(env, where, current, entry_id, after_s, tracked)
        finally:
            if not tracked:  # a request's watch ends with its call (end())
                self._watches.pop(env.msg_id, None)

    async def _moves(
        self,
        env: Envelope,
        where: Mapping[str, Any] | None,
        current: list[str],
        entry_id: str,
        after_s: float,
        tracked: bool,
    ) -> None:
        moved = 0
        while moved < MAX_MOVES:
            await anyio.sleep(after_s)
            if env.deadline_ms and env.deadline_ms <= now_ms():
                return
            try:
                to = await self.pick(env, where, {current[0]})
            except NoAgentAvailable:
                continue
            if to is None or to.agent_id == current[0]:
                continue  # nobody has room now: look again after another after_s
            call = reroute_call(
                self.keys,
                record=self.keys.idem(env.key),
                from_agent=current[0],
                entry_id=entry_id,
                to_agent=to.agent_id,
                priority=env.priority,
                max_queue=to.max_queue,
            )
            try:
                got = await call.run(self.commands)
            except (rexc.ConnectionError, rexc.TimeoutError):
                continue  # Redis away: the message is where it was; try again later
            if got.code == RerouteCode.FULL:
                continue
            if got.code != RerouteCode.MOVED:
                return  # read (running or about to), settled, or gone: it stays
            log.info(
                "%s %s not started by %s within %.3gs: moved to %s",
                env.capability,
                env.msg_id,
                current[0],
                after_s,
                to.agent_id,
            )
            inflight = self.router.inflight
            if tracked:
                inflight.done(current[0])
                inflight.add(to.agent_id)
            else:
                self.router.capacity.sent(to)
            current[0], entry_id = to.agent_id, got.entry_id
            moved += 1
            self.moves += 1

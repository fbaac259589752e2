"""Gather: ask several agents of one capability the same thing and take a quorum.

:meth:`reach.Client.gather` sends one copy of a message to every eligible agent (or to
``n`` of them), each copy with its own idempotency key and the same deadline, and
returns as soon as ``quorum`` of them answered: the copies still running are cancelled
(their handlers see ``ctx.cancelled``; a copy not started yet never runs). A copy that
fails (the handler raised, its deadline passed, its agent died) is counted, not raised;
only when so many failed that the quorum can no longer be met does the call raise
:class:`reach.QuorumFailed`, at once, with what was gathered so far.

:func:`vote` then reduces the answers to one value: the value most of them gave, with
how many gave it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from .envelope import new_id, now_ms
from .errors import ConfigError, QuorumFailed
from .registry import normalize_capability

if TYPE_CHECKING:
    from .client import Client

QUORUM_WORDS = ("majority", "all")


@dataclass(frozen=True)
class Answer:
    """One agent's result in a :class:`Gathered`."""

    agent_id: str
    result: Any


@dataclass(frozen=True)
class Failure:
    """One agent's copy that failed: the error its request would have raised
    (:class:`reach.RemoteError`, :class:`reach.DeadlineExceeded`, :class:`reach.Rejected`,
    ...)."""

    agent_id: str
    error: Exception


@dataclass(frozen=True)
class Gathered:
    """What :meth:`reach.Client.gather` collected.

    ``answers`` in the order they came; ``failures`` likewise; ``asked`` the agents sent a
    copy; ``quorum`` the number of answers that was needed; ``cancelled`` the agents whose
    copy was still out when the gather ended (they were cancelled)."""

    capability: str
    quorum: int
    asked: list[str]
    answers: list[Answer] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    @property
    def results(self) -> list[Any]:
        """The answers' results alone, in the order they came."""
        return [a.result for a in self.answers]

    @property
    def met(self) -> bool:
        """Whether the quorum was met."""
        return len(self.answers) >= self.quorum


@dataclass(frozen=True)
class Vote:
    """What :func:`vote` found: the ``value`` most answers gave, how many gave it
    (``support``) out of ``total``, and the agents that gave it (when the answers named
    them). ``majority``: more than half gave it."""

    value: Any
    support: int
    total: int
    agents: list[str]

    @property
    def majority(self) -> bool:
        return 2 * self.support > self.total


def quorum_of(quorum: int | str, asked: int) -> int:
    """The number of answers ``quorum`` asks for out of ``asked`` copies: an int as it is,
    ``"majority"`` more than half, ``"all"`` every one. :class:`reach.ConfigError` for
    anything else (a bool, zero or less, an unknown word)."""
    if isinstance(quorum, str):
        if quorum == "majority":
            return asked // 2 + 1
        if quorum == "all":
            return asked
        raise ConfigError(
            f"quorum={quorum!r} is not understood: pass a number of answers (e.g. 3), "
            "'majority' (more than half of the agents asked) or 'all'."
        )
    if isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1:
        raise ConfigError(
            f"quorum={quorum!r} must be a whole number of answers of 1 or more, "
            "'majority' or 'all'."
        )
    return quorum


async def gather(
    client: Client,
    capability: str,
    payload: Any,
    quorum: int | str,
    n: int | None,
    timeout_s: float | None,
    where: Mapping[str, Any] | None,
    idempotency_key: str | None,
    opts: dict[str, Any],
) -> Gathered:
    """:meth:`reach.Client.gather` (documented there)."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(f"n={n!r} must be a whole number of agents of 1 or more (or None: all).")
    if timeout_s is not None and not timeout_s > 0:
        raise ConfigError(f"timeout_s={timeout_s!r} must be a number of seconds above 0.")
    # NoAgentAvailable (with the registry's figures) when none is eligible.
    eligible = await client.eligible(capability, where=where)
    split = await client._delivery.versions.split_for(normalize_capability(capability))
    if split is not None:  # a version with share 0 is not asked (docs/routing.md)
        eligible = [a for a in eligible if a.app_version in split.live]
    agents = [a.agent_id for a in eligible]
    if n is not None and n < len(agents):
        agents = random.sample(agents, n)  # spread over the agents, call after call
    need = quorum_of(quorum, len(agents))
    out = Gathered(capability=capability, quorum=need, asked=list(agents))
    if need > len(agents):
        raise QuorumFailed(_impossible(out, f"only {len(agents)} eligible"), gathered=out)
    base = idempotency_key or new_id()
    # One deadline for every copy: the gather ends by it, whatever each copy does.
    if timeout_s is None:  # the capability's advertised timeout, else the client's default
        timeout_s = await client.timeout_for(capability)
    deadline_ms = now_ms() + int(1000 * timeout_s)
    running = set(agents)

    async def one(agent_id: str, scope: anyio.CancelScope) -> None:
        env = client.build(
            capability,
            payload,
            target=agent_id,
            deadline_ms=deadline_ms,
            idempotency_key=f"{base}:{agent_id}",
            policy="broadcast",
            **opts,
        )
        try:
            res = await client.call(env, where=where)
        except Exception as e:  # noqa: BLE001 - a failed copy is counted, not raised
            out.failures.append(Failure(agent_id, e))
        else:
            out.answers.append(Answer(agent_id, res))
        running.discard(agent_id)
        if len(out.answers) >= need or len(out.answers) + len(running) < need:
            scope.cancel()  # met, or no longer possible: the copies still out are cancelled

    async with anyio.create_task_group() as tg:
        for a in agents:
            tg.start_soon(one, a, tg.cancel_scope)
    out.cancelled.extend(a for a in agents if a in running)
    if out.met:
        return out
    raise QuorumFailed(_impossible(out, f"{len(out.failures)} failed"), gathered=out)


def _impossible(g: Gathered, why: str) -> str:
    shown = "; ".join(
        f"{f.agent_id}: {type(f.error).__name__}: {f.error}" for f in g.failures[:3]
    ) + ("; ..." if len(g.failures) > 3 else "")
    return (
        f"The quorum of {g.quorum} answers for {g.capability!r} cannot be met: {why}, "
        f"{len(g.answers)} answered, of {len(g.asked)} agents asked"
        + (f" ({shown})" if shown else "")
        + ". Lower the quorum, start more agents of the capability, or give the gather a "
        "longer timeout_s; QuorumFailed.gathered holds what did answer."
    )


def _canonical(value: Any) -> Hashable:
    """What two results must share to count as the same answer: their JSON with sorted
    keys (so equal dicts agree whatever their order), else their repr."""
    try:
        return msgspec.json.encode(value, order="sorted")
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def vote(
    results: Gathered | Iterable[Answer] | Iterable[Any],
    *,
    key: Callable[[Any], Hashable] | None = None,
) -> Vote:
    """The value most of ``results`` gave, and its support.

    ``results``: a :class:`Gathered`, its ``answers``, or plain values. Two results agree
    when ``key`` maps them to equal values (default: equal JSON with sorted keys, so
    ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` agree; pass e.g. ``key=lambda r:
    r["label"]`` to vote on one field). A tie goes to the value whose first supporter
    came first. :class:`reach.ConfigError` when there is no result to vote on."""
    items: list[Any] = list(results.answers if isinstance(results, Gathered) else results)
    if not items:
        raise ConfigError(
            "vote() got no result to vote on: gather at least one answer first "
            "(Gathered.answers is empty)."
        )
    k = key or _canonical
    tally: dict[Hashable, tuple[int, Any, list[str]]] = {}
    for it in items:
        agent, value = (it.agent_id, it.result) if isinstance(it, Answer) else ("", it)
        h = k(value)
        support, first, agents = tally.get(h, (0, value, []))
        if agent:
            agents.append(agent)
        tally[h] = (support + 1, first, agents)
    best = max(tally.values(), key=lambda t: t[0])  # max keeps the first of equals
    return Vote(value=best[1], support=best[0], total=len(items), agents=best[2])

"""Hedged requests (``hedge_after_s``): when a request has no answer after a while, a
second copy goes to another agent; the first answer wins and the other copy is cancelled.

A hedge runs the handler a second time, possibly while the first run goes on, so it is
only for a capability declared idempotent: every eligible agent of it says so
(``@app.handler(cap, idempotent=True)``, advertised with the registration as
``metadata["idempotent"]``). Otherwise ``Client.request(..., hedge_after_s=...)`` is a
:class:`~reach.errors.ConfigError` before anything is sent: a started message is never run
twice unless its capability allows it and the caller asks.

The hedge is its own message: a new msg_id, the idempotency key ``<key>:hedge`` (the
first copy's key, a caller's or its msg_id, and a suffix, so the fenced claim of the
first copy does not refuse it and a repeat of the same hedged request replays both), the
same payload, deadline, session and trace, sent with ``target=`` to an eligible agent
other than the first copy's (that agent read from the first copy's task record). While
no other agent is eligible, no hedge is sent (it is looked for again every
``hedge_after_s``, at most every second). A copy that fails leaves the other to answer;
the request fails only when every copy sent did, with the first copy's error.

Not a retry: a message that fails is retried by its worker as any other (``max_attempts``);
and not ``reroute_after_s`` (docs/routing.md), which moves a message no agent has started,
so it still runs once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from .envelope import Envelope, new_id
from .errors import ConfigError, NoAgentAvailable
from .outcomes import Status
from .registry import AgentInfo

if TYPE_CHECKING:
    from .client import Client

__all__ = ["HEDGE_SUFFIX", "check_after", "request"]

HEDGE_SUFFIX = ":hedge"
"""Appended to the first copy's idempotency key to name the hedge's."""
MAX_LOOK_S = 1.0
"""While no other agent can take the hedge, it is looked for at least this often."""
_FINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.DEAD, Status.EXPIRED, Status.CANCELLED})


def check_after(after_s: float | None, env: Envelope) -> float | None:
    """``after_s`` when it is a usable ``hedge_after_s`` for ``env`` (None: no hedging);
    :class:`~reach.errors.ConfigError` otherwise."""
    if after_s is None:
        return None
    if (
        isinstance(after_s, bool)
        or not isinstance(after_s, int | float)
        or not math.isfinite(after_s)
        or after_s <= 0
    ):
        raise ConfigError(
            f"hedge_after_s={after_s!r}: give a number of seconds above 0 (e.g. 2.5), or leave "
            "it out for no hedging."
        )
    if env.target:
        raise ConfigError(
            f"hedge_after_s with target={env.target!r}: a hedge goes to another agent, and a "
            "targeted message has only one. Leave out target= or hedge_after_s."
        )
    return float(after_s)


def _not_idempotent(agents: list[AgentInfo], capability: str) -> list[str]:
    return [a.agent_id for a in agents if not a.idempotent(capability)]


async def same_version(
    client: Client,
    env: Envelope,
    first: str,
    agents: list[AgentInfo],
    others: list[AgentInfo],
) -> list[AgentInfo]:
    """``others`` narrowed, when the capability is split between versions
    (docs/routing.md, *Version canaries*), to the version of the agent the first copy went
    to (``first``; unknown: to the versions with a share): a hedge is the same request,
    and a version with share 0 gets none."""
    split = await client._delivery.versions.split_of(env)
    if split is None:
        return others
    version = next((a.app_version for a in agents if a.agent_id == first), None)
    if version is not None and version in split.live:
        return [a for a in others if a.app_version == version]
    return [a for a in others if a.app_version in split.live]


async def request(
    client: Client, env: Envelope, where: Mapping[str, Any] | None, after_s: float
) -> Any:
    """``Client.request`` of ``env`` with a hedge after ``after_s`` (see the module)."""
    cap = env.capability
    try:
        agents = await client.eligible(cap, where=where)
    except NoAgentAvailable:
        agents = []  # the call below says so (or its fallback answers)
    refusing = _not_idempotent(agents, cap)
    if refusing:
        raise ConfigError(
            f"hedge_after_s on {cap!r}: a hedge runs the handler twice, and agents "
            f"{', '.join(refusing[:5])} do not declare {cap!r} idempotent. Declare it with "
            f"@app.handler({cap!r}, idempotent=True) on every agent if running a message "
            "twice is harmless, or leave out hedge_after_s."
        )
    answers: list[Any] = []
    errors: list[BaseException] = []
    out = {"running": 0}

    async with anyio.create_task_group() as tg:

        async def run(e: Envelope) -> None:  # counted in "running" by whoever starts it
            try:
                res = await client.call(e, where=where)
            except Exception as x:  # noqa: BLE001 - the other copy may still answer
                errors.append(x)
                out["running"] -= 1
                if out["running"] == 0:
                    tg.cancel_scope.cancel()  # nothing left that could answer
                return
            answers.append(res)
            tg.cancel_scope.cancel()  # the first answer wins: the other copy is cancelled

        async def hedge() -> None:
            await anyio.sleep(after_s)
            while True:
                st = await client.task(env.msg_id)
                if st.status in _FINAL:
                    return  # answered (or failed): its reply is on its way to run()
                try:
                    agents = await client.eligible(cap, where=where)
                except NoAgentAvailable:
                    agents = []
                others = [a for a in agents if a.agent_id != st.agent_id and a.idempotent(cap)]
                others = await same_version(client, env, st.agent_id, agents, others)
                if others:
                    break
                await anyio.sleep(min(after_s, MAX_LOOK_S))
            copy = msgspec.structs.replace(
                env,
                msg_id=new_id(),
                idempotency_key=(env.idempotency_key or env.msg_id) + HEDGE_SUFFIX,
                target=random.choice(others).agent_id,
                policy="",
                sig=b"",
                kid="",
            )
            out["running"] += 1
            tg.start_soon(run, copy)

        out["running"] += 1
        tg.start_soon(run, env)
        tg.start_soon(hedge)
    if answers:
        return answers[0]
    raise errors[0]

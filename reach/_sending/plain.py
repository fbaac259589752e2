"""The plain send's fast path: ``Client.send`` or ``Client.request`` of a message that
needs nothing but a pick.

Most sends of a busy caller are alike: a fresh message, no ``where=``, no call gate,
on a standalone Redis, with everything the full path
(:meth:`reach._sending.delivery.Delivery.deliver`) reads already in memory and fresh: the namespace's quotas (no send rate to take from), the
version splits (none for the capability), the capability's agents in the registry view,
and the early look at who may call it (passed at this view version). For such a message
the full path's steps are each a coroutine that answers from memory; here they are one
synchronous look (:func:`plan`) and one pick, then the coalesced inbox write, the only
step that waits.

Anything else takes the full path, which reads what is stale and says why a send is
refused: :func:`plan` returns None, a pick that finds no agent goes there, and so does a
message an agent's bound refused (with that agent passed over). The outcome of a send is
the full path's in every case; only the work to get there differs.
"""

from __future__ import annotations

from typing import NamedTuple

from .. import logs, metrics
from ..envelope import Envelope, encode, now_ms
from ..errors import NoAgentAvailable
from ..quotas import Quotas
from ..registry import AgentInfo
from ..scripts import inbox
from .delivery import Delivery, claim_at_send, inbox_bound, policy_for, seal


class Plan(NamedTuple):
    """What a plain send of one message uses: the capability's agents, the view's version
    they were read at, and the namespace's quotas."""

    candidates: list[AgentInfo]
    version: int
    quotas: Quotas


def plan(delivery: Delivery, env: Envelope) -> Plan | None:
    """The :class:`Plan` for ``env`` when all it needs is in memory and fresh and nothing
    but a pick applies (the module docstring), else None (take the full path)."""
    if delivery.coalescer is None or logs.tracing():
        return None
    if env.deadline_ms and env.deadline_ms <= now_ms():
        return None  # the full path says the deadline passed
    q = delivery.quota_cache.fresh()
    if q is None or q.send_rate is not None:
        return None
    splits = delivery.versions.cache.fresh()
    if splits is None or (not env.target and env.capability in splits):
        return None
    seen = delivery.view.peek(env.capability)
    if seen is None:
        return None
    return Plan(seen[0], seen[1], q)


async def send(delivery: Delivery, env: Envelope, p: Plan, *, track: bool = False) -> str:
    """Pick an agent for ``env`` by ``p`` and add it to that agent's inbox; the agent id.
    As :meth:`reach._sending.delivery.Delivery.deliver` with ``quota=True`` (``track``:
    counted in flight to the agent from the pick, as there), which takes over when the
    pick finds no agent or the agent's bound refuses the message."""
    try:
        agent = delivery.router.pick(
            env.capability,
            p.candidates,
            policy=policy_for(env, p.candidates, delivery.default_policy),
            session_id=env.session_id or None,
            target=env.target or None,
            version=p.version,
            avoid=env.avoid,
            cost=env.cost,
        )
    except NoAgentAvailable:  # nothing was written: the full path re-reads and says why
        return await delivery.deliver(env, track=track)
    if track:  # counted at the pick, so the next picks see it, as there
        delivery.router.inflight.add(agent.agent_id)
    else:  # no reply will say when it is done: counted until the agent reports
        delivery.router.capacity.sent(agent)
    bound = inbox_bound(agent, p.quotas.max_inbox)
    if delivery.signer is not None or env.sig:
        seal(env, delivery.signer, tracing=False)
    coalescer = delivery.coalescer
    assert coalescer is not None  # plan() looked
    m = inbox.Message.of(env, encode(env))
    try:
        sent = await coalescer.send(
            inbox.Delivery(m, agent.agent_id, env.priority, bound, *claim_at_send(agent, env))
        )
    except BaseException as e:  # as the full path's inbox write says it
        if track:
            delivery.router.inflight.done(agent.agent_id)
        if not isinstance(e, Exception):
            raise
        err = await delivery.add_failed(env, agent.agent_id, e)
        if err is e:
            raise
        raise err from e
    if sent.refused:  # the full path tries the others, this agent passed over
        if track:
            delivery.router.inflight.done(agent.agent_id)
        refused = {agent.agent_id: (sent.depth, bound)}
        return await delivery.deliver(env, track=track, refused=refused)
    delivery.reroute.placed(env, agent, sent.entry_id, tracked=track, where=None)
    metrics.message_sent(env.capability, env.priority)
    return agent.agent_id

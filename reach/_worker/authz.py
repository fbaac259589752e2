"""What refuses a claimed message before its handler runs: who may call what (reach.authz)
and how deep the call is (reach.callpath: ``hop_limit``, ``loop``).

Execution asks :meth:`Gate.refuse` for every claimed message whose capability it has a
handler for. A capability nobody restricts (no ``allow=``, level ``public``, no operator
rule) costs no signature check; the operator's rules are polled at most every
``ACCESS_REFRESH_S`` while messages come (one small read, none per message). A restricted
one has its signature verified here with the agent's keys (the verified sender is kept on
the context, so ``ctx.sender`` does not verify it again), and a refusal is an outcome like
``hop_limit``'s: dead-lettered ``forbidden`` at once, its caller told (a signed reply).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..authz import (
    Caller,
    Declared,
    OperatorRules,
    Policy,
    RulesCache,
    caller_of,
    decide,
    declared_rules,
)
from ..callpath import find_loop, hop_limit, loop_error
from ..envelope import Envelope
from ..outcomes import DeadReason, Outcome, Status
from ..signing import worker as worker_signing
from . import outcome as oc
from .letters import ReportLimit

if TYPE_CHECKING:
    from ..agent import Agent, HandlerSpec
    from ..connection import AnyRedis
    from ..context import Context
    from ..keys import Keys

log = logging.getLogger("reach.runtime")

_NO_RULES = OperatorRules()
_PUBLIC = Declared()


class Gate:
    """One running agent's access check."""

    def __init__(self, agent: Agent, keys: Keys, redis: AnyRedis) -> None:
        self.agent_id = agent.agent_id
        self.max_hops = agent.max_hops
        self.keys = keys
        self.redis = redis
        # Read once at start, as the handlers are: what the registration publishes.
        self.declared = declared_rules(agent.metadata)
        self.rules = RulesCache()
        self._logged = ReportLimit()
        # Whether each capability is open (no signer needed), under the rules it was
        # judged with: judged again when the operator's rules change.
        self._open: dict[str, bool] = {}
        self._open_under: dict[str, OperatorRules] | None = None

    def passes(self, env: Envelope) -> bool:
        """True when ``env`` is let through without a look (:meth:`refuse` would say
        None): no call path to check, and a capability nobody restricts under rules read
        lately. False says nothing: ask :meth:`refuse`. Every message asks this first: a
        dict lookup, where :meth:`refuse` costs coroutines and a policy per message."""
        if env.hops or env.path:
            return False
        rules = self.rules.fresh()
        if rules is None:
            return False
        if rules is not self._open_under:
            self._open, self._open_under = {}, rules
        cap = env.capability
        ok = self._open.get(cap)
        if ok is None:  # capabilities with a handler here only: a bounded dict
            policy = Policy(self.declared.get(cap, _PUBLIC), rules.get(cap, _NO_RULES))
            ok = self._open[cap] = not policy.needs_signer
        return ok

    async def refuse(self, env: Envelope, ctx: Context, spec: HandlerSpec) -> Outcome | None:
        """The outcome of a message refused before its handler runs, else None:
        ``forbidden`` (:meth:`access`), then ``hop_limit`` or ``loop`` (:meth:`call_path`)."""
        refused = await self.access(env, ctx)
        if refused is None and (env.hops or env.path):
            refused = self.call_path(env, spec)
        return refused

    def call_path(self, env: Envelope, spec: HandlerSpec) -> Outcome | None:
        """A handler's call that is too deep for this handler, or that re-enters a caller
        on this agent waiting for it (reach.callpath): its outcome, else None."""
        err = hop_limit(env, spec.max_hops or self.max_hops, self.agent_id)
        if err is not None:
            return oc.refused_call(err)
        cycle = find_loop(env.path, env.capability, self.agent_id)
        if cycle is not None:
            return oc.refused_call(loop_error(cycle, env.capability, self.agent_id))
        return None

    async def access(self, env: Envelope, ctx: Context) -> Outcome | None:
        """The ``forbidden`` outcome of a message its verified signer may not send, else
        None."""
        cap = env.capability
        operator = await self.rules.current(self.redis, self.keys)
        policy = Policy(self.declared.get(cap, _PUBLIC), operator.get(cap, _NO_RULES))
        if not policy.needs_signer:
            return None
        why = decide(cap, policy, self._verified(env, ctx))
        if why is None:
            return None
        if self._logged.take():
            log.warning("refused msg %s (%s, kid %r): %s", env.msg_id[:64], cap, env.kid[:64], why)
        return Outcome(Status.DEAD, DeadReason.FORBIDDEN, why, "Forbidden")

    def _verified(self, env: Envelope, ctx: Context) -> Caller | None:
        signing = worker_signing(self.keys.namespace, self.agent_id)
        if signing is None or signing.keys.check_envelope(env) is not None:
            ctx._sender = None
            return None
        ctx._sender = signing.keys.sender(env)
        return caller_of(signing.keys, identity=env.kid)

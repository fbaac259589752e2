"""Delivery: route a built envelope to an agent and add it to that agent's inbox.

A :class:`~reach.client.Client` owns one :class:`Delivery` while it is started, and its
``deliver``, ``send_many`` and ``request_many`` go through it: the pick (eligibility, then
the policy, see :func:`policy_for`) over the registry view, then the inbox write through
the script layer (:mod:`reach.scripts.inbox`), one message at a time or a batch in one
pipeline. The part knows nothing of the client: it is given the view, the router and the
connection it uses, and it is called, never calls back.

Single deliveries coalesce (:class:`reach._coalesce.Coalescer`, standalone Redis): the
messages of concurrent ``send``/``request`` calls go out together, one ``send.lua`` call
of the batch form per agent, while a lone call waits for nothing.

Every message is also claimed at send for the runtime it is routed to (the
``agent_id/instance_id`` of the view's record; standalone Redis, a key's first send):
that runtime then starts its handler without a claim round trip (``lua/send.lua`` and
``lua/start.lua`` give the contract; docs/operations.md "Claiming at send").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypedDict

import anyio
from redis import exceptions as rexc

from .. import _reroute, logs, metrics
from .._autopipe import AutoPipeline
from .._versions import Versions
from ..callpath import Gate
from ..connection import redact, unreachable
from ..envelope import Envelope, encode, now_ms
from ..errors import DeadlineExceeded, NoAgentAvailable, Overloaded, ReachError, RedisFull
from ..keys import Keys
from ..outcomes import Unavailable
from ..quotas import MAX_TAKE, NO_QUOTAS, QuotaCache, Quotas, SendBucket, take_call
from ..registry import AgentInfo, unknown_capability
from ..routing import Router
from ..routing.split import Split
from ..scripts import inbox
from ..signing import Signer
from ..tasks import TASK_TTL_MS
from ..view import RegistryView
from .coalesce import Coalescer

# Policies an agent may advertise for its capability (``metadata={"policies": {cap: p}}``):
# 'direct' and 'broadcast' need a target or many agents, and anything else is unknown.
ADVERTISABLE = frozenset({"weighted_rr", "least_conn", "consistent_hash"})
# A request waiting for an agent on probation picks again at least this often, should an
# event be missed (the view re-reads what is stale when asked).
PROBATION_RECHECK_S = 1.0


def policy_for(env: Envelope, candidates: list[AgentInfo], default_policy: str) -> str:
    """Per call, else what the capability's agents advertise, else ``default_policy``."""
    if env.policy and env.policy != "broadcast":
        return env.policy
    if env.target:
        return "direct"
    for a in candidates:
        adv = a.metadata.get("policies")
        if isinstance(adv, dict) and env.capability in adv:
            policy = adv[env.capability]
            if policy not in ADVERTISABLE:
                # One agent's metadata must not make every send of the capability fail.
                continue
            if policy == "consistent_hash" and not env.session_id:
                break  # no session to hash: the client default applies
            return str(policy)
    if default_policy == "consistent_hash" and not env.session_id:
        return "weighted_rr"
    return default_policy


def seal(env: Envelope, signer: Signer | None, *, tracing: bool, again: bool = False) -> None:
    """The last step before ``env`` is encoded: the trace headers (``tracing``), then the
    signature (``signer``: reach.signing).

    ``again``: a message accepted once that is only placed again (a retry, a parked
    message, an evicted agent's inbox: the sweeper places them through its runtime's
    Client). It goes exactly as it is: never signed here, whether it is signed or not.
    Signatures travel, they are not re-made: whatever reads it from the delayed set, a
    parked stream or an inbox (anyone holding the namespace's keys may have written it
    there) must not sign it for its writer; the agent checks the sender's own signature,
    which covers none of the fields re-placing changes (reach.signing).

    Otherwise (a message this Client sends) an envelope signed already that verifies with
    ``signer`` (or there is none to check it with) goes as it is: its headers are covered
    by that signature, so no trace header is written into them. Any other is signed.
    """
    if again:
        return
    if env.sig and (signer is None or signer.check_envelope(env) is None):
        return
    if tracing:
        logs.inject(env.headers)
    if signer is not None:
        signer.sign_envelope(env)


class Delivery:
    """Route envelopes over ``view`` with ``router`` and add them to the chosen agents'
    inboxes through ``commands`` (keys of ``keys``). ``redis_url`` is named in the error
    when Redis is unreachable; ``default_policy`` applies when neither the call nor the
    capability's agents choose one."""

    def __init__(
        self,
        *,
        view: RegistryView,
        router: Router,
        commands: AutoPipeline,
        keys: Keys,
        redis_url: str,
        default_policy: str,
        signer: Signer | None = None,
        identity: str = "",
        control: AutoPipeline | None = None,
        control_url: str = "",
    ) -> None:
        self.view = view
        self.identity = identity  # whose send-rate quota the sends count against
        # Quotas and their buckets are the control plane's (reach.planes): ``commands``
        # unless it is on a Redis of its own.
        self.control = commands if control is None else control
        self.control_url = control_url or redis_url  # named when the registry is away
        self.quota_cache = QuotaCache(keys)
        self.bucket = SendBucket(self.control, keys, identity)
        self.signer = signer  # signs each envelope as it is encoded (None: not signed)
        self.router = router
        self.commands = commands
        self.keys = keys
        self.redis_url = redis_url
        self.default_policy = default_policy
        self.coalescer = None if commands.cluster else Coalescer(commands, keys, ttl_ms=TASK_TTL_MS)
        # (read at, the view's version then, live agents, capabilities)
        self._figures: tuple[float, int, int, list[str]] | None = None
        self.waits_for_probation = True  # see _wait_for_probation
        self.reroute = _reroute.Rerouter(
            router=router, commands=commands, keys=keys, cluster=commands.cluster, pick=self.repick
        )
        self.versions = Versions(
            view=view, router=router, commands=commands, keys=keys, control=self.control
        )

    async def quotas(self) -> Quotas:
        """The namespace's quotas (reach.quotas), as last read (re-read every second)."""
        self.versions.cache.prefetch(self.control)  # the splits' read goes with this one
        try:
            return await self.quota_cache.get(self.control)
        except (rexc.ConnectionError, rexc.TimeoutError) as e:
            raise unreachable(self.control_url, e) from e

    async def take_sends(self, env: Envelope, q: Quotas, n: int) -> tuple[int, Overloaded | None]:
        """Take ``n`` sends from this caller's send-rate bucket: how many were granted and,
        when not all, the error of those refused."""
        if q.send_rate is None:
            return n, None
        granted, wait_us = 0, 0
        try:
            if n == 1:  # concurrent single sends: one script call per loop turn
                taken = await self.bucket.take(q.send_rate)
                granted, wait_us = taken.granted, taken.wait_us
            while 1 < n and granted < n:  # a batch: 100,000 a call at most
                ask = min(n - granted, MAX_TAKE)
                call = take_call(self.keys, self.identity, q.send_rate, ask)
                taken = await call.run(self.control)
                granted, wait_us = granted + taken.granted, taken.wait_us
                if taken.granted < ask:
                    break
        except (rexc.ConnectionError, rexc.TimeoutError) as e:
            raise unreachable(self.control_url, e) from e
        except rexc.OutOfMemoryError as e:
            raise redis_full(self.redis_url, env.capability, e) from e
        if granted >= n:
            return n, None
        return granted, over_rate(env, self.identity, q, wait_us)

    async def deliver(
        self,
        env: Envelope,
        *,
        where: Mapping[str, Any] | None = None,
        track: bool = False,
        quota: bool = True,
        rated: bool = False,
        gate: Gate | None = None,
        refused: Mapping[str, tuple[int, int]] | None = None,
    ) -> str:
        """Route ``env`` and add it to the chosen agent's inbox; returns the agent id
        (``Client.deliver`` documents it). ``quota=False``: a message accepted once, placed
        again: the namespace's quotas do not apply, and it goes as it is, never signed
        here (:func:`seal`); ``rated``: its send was taken from the send rate already.
        ``gate``: asked about each agent the policy proposes (a handler's call,
        :class:`reach.callpath.CallGate`); an agent it refuses is passed over, and when
        only refused agents are left, the error it gave is raised (nothing was sent).
        ``refused``: agents whose bound refused it already (id -> (inbox depth, bound)),
        passed over as those refused here are (:mod:`reach._sending.plain`)."""
        if env.deadline_ms and env.deadline_ms <= now_ms():
            raise DeadlineExceeded(f"Deadline of {env.capability!r} passed before sending.")
        q = await self.quotas() if quota else NO_QUOTAS
        if not rated and q.send_rate is not None:  # no rate: nothing to take
            _, err = await self.take_sends(env, q, 1)
            if err is not None:
                raise err
        try:  # the capability's split between versions, the session's pinned version
            split, pinned = await self.versions.route(env, where)
        except (rexc.ConnectionError, rexc.TimeoutError) as e:
            raise unreachable(self.redis_url, e) from e
        refused = dict(refused or {})  # agent id -> (inbox depth, its bound)
        gated: dict[str, Exception] | None = None  # agent id -> why the gate refused it
        rechecked = False
        tracing = logs.tracing()  # asked once: no span is entered per message without it
        while True:
            try:  # a stale registry view is re-read here, from Redis
                passed = refused if gated is None else {**refused, **gated}
                if tracing:
                    with logs.span("reach.route", attributes={"reach.capability": env.capability}):
                        agent = await self._pick(env, where, passed, split, pinned)
                else:
                    agent = await self._pick(env, where, passed, split, pinned)
            except (rexc.ConnectionError, rexc.TimeoutError) as e:
                raise unreachable(self.control_url, e) from e
            except NoAgentAvailable as e:
                if not rechecked and await self._recheck_target(env, e):
                    rechecked = True
                    continue
                if track and not refused and await self._wait_for_probation(env, e):
                    continue
                if refused:
                    raise overloaded(env, refused, e, max_inbox=q.max_inbox) from e
                raise
            if gated is not None and agent.agent_id in gated:  # only those are left
                raise gated[agent.agent_id]
            if agent.agent_id in refused:  # only refusing agents are left
                raise overloaded(env, refused, None, max_inbox=q.max_inbox)
            if gate is not None:
                why = gate(agent.agent_id)
                if why is not None:
                    gated = gated or {}
                    gated[agent.agent_id] = why
                    continue
            if track:
                self.router.inflight.add(agent.agent_id)
            else:  # no reply will say when it is done: counted until the agent reports
                self.router.capacity.sent(agent)
            bound = inbox_bound(agent, q.max_inbox)
            if tracing:
                with logs.span("reach.deliver", kind="producer"):
                    seal(env, self.signer, tracing=True, again=not quota)
                    sent = await self._add(env, agent, encode(env), track=track, bound=bound)
            else:
                if self.signer is not None or env.sig:
                    seal(env, self.signer, tracing=False, again=not quota)
                sent = await self._add(env, agent, encode(env), track=track, bound=bound)
            if not sent.refused:
                self.reroute.placed(env, agent, sent.entry_id, tracked=track, where=where)
                break
            refused[agent.agent_id] = (sent.depth, bound)
        metrics.message_sent(env.capability, env.priority)
        return agent.agent_id

    def _on_probation(self, env: Envelope, e: NoAgentAvailable, agents: list[AgentInfo]) -> bool:
        """Was ``env`` refused only because the agents that could take it are on
        probation (their lease ran out, e.g. while Redis was away), with time left?"""
        if not self.waits_for_probation or not env.deadline_ms or env.deadline_ms <= now_ms():
            return False
        if env.target:
            return e.reason == Unavailable.TARGET_UNAVAILABLE and any(
                a.agent_id == env.target and a.state == "probation" for a in agents
            )
        return e.reason == Unavailable.NO_AGENT and any(a.state == "probation" for a in agents)

    async def _wait_for_probation(self, env: Envelope, e: NoAgentAvailable) -> bool:
        """An agent on probation is not gone: its next heartbeat makes it active again.
        When ``env`` was refused for that alone and has deadline budget, wait for the
        view to change (an event: the agent recovered, another registered), at most
        :data:`PROBATION_RECHECK_S` at a time and never past the deadline; True: pick
        again. False: refuse now."""
        candidates, _ = await self.view.candidates(env.capability)
        if not self._on_probation(env, e, candidates):
            return False
        left_s = (env.deadline_ms - now_ms()) / 1000.0
        await self.view.wait_changed(min(left_s, PROBATION_RECHECK_S))
        return True

    async def _recheck_target(self, env: Envelope, e: NoAgentAvailable) -> bool:
        """A targeted send was refused: when the view's record of the target may be behind
        (it has none, or one that is not routable), re-read the target from Redis once.
        True when it was re-read (pick again). A worker that registered or became ready a
        moment ago is in Redis before its events reach the view."""
        if not env.target or e.reason != Unavailable.TARGET_UNAVAILABLE:
            return False
        candidates, _ = await self.view.candidates(env.capability)
        known = next((a for a in candidates if a.agent_id == env.target), None)
        if known is not None and known.routable:
            return False  # refused for what this client knows best (its breaker, a probe)
        try:
            await self.view.recheck(env.target)
        except (rexc.ConnectionError, rexc.TimeoutError) as err:
            raise unreachable(self.control_url, err) from err
        return True

    async def _pick(
        self,
        env: Envelope,
        where: Mapping[str, Any] | None,
        refused: Mapping[str, Any],
        split: Split | None = None,
        pinned: str | None = None,
    ) -> AgentInfo:
        candidates, version = await self.view.candidates(env.capability)
        avoid: str | set[str] = env.avoid
        if refused:
            avoid = {*refused, env.avoid} - {""}
        try:
            return self.router.pick(
                env.capability,
                candidates,
                policy=policy_for(env, candidates, self.default_policy),
                session_id=env.session_id or None,
                target=env.target or None,
                where=where,
                version=version,
                avoid=avoid,
                cost=env.cost,
                split=split,
                app_version=pinned,
            )
        except NoAgentAvailable as e:
            raise await self.counted(e, candidates) from None

    async def counted(
        self, e: NoAgentAvailable, candidates: Sequence[AgentInfo]
    ) -> NoAgentAvailable:
        """``e``, or, when it says no agent declares the capability (``candidates``, the
        capability's agents, empty), the same error with the registry's figures: the
        router knew of no agent to count, and so of no capability to suggest."""
        if e.reason != Unavailable.NO_AGENT or candidates:
            return e
        # Reused for a second while the view saw no change: a caller looping on a misspelt
        # capability must not make Redis count the registry (up to 1,000 records) per send.
        # An empty registry (cheap to count) is never reused: agents may be starting.
        f, now, version = self._figures, time.monotonic(), self.view.version
        if f is None or now - f[0] > FIGURES_TTL_S or f[1] != version or not f[2]:
            try:
                live, caps = await self.view.registry.figures()
            except (rexc.RedisError, OSError):  # the figures are a courtesy: keep the error
                return e
            self._figures = f = (now, version, live, caps)
        return unknown_capability(e.capability, live_agents=f[2], capabilities=f[3])

    async def _add(
        self, env: Envelope, agent: AgentInfo, data: bytes, *, track: bool, bound: int
    ) -> inbox.Sent:
        """Add the entry (and its pending record): its entry id, or the depth of the
        agent's inbox that refused it (at its ``bound``). The script layer
        (:func:`reach.scripts.inbox.send`) chooses the standalone or Cluster form."""
        agent_id = agent.agent_id
        try:
            m = inbox.Message.of(env, data)
            if self.coalescer is not None:
                sent = await self.coalescer.send(
                    inbox.Delivery(m, agent_id, env.priority, bound, *claim_at_send(agent, env))
                )
            else:
                sent = await inbox.send(
                    self.commands,
                    self.keys,
                    m,
                    cluster=True,
                    agent_id=agent_id,
                    priority=env.priority,
                    ttl_ms=TASK_TTL_MS,
                    max_queue=bound,
                )
        except BaseException as e:
            if track:
                self.router.inflight.done(agent_id)
            if not isinstance(e, Exception):
                raise
            err = await self.add_failed(env, agent_id, e)
            if err is e:
                raise
            raise err from e
        if sent.refused and track:
            self.router.inflight.done(agent_id)
        return sent

    async def add_failed(self, env: Envelope, agent_id: str, e: Exception) -> Exception:
        """The error to raise for ``e``, met adding ``env`` to ``agent_id``'s inbox: Redis
        unreachable or full said so, anything else as it is (a refused script call first
        makes the view re-read the agent: its record may have changed)."""
        if isinstance(e, (rexc.ConnectionError, rexc.TimeoutError)):
            return unreachable(self.redis_url, e)
        if isinstance(e, rexc.OutOfMemoryError):
            return redis_full(self.redis_url, env.capability, e)
        if isinstance(e, rexc.ResponseError):
            await self.view.recheck(agent_id)
        return e

    async def repick(
        self, env: Envelope, where: Mapping[str, Any] | None, avoid: set[str]
    ) -> AgentInfo | None:
        """Another agent for ``env`` (a move: :mod:`reach._reroute`), passing over
        ``avoid``: one with a free slot by this client's estimate, else None."""
        candidates, version = await self.view.candidates(env.capability)
        policy = policy_for(env, candidates, self.default_policy)
        if policy == "direct":
            return None
        split, pinned = await self.versions.route(env, where)  # a move keeps to the split
        a = self.router.pick(
            env.capability,
            candidates,
            policy=policy,
            session_id=env.session_id or None,
            where=where,
            version=version,
            avoid=avoid,
            cost=env.cost,
            split=split,
            app_version=pinned,
        )
        if a.agent_id in avoid or self.router.capacity.full(a):
            return None
        return a

    def _items(
        self, envs: Sequence[Envelope], picked: Sequence[tuple[int, AgentInfo]], max_inbox: int
    ) -> list[inbox.Delivery]:
        """The inbox writes of ``picked`` (index in ``envs``, the agent it goes to): each
        envelope sealed and encoded, with its agent's bound and (standalone) its claim."""
        items: list[inbox.Delivery] = []
        tracing = logs.tracing()  # asked once for the batch (it costs µs a call)
        signer = self.signer
        cluster = self.commands.cluster
        # Per agent: its bound and (no deadline) its claim, the same for each message.
        per_agent: dict[str, tuple[int, tuple[str, int] | tuple[()]]] = {}
        Delivery, Message = inbox.Delivery, inbox.Message
        now = now_ms()  # the claims' leases judged by one clock read for the batch
        # A deadline this far off leaves the claim its whole lease: the same for every one.
        far = now + CLAIM_AT_SEND_LEASE_MS
        for i, agent in picked:
            env = envs[i]
            if tracing or signer is not None or env.sig:
                seal(env, signer, tracing=tracing)
            got = per_agent.get(agent.agent_id)
            if got is None:
                claim = () if cluster else claim_at_send(agent, env, now)
                got = (inbox_bound(agent, max_inbox), claim)
                if not env.deadline_ms or env.deadline_ms >= far:
                    per_agent[agent.agent_id] = got
            elif env.deadline_ms and env.deadline_ms < far and not cluster:
                got = (got[0], claim_at_send(agent, env, now))
            # inbox.Message.of(env, encode(env)), inlined: a frame less per message
            m = Message(
                encode(env), env.capability, env.attempt, env.msg_id, env.key, env.idempotency_key
            )
            items.append(Delivery(m, agent.agent_id, env.priority, got[0], *got[1]))
        return items

    async def _send_chunked(
        self, envs: Sequence[Envelope], picked: Sequence[tuple[int, AgentInfo]], max_inbox: int
    ) -> list[inbox.Sent | Exception]:
        """:func:`reach.scripts.inbox.send_many` of ``picked`` (standalone Redis, one
        multiplexed connection), :data:`SEND_CHUNK` messages at a time: each chunk's calls
        are handed to the connection's writer, which sends them at the next turn of the
        event loop, and the next chunk is encoded while Redis runs them. One connection
        answers in order, so the messages reach the inboxes in order, as in one pipeline."""
        commands = self.commands
        plans: list[tuple[inbox.Batches, list[asyncio.Future[Any]]]] = []
        try:
            for start in range(0, len(picked), SEND_CHUNK):
                items = self._items(envs, picked[start : start + SEND_CHUNK], max_inbox)
                plan = inbox.Batches.of(self.keys, items, ttl_ms=TASK_TTL_MS)
                plans.append((plan, [commands.submit(*c.op()) for c in plan.calls]))
                if start + SEND_CHUNK < len(picked):
                    await asyncio.sleep(0)  # the writer sends this chunk
            sent: list[inbox.Sent | Exception] = []
            for plan, futs in plans:
                replies: list[Any] = []
                for call, fut in zip(plan.calls, futs, strict=True):
                    try:
                        replies.append(call.decode(await fut))
                    except Exception as e:  # noqa: BLE001 - this call's error, in its place
                        replies.append(e)
                sent += await plan.finish(commands, replies)
        except BaseException:
            for _, futs in plans:  # cancelled: what is not written yet is not sent
                for fut in futs:
                    if not fut.done():
                        fut.cancel()
                    elif not fut.cancelled():
                        fut.exception()  # retrieved: no "never retrieved" warning
            raise
        return sent

    async def deliver_many(
        self, envs: Sequence[Envelope], where: Mapping[str, Any] | None, *, track: bool
    ) -> list[str | Exception]:
        """:meth:`deliver` for each of ``envs`` (one capability), the inbox writes of all in
        one pipeline: per envelope the agent id, or the error that stopped it. A message an
        agent refused (its inbox at its bound) is delivered again on its own, as
        :meth:`deliver` does, to another agent if one can take it."""
        if not envs:
            return []
        cap = envs[0].capability
        out: list[str | Exception] = [""] * len(envs)
        try:
            with logs.span("reach.route", attributes={"reach.capability": cap}):
                candidates, version = await self.view.candidates(cap)
                target = envs[0].target
                if target and not any(a.agent_id == target and a.routable for a in candidates):
                    # as deliver() does on a refusal: the view may be behind the registry
                    await self.view.recheck(target)
                    candidates, version = await self.view.candidates(cap)
        except (rexc.ConnectionError, rexc.TimeoutError) as e:
            err = unreachable(self.redis_url, e)
            return [err] * len(envs)
        now = now_ms()
        try:
            q = await self.quotas()
            split = await self.versions.split_of(envs[0])
            pins = await self.versions.pins(list(envs), split, where) if split else {}
            live = [i for i, env in enumerate(envs) if not env.deadline_ms or env.deadline_ms > now]
            granted, over = await self.take_sends(envs[0], q, len(live)) if live else (0, None)
        except ReachError as e:
            return [e] * len(envs)
        except (rexc.ConnectionError, rexc.TimeoutError) as e:
            return [unreachable(self.redis_url, e)] * len(envs)
        if over is not None:  # the sends past the caller's rate: refused, in order
            for i in live[granted:]:
                out[i] = over
        picked: list[tuple[int, AgentInfo]] = []
        unknown: NoAgentAvailable | None = None
        waiting: list[int] = []
        # The same for every message of the batch (its options and the candidates are).
        policy = policy_for(envs[0], candidates, self.default_policy)
        first = envs[0]
        pick_next = self.router.picker(
            cap, candidates, policy=policy, where=where, version=version, **_route_of(first)
        )
        try:
            for i, env in enumerate(envs):
                if env.deadline_ms and env.deadline_ms <= now:
                    out[i] = DeadlineExceeded(f"Deadline of {cap!r} passed before sending.")
                    continue
                if out[i]:  # refused by the send rate
                    continue
                try:
                    if split is not None:  # a version per message (its session's, or drawn)
                        agent = self.router.pick(
                            cap,
                            candidates,
                            policy=policy,
                            where=where,
                            version=version,
                            split=split,
                            app_version=pins.get(env.session_id),
                            **_route_of(env),
                        )
                    elif (
                        env.session_id == first.session_id
                        and env.target == first.target
                        and env.avoid == first.avoid
                        and env.cost == first.cost
                    ):
                        agent = pick_next()
                    else:
                        agent = self.router.pick(
                            cap,
                            candidates,
                            policy=policy,
                            where=where,
                            version=version,
                            **_route_of(env),
                        )
                except NoAgentAvailable as e:
                    if not candidates:  # one registry read for the batch's error
                        if unknown is None:
                            unknown = await self.counted(e, candidates)
                        e = unknown
                    out[i] = e
                    if track and self._on_probation(env, e, candidates):
                        waiting.append(i)  # deliver() waits for the agent, per message
                    continue
                if track:  # counted at the pick, so the next picks see it
                    self.router.inflight.add(agent.agent_id)
                else:
                    self.router.capacity.sent(agent)
                picked.append((i, agent))
            with logs.span("reach.deliver", kind="producer"):
                if self.coalescer is not None and self.commands.multiplexed:
                    sent = await self._send_chunked(envs, picked, q.max_inbox)
                else:
                    sent = await inbox.send_many(
                        self.commands,
                        self.keys,
                        self._items(envs, picked, q.max_inbox),
                        cluster=self.commands.cluster,
                        ttl_ms=TASK_TTL_MS,
                    )
        except BaseException:
            if track:
                for _, agent in picked:
                    self.router.inflight.done(agent.agent_id)
            raise
        again: list[int] = waiting
        recheck: set[str] = set()
        counted: dict[str, int] = {}  # priority -> messages sent
        for (i, agent), x in zip(picked, sent, strict=True):
            if isinstance(x, inbox.Sent) and x.entry_id:  # added (x.refused, inlined)
                out[i] = agent.agent_id
                p = envs[i].priority
                counted[p] = counted.get(p, 0) + 1
                continue
            if track:
                self.router.inflight.done(agent.agent_id)
            if isinstance(x, inbox.Sent):
                again.append(i)  # refused at the agent's bound: another may take it
            elif isinstance(x, (rexc.ConnectionError, rexc.TimeoutError)):
                out[i] = unreachable(self.redis_url, x)
            elif isinstance(x, rexc.OutOfMemoryError):
                full = redis_full(self.redis_url, cap, x)
                full.__cause__ = x
                out[i] = full
            else:
                out[i] = x
                if isinstance(x, rexc.ResponseError):
                    recheck.add(agent.agent_id)
        for p, n in counted.items():
            metrics.messages_sent(cap, p, n)
        for agent_id in sorted(recheck):
            with contextlib.suppress(rexc.RedisError, OSError):
                await self.view.recheck(agent_id)

        async def redeliver(i: int) -> None:
            try:
                out[i] = await self.deliver(envs[i], where=where, track=track, rated=True)
            except Exception as e:  # noqa: BLE001 - this message's error, in its place
                out[i] = e

        if again:
            async with anyio.create_task_group() as tg:
                for i in again:
                    tg.start_soon(redeliver, i)
        return out


def _route_of(env: Envelope) -> _Route:
    """The routing arguments a message carries itself (its session, target, agents to
    avoid, cost), as :meth:`Router.pick` takes them."""
    return {
        "session_id": env.session_id or None,
        "target": env.target or None,
        "avoid": env.avoid,
        "cost": env.cost,
    }


class _Route(TypedDict):
    session_id: str | None
    target: str | None
    avoid: str | Collection[str]
    cost: float


FIGURES_TTL_S = 1.0
"""How long the registry's figures in a no-agent error (live agents, capabilities) are
reused before they are read again."""

SEND_CHUNK = 128
"""``send_many`` on standalone Redis: messages encoded and handed to the connection at a
time, so encoding the next chunk overlaps Redis running this one."""

CLAIM_AT_SEND_LEASE_MS = 60_000
"""The lease of a claim made at send (the runtime's default claim lease): long enough for
the runtime to read the entry and confirm the claim with its own lease (``start.lua``).
One read later than that finds the claim run out and claims as usual."""


def claim_at_send(agent: AgentInfo, env: Envelope, now: int | None = None) -> tuple[str, int]:
    """Whom ``env``, routed to ``agent``, is claimed for at send (``"<agent_id>/<instance_id>"``,
    ``''`` when the record names no instance) and the claim's lease:
    :data:`CLAIM_AT_SEND_LEASE_MS`, or less with a deadline (a second past it, and a second
    at least), as a runtime's claim would be. ``now``: the epoch ms to judge the deadline
    by (a batch reads the clock once), else read here."""
    if not agent.instance_id:
        return "", 0
    lease = CLAIM_AT_SEND_LEASE_MS
    if env.deadline_ms:
        lease = max(1000, min(lease, env.deadline_ms - (now or now_ms()) + 1000))
    return f"{agent.agent_id}/{agent.instance_id}", lease


def redis_full(redis_url: str, capability: str, exc: BaseException) -> RedisFull:
    """The error of a message Redis refused because it is out of memory (``exc``, its
    ``OutOfMemoryError``)."""
    return RedisFull(
        f"{capability!r} was not sent: Redis at {redact(redis_url)} is out of memory ({exc}). "
        "Its used memory is over its maxmemory setting and, with maxmemory-policy "
        "noeviction, it refuses every write; the messages it holds already wait there. "
        "Free memory (reach dlq purge, delete keys you do not need), raise maxmemory "
        "(CONFIG SET maxmemory) or give Redis more memory, then send again."
    )


def inbox_bound(agent: AgentInfo, max_inbox: int) -> int:
    """The bound of ``agent``'s inbox for a new send: the lower of its own ``max_queue``
    and the namespace's ``max_inbox`` quota (0 for either: none)."""
    own = agent.max_queue
    if own > 0 and max_inbox > 0:
        return min(own, max_inbox)
    return own if own > 0 else max(max_inbox, 0)


def over_rate(env: Envelope, identity: str, q: Quotas, wait_us: int) -> Overloaded:
    """The error of a send over the caller's send-rate quota."""
    rate = q.send_rate
    wait_s = wait_us / 1e6
    return Overloaded(
        f"{env.capability!r} was not sent: caller {identity!r} is over the namespace's "
        f"send rate, the limit (reach quota set --send-rate {rate}) of sends per caller "
        f"identity. Slow down: the next send fits in {wait_s:.3g} s; or ask the operator "
        "to raise the quota (reach quota show).",
        capability=env.capability,
        reason=Unavailable.OVERLOADED,
        limit="send_rate",
        retry_after_s=wait_s,
    )


def overloaded(
    env: Envelope,
    refused: Mapping[str, tuple[int, int]],
    cause: NoAgentAvailable | None,
    *,
    max_inbox: int = 0,
) -> Overloaded:
    """The error of a message every eligible agent refused (``refused``: agent id ->
    (inbox depth, its bound)); ``max_inbox``: the namespace's quota, named when it is the
    bound that refused."""
    rest = f" No other agent could take it: {cause}" if cause is not None else ""
    if max_inbox and any(b == max_inbox for _, b in refused.values()):
        agents = ", ".join(list(refused)[:5]) + (
            f" and {len(refused) - 5} more" if len(refused) > 5 else ""
        )
        depth = max(d for d, _ in refused.values())
        whose = (
            f"the inbox of agent {agents} holds {depth} messages"
            if len(refused) == 1
            else f"the inboxes of agents {agents} hold up to {depth} messages"
        )
        return Overloaded(
            f"{env.capability!r} was not sent: {whose}, the namespace's limit (reach quota set --max-inbox {max_inbox}) of "
            f"messages queued or being handled per agent.{rest} Back off and retry later, "
            "start more agents of the capability, or ask the operator to raise the quota "
            "(reach quota show).",
            capability=env.capability,
            reason=Unavailable.OVERLOADED,
            limit="max_inbox",
        )
    shown = ", ".join(f"{a} {d}/{m}" for a, (d, m) in list(refused.items())[:5])
    more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
    return Overloaded(
        f"{env.capability!r} was not sent: the inbox of {len(refused)} agent(s) is at its "
        f"bound (queued + being handled / max_queue: {shown}{more}).{rest} Back off "
        "and retry later.",
        capability=env.capability,
        reason=Unavailable.OVERLOADED,
    )

"""The caller side: send messages to a capability and get results back.

A :class:`Client` picks a live agent of the capability (eligibility, then policy), adds
the envelope to that agent's inbox stream, and (for :meth:`Client.request`) waits on its
own reply stream, which one background task reads for every waiting call.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Self, TypedDict, Unpack

import anyio
import msgspec

from . import _hedge, _later, _reroute, envelope, metrics, scheduling
from ._autopipe import AutoPipeline
from ._batches import ManyCalls
from ._buffer import (
    DEFAULT_CLOSE_WAIT_S,
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_MESSAGES,
    Held,
    PendingLocal,
    SendBuffer,
)
from ._cancel import CancelResult, cancel_message
from ._control import ControlPlane
from ._defaults import (
    DEFAULT_FALLBACK_ON,
    DEFAULT_SEND_TIMEOUT_S,
    AdvertisedTimeouts,
    check_send_timeout,
    fallback_kinds,
)
from ._replies import ReplyFigures, ReplyReader, outcome_of
from ._sending import plain
from ._sending.delivery import ADVERTISABLE as ADVERTISABLE  # noqa: PLC0414 (re-exported)
from ._sending.delivery import Delivery, policy_for
from ._streaming import Stream
from ._task_calls import TaskCalls
from .authz import Prechecks
from .breaker import Breakers
from .callpath import DEFAULT_MAX_HOPS, Gate, check_max_hops
from .connection import DEFAULT_MAX_CONNECTIONS, AnyRedis, connect, redact
from .doctor import warn_once
from .envelope import Envelope, Reply, encode_payload, new_id, now_ms
from .errors import (
    ConfigError,
    ConnectionsExhausted,
    DeadlineExceeded,
    NoAgentAvailable,
    NotStarted,
    PayloadTooLarge,
    RedisUnavailable,
)
from .keys import PRIORITIES, Keys
from .limits import LimitsCache, check_rate_limit
from .outcomes import RequestOutcome, Status, blames_agent
from .quotas import identity_of
from .registry import AgentInfo, Registry, normalize_capability
from .resume import Resumed
from .routing import POLICIES, Router
from .signing import SecretOption, Signer, make_signer
from .tasks import TaskStatus, get_status
from .tenants import TenantClients, TenantsOption, by_tenant, by_tenant_lazily
from .view import RegistryView
from .watch import TaskChange, watch_task

log = logging.getLogger("reach.client")

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_PAYLOAD = 1024 * 1024
# Replies no call waits for (yet): kept for result() -- e.g. a client restarted with the
# same client_id reads the replies sent while it was away -- but only this many, this long.
DEFAULT_MAX_UNCLAIMED = 10_000
DEFAULT_UNCLAIMED_TTL_S = 600.0


class MessageOptions(TypedDict, total=False):
    """The options of one message, as :meth:`Client.build` takes them (and
    :meth:`Client.request` and :meth:`Client.send` pass them on)."""

    session_id: str | None
    trace_id: str | None
    priority: str
    timeout_s: float | None
    deadline_ms: int | None
    idempotency_key: str | None
    target: str | None
    policy: str | None
    max_attempts: int | None
    headers: Mapping[str, str] | None
    source: str
    cost: float | None
    tenant: str | None  # the tenant map's entry to send to (reach.tenants)


class Client(ManyCalls, ReplyFigures, TaskCalls):
    """Send messages by capability.

    Use as ``async with reach.Client(redis_url=..., namespace=...) as client:``.
    ``client_id`` names the reply stream: a client restarted with the same id still gets
    the replies sent to it while it was away (for 24 h: the worker that publishes a reply
    gives the reply stream the task-record TTL).

    Any number of calls may run at once on one client: the commands they issue in one
    event-loop turn go to Redis as one pipeline (auto-pipelining, see
    :mod:`reach._autopipe`), at most four pipelines in flight, so the client uses about six
    connections (per node on a Cluster) whatever the concurrency: the pipelines' and its
    two blocking reads' (reply stream, registry events). A lone call is sent at the end of
    the current loop turn, never after a timer. ``max_connections`` (64 by default) bounds
    the connection pool beyond that (commands of your own on :attr:`redis`). With
    ``redis=`` the client uses that connection as it is (the setting is unused).

    A reply that no call waits for (a call of an earlier run of this ``client_id``; see
    :meth:`result`) is kept in memory for :meth:`result` for ``unclaimed_reply_ttl_s``
    (600 s) and at most ``max_unclaimed_replies`` (10,000) of them, oldest dropped first;
    a dropped one is deleted from the reply stream, and :meth:`result` still finds the
    outcome in the message's task record.

    ``secret`` (else ``REACH_SECRET``; a list or comma-separated for a key rollover: the
    first signs, any verifies) signs every message sent, and then a reply is taken only
    when signed by an agent holding the secret: an unsigned or forged one is dropped and
    counted (:attr:`forged_replies`). ``identity_file`` and ``trusted_keys_file`` (else
    ``REACH_IDENTITY_FILE`` and ``REACH_TRUSTED_KEYS_FILE``) sign with this caller's own
    Ed25519 key instead and take replies signed by a trusted identity. See
    docs/security.md, *Signed envelopes*.

    When Redis is unreachable, :meth:`send`, :meth:`request` and :meth:`call` hold the
    message in a local buffer, in order, sent when Redis is back (bounded by
    ``buffer_max_messages``, ``buffer_max_bytes`` and ``buffer_max_age_s``; beyond them
    :class:`~reach.errors.RedisUnavailable`; closing waits ``buffer_close_wait_s``):
    docs/concepts.md, *Buffering through outages*. ``cancel_on_abort`` (on): a
    :meth:`request` whose own task is cancelled cancels its message too (a reach deadline
    that passes does not: the worker ends the message then itself).
    ``max_hops`` (16): how deep ``ctx.client`` calls may go (docs/concepts.md, *Call graphs*).
    Without a deadline a request gets its capability's advertised timeout, else
    ``default_timeout_s``; a send ``default_send_timeout_s``. ``fallback(capability, payload)``
    answers the failures ``fallback_on`` names (:mod:`reach._defaults`; default: no agent).
    ``tenants`` (:class:`~reach.Tenants`, ``{id: (redis_url, namespace)}``, else reach.toml's):
    ``tenant="acme"`` sends on that tenant's Redis and namespace (:mod:`reach.tenants`).
    """

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        namespace: str = "default",
        client_id: str | None = None,
        redis: AnyRedis | None = None,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        default_policy: str = "weighted_rr",
        max_attempts: int = 3,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        fallback: Callable[[str, Any], Any] | None = None,
        fallback_on: Iterable[str] = DEFAULT_FALLBACK_ON,
        default_send_timeout_s: float | None = DEFAULT_SEND_TIMEOUT_S,
        slow_start_s: float = 10.0,
        hash_load_factor: float | None = None,
        breakers: Breakers | None = None,
        view_refresh_s: float = 2.0,
        max_staleness_s: float = 5.0,
        rng: random.Random | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_unclaimed_replies: int = DEFAULT_MAX_UNCLAIMED,
        unclaimed_reply_ttl_s: float = DEFAULT_UNCLAIMED_TTL_S,
        secret: SecretOption = None,
        identity_file: str | None = None,
        trusted_keys_file: str | None = None,
        buffer_max_messages: int = DEFAULT_MAX_MESSAGES,
        buffer_max_bytes: int = DEFAULT_MAX_BYTES,
        buffer_max_age_s: float = DEFAULT_MAX_AGE_S,
        buffer_close_wait_s: float = DEFAULT_CLOSE_WAIT_S,
        cancel_on_abort: bool = True,
        max_hops: int = DEFAULT_MAX_HOPS,
        tenants: TenantsOption = None,
        registry_url: str | None = None,
        registry_redis: AnyRedis | None = None,
    ) -> None:
        # first: locals() is the options then, which a tenant's inner client is made with
        self.tenants = TenantClients(self, tenants, locals())
        if default_policy not in POLICIES:
            raise ConfigError(
                f"Unknown default_policy {default_policy!r}: use one of {', '.join(POLICIES)}."
            )
        if max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1 (got {max_connections}).")
        if max_unclaimed_replies < 0 or unclaimed_reply_ttl_s < 0:
            raise ConfigError("max_unclaimed_replies and unclaimed_reply_ttl_s must be >= 0.")
        if redis is None:  # redis_url=, REACH_REDIS_URL, reach.toml, else the default tenant's
            redis_url, namespace = self.tenants.own(redis_url, namespace)
        self.redis_url = redis_url or ""
        self._control = ControlPlane(registry_url, registry_redis, self.redis_url, redis is None)
        self.namespace = namespace
        self.keys = Keys(namespace)
        self.client_id = client_id or f"c-{new_id()}"
        self.signer: Signer | None = make_signer(
            namespace, secret, identity_file, trusted_keys_file
        )
        self.default_timeout_s = default_timeout_s
        self.max_hops = check_max_hops(max_hops, "Client")
        self.default_send_timeout_s = check_send_timeout(default_send_timeout_s)
        self._timeouts = AdvertisedTimeouts()
        self._prechecks = Prechecks()  # reach.authz: who may call what, as published
        # A request() whose own task is cancelled (not one whose reach deadline passed)
        # cancels its message too (see cancel()).
        self.cancel_on_abort = cancel_on_abort
        self.default_policy = default_policy
        self.max_attempts = max_attempts
        self.max_payload_bytes = max_payload_bytes
        self.fallback = fallback
        self.fallback_on = fallback_kinds(fallback_on)
        self.breakers = breakers if breakers is not None else Breakers()
        self.breakers.listeners.append(self._on_breaker_change)
        self.router = Router(
            slow_start_s=slow_start_s,
            hash_load_factor=hash_load_factor,
            breakers=self.breakers,
            rng=rng,
        )
        self._view_opts: dict[str, Any] = {"refresh_s": view_refresh_s}
        self._view_opts["max_staleness_s"] = max_staleness_s
        self._view: RegistryView | None = None
        self._limits = LimitsCache()  # read only by calls with on_rate_limit="raise"
        self._redis = redis
        self._auto: AutoPipeline | None = None
        self._own_redis = redis is None
        self._registry: Registry | None = None
        self._sender: Delivery | None = None  # made from the view and connection when used
        self.max_connections = max_connections
        self._tg: anyio.abc.TaskGroup | None = None
        self._reader = ReplyReader(
            self.keys.replies(self.client_id),
            client_id=self.client_id,
            max_unclaimed=max_unclaimed_replies,
            unclaimed_ttl_s=unclaimed_reply_ttl_s,
            verifier=self.signer,
            on_drop=metrics.client_reply_dropped,
        )
        self.buffer_close_wait_s = buffer_close_wait_s
        self._buffer = SendBuffer(
            self._deliver_held,
            max_messages=buffer_max_messages,
            max_bytes=buffer_max_bytes,
            max_age_s=buffer_max_age_s,
            name=f"client {self.client_id}",
            redis_url=self._control.label(redact(self.redis_url)),
        )
        # The reader's state under the names it had here (tests look at them).
        self._events, self._replies = self._reader.events, self._reader.replies
        self._unclaimed, self._outage = self._reader.unclaimed, self._reader.outage

    # -- lifecycle --------------------------------------------------------------------
    @property
    def redis(self) -> AnyRedis:
        if self._redis is None:
            raise NotStarted("Client is not started: use `async with reach.Client(...)`.")
        return self._redis

    @property
    def commands(self) -> AutoPipeline:
        """The auto-pipelined client every command of this client goes through (the
        blocking reads pass through it to :attr:`redis`). A Client given an auto-pipelined
        client as ``redis=`` (a worker's agents share their process's) uses that one: its
        commands join the same batches and connection."""
        if self._auto is None:
            r = self.redis
            self._auto = r if isinstance(r, AutoPipeline) else AutoPipeline(r)
        return self._auto

    @property
    def control(self) -> AutoPipeline:
        """The control plane's commands: :attr:`commands` unless ``registry_url`` is set."""
        return self._control.commands(self.commands)

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = Registry(self.control, self.namespace)
        return self._registry

    @property
    def view(self) -> RegistryView:
        """The local registry view routing reads (kept fresh in the background)."""
        if self._view is None:
            self._view = RegistryView(
                self.registry,
                on_gone=self._gone,
                name=f"client {self.client_id}: registry view",
                **self._view_opts,
            )
        return self._view

    def _gone(self, agent_id: str) -> None:
        """An agent left the registry: what this client kept about it goes too."""
        self.breakers.forget(agent_id)
        self.router.capacity.forget(agent_id)

    @property
    def _delivery(self) -> Delivery:
        """The part that routes and writes to inboxes (made at first use, from the view and
        the connection; made again after a restart)."""
        if self._sender is None:
            self._sender = Delivery(
                view=self.view,
                router=self.router,
                commands=self.commands,
                control=self.control,
                control_url=self._control.url or self.redis_url,
                keys=self.keys,
                redis_url=self.redis_url,
                default_policy=self.default_policy,
                signer=self.signer,
                identity=self.identity,
            )
        # A fallback answers at once when nothing is eligible, rather than a request
        # waiting for an agent on probation.
        self._sender.waits_for_probation = not self._falls_back_on("no_agent")
        self._sender.reroute.tg = self._tg
        return self._sender

    @property
    def identity(self) -> str:
        """Whom the namespace's send-rate quota counts this client's sends against: its
        Ed25519 identity when it signs with one, else its ``client_id`` (docs/security.md,
        *Quotas*)."""
        return identity_of(self.signer, self.client_id)

    async def __aenter__(self) -> Self:
        if self._redis is None:
            self._redis = await connect(
                self.redis_url,
                max_connections=self.max_connections,
                client_name=f"reach:{self.namespace}:{self.client_id}",
            )
            await warn_once(self.redis_url, self._redis)  # eviction, persistence: once
            with anyio.move_on_after(3.0):  # deadlines are set on the data Redis's clock
                await Registry(self.commands, self.namespace).measure_clock()
        await self._control.open(self.max_connections, self.namespace, self.client_id)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self.view.attach(self._tg)  # its tasks start at the first routing (lazily)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.tenants.aclose()
        if self._buffer.active:
            await self._buffer.close(self.buffer_close_wait_s)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
            self._tg = None
        if self._reader.answered and self._redis is not None:
            with anyio.CancelScope(shield=True):
                await self._reader.delete_answered()
        if self._auto is not None:
            with anyio.CancelScope(shield=True):
                await self._auto.drain()
            self._auto = None
        self._sender = None  # it holds the connection just closed
        if self._own_redis and self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        await self._control.aclose()  # closes only a connection it opened

    def _ensure_reader(self) -> None:
        if self._reader.started:
            return
        if self._tg is None:
            raise NotStarted("Client is not started: use `async with reach.Client(...)`.")
        self._reader.start(self._tg, redis=self.redis, commands=self.commands)

    # -- routing ----------------------------------------------------------------------
    def invalidate(self) -> None:
        """Make the next pick re-read the registry (e.g. right after agents started)."""
        self.view.invalidate()

    async def eligible(
        self, capability: str, *, where: Mapping[str, Any] | None = None
    ) -> list[AgentInfo]:
        """Agents that may take a message of ``capability`` now; raises NoAgentAvailable."""
        cap = normalize_capability(capability)
        candidates, version = await self.view.candidates(cap)
        try:
            return self.router.pick_many(cap, candidates, where=where, version=version)
        except NoAgentAvailable as e:
            raise await self._delivery.counted(e, candidates) from None

    def _policy_for(self, env: Envelope, candidates: list[AgentInfo]) -> str:
        """Per call, else what the capability's agents advertise, else the client default."""
        return policy_for(env, candidates, self.default_policy)

    # -- sending ----------------------------------------------------------------------
    def build(
        self,
        capability: str,
        payload: Any,
        *,
        session_id: str | None = None,
        trace_id: str | None = None,
        priority: str = "normal",
        timeout_s: float | None = None,
        deadline_ms: int | None = None,
        idempotency_key: str | None = None,
        target: str | None = None,
        policy: str | None = None,
        max_attempts: int | None = None,
        headers: Mapping[str, str] | None = None,
        reply: bool = True,
        source: str = "",
        cost: float | None = None,
        tenant: str | None = None,
    ) -> Envelope:
        """Validate the arguments and build an envelope (nothing is sent)."""
        if tenant is not None:  # the envelope is this client's namespace's (its signer)
            raise ConfigError(
                "build() takes no tenant=: build on `await client.tenants.client(t)`."
            )
        cap = normalize_capability(capability)
        if priority not in PRIORITIES:
            raise ConfigError(f"Unknown priority {priority!r}: use one of {', '.join(PRIORITIES)}.")
        raw = self._encode_payload(payload)
        now = now_ms()
        if timeout_s is not None:
            if timeout_s <= 0:
                raise ConfigError("timeout_s must be > 0.")
            dl = now + int(timeout_s * 1000)
            deadline_ms = min(deadline_ms, dl) if deadline_ms else dl
        msg_id = new_id()
        return Envelope(
            msg_id=msg_id,
            capability=cap,
            payload=raw,
            session_id=session_id or "",
            trace_id=trace_id or msg_id,
            source=source or self.client_id,
            target=target or "",
            policy=policy or "",
            priority=priority,
            deadline_ms=deadline_ms or 0,
            max_attempts=max_attempts or self.max_attempts,
            idempotency_key=idempotency_key or "",
            reply_to=self.client_id if reply else "",
            headers=dict(headers) if headers else {},
            sent_ms=now,
            cost=1.0 if cost is None else envelope.checked_cost(cost),
        )

    def _encode_payload(self, payload: Any) -> msgspec.Raw:
        raw = encode_payload(payload)
        if len(raw) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"Payload is {len(raw)} bytes, over the limit of {self.max_payload_bytes}: "
                "store large data elsewhere and send a reference."
            )
        return raw

    async def deliver(
        self,
        env: Envelope,
        *,
        where: Mapping[str, Any] | None = None,
        track: bool = False,
        quota: bool = True,
        gate: Gate | None = None,
    ) -> str:
        """Route ``env`` and add it to the chosen agent's inbox; returns the agent id.

        ``track=True`` counts it as in flight to that agent (the caller calls
        ``router.inflight.done`` when the reply arrives): counted at the pick itself, so
        concurrent picks see it (least-connections, queue bounds).

        An agent with a ``max_queue`` bound refuses the message, atomically where it is
        added, when its inbox already holds that many (queued + being handled); the
        message then goes to another eligible agent, and when every one refused,
        :class:`~reach.errors.Overloaded` is raised (nothing was sent).

        The namespace's quotas (:mod:`reach.quotas`: a bound on every agent's inbox, a send
        rate per caller identity) apply too, and raise :class:`~reach.errors.Overloaded`
        naming the quota. ``quota=False`` leaves them out, for a message that was accepted
        once and is only placed again (the sweeper's retries and reroutes); it then goes
        as it is, never signed by this client (its sender's signature travels with it).
        ``gate``: see :class:`reach.callpath.CallGate`.
        """
        if quota:  # a first send: refused early when its agents publish that they refuse it
            await self._prechecks.check(self.view, self.signer, env)
        if env.reply_to == self.client_id:
            self._reader.sent(env.msg_id)  # its reply is kept until taken (result())
        return await self._delivery.deliver(env, where=where, track=track, quota=quota, gate=gate)

    @by_tenant
    async def send(
        self,
        capability: str,
        payload: Any,
        *,
        where: Mapping[str, Any] | None = None,
        on_rate_limit: str = "wait",
        reroute_after_s: float | None = None,
        at: scheduling.At | None = None,
        delay_s: float | None = None,
        **opts: Unpack[MessageOptions],
    ) -> str:
        """Send without waiting; returns the msg_id (see :meth:`task` for its outcome).
        ``at`` (an aware datetime or epoch seconds) or ``delay_s``: kept in Redis and sent
        when due (docs/concepts.md, *Scheduled sends*; a due time already past sends now).
        ``opts`` as for :meth:`build`; ``on_rate_limit``, ``reroute_after_s`` as for
        :meth:`request`. With Redis
        unreachable the message is held locally and sent when Redis is back
        (:meth:`pending_local`); :class:`RedisUnavailable` when the buffer is full (see the
        class docstring). With neither ``timeout_s`` nor ``deadline_ms`` the message gets the
        client's ``default_send_timeout_s`` (an hour): not run by then, it expires."""
        due = (
            None
            if at is None and delay_s is None
            else scheduling.due_ms_of(at, delay_s, now=now_ms())
        )
        if due is not None and due > now_ms():
            if reroute_after_s is not None:
                raise ConfigError("reroute_after_s does not apply to a scheduled send.")
            return await scheduling.schedule(self, capability, payload, due, where, opts)
        self._send_deadline(opts)
        env = self.build(capability, payload, reply=False, **opts)
        if on_rate_limit != "wait":  # "wait" takes no look: no call per message
            await self._check_rate_limit(env.capability, on_rate_limit)
        if reroute_after_s is None:  # the common case: no context to enter per message
            await self._deliver_or_hold(env, where, track=False)
            return env.msg_id
        with _reroute.asking(reroute_after_s, env, cluster=self.commands.cluster):
            await self._deliver_or_hold(env, where, track=False)
        return env.msg_id

    async def _check_rate_limit(self, capability: str, on_rate_limit: str) -> None:
        """``on_rate_limit="raise"``: RateLimited when the limit allows no start now."""
        await check_rate_limit(self._limits, self.control, self.keys, capability, on_rate_limit)

    # -- the outage buffer (reach._buffer) --------------------------------------------------
    async def _deliver_or_hold(
        self,
        env: Envelope,
        where: Mapping[str, Any] | None,
        *,
        track: bool,
        gate: Gate | None = None,
    ) -> str | Held:
        """:meth:`deliver`, or, when Redis is unreachable or messages are held already (they
        go first), hold ``env`` in the outage buffer (:class:`RedisUnavailable` when it is
        full or off)."""
        cause: RedisUnavailable | None = None
        if not self._buffer.active:
            try:
                mine = env.reply_to == self.client_id  # a request: its reply comes here
                if where is None and gate is None and (mine or not env.reply_to):
                    d = self._delivery  # a plain send: one look, one pick (reach._sending.plain)
                    p = plain.plan(d, env)
                    if p is not None and self._prechecks.passed(env.capability, p.version):
                        if mine:
                            self._reader.sent(env.msg_id)  # as deliver() notes it
                        return await plain.send(d, env, p, track=track)
                return await self.deliver(env, where=where, track=track, gate=gate)
            except ConnectionsExhausted:
                raise  # Redis answers, slowly: holding more would hide the overload
            except RedisUnavailable as e:
                if not self._buffer.enabled or self._tg is None:
                    raise
                cause = e
        if self._tg is None:
            raise NotStarted("Client is not started: use `async with reach.Client(...)`.")
        return self._buffer.hold(env, where, reply=track, tg=self._tg, cause=cause)

    async def _deliver_held(
        self, envs: list[Envelope], where: Mapping[str, Any] | None
    ) -> list[str | Exception]:
        for env in envs:
            if env.reply_to == self.client_id:
                self._reader.sent(env.msg_id)  # as deliver() notes it
        # Not tracked as in flight at the pick: a request counts from its flush (_call).
        return await self._delivery.deliver_many(envs, where, track=False)

    def pending_local(self) -> list[PendingLocal]:
        """The messages this client holds locally because Redis was unreachable, oldest
        first (each a :class:`~reach.PendingLocal`: msg_id, capability, queued_ms,
        deadline_ms, expires_ms, reply); empty when everything was sent."""
        return self._buffer.pending()

    @by_tenant
    async def request(
        self,
        capability: str,
        payload: Any,
        *,
        where: Mapping[str, Any] | None = None,
        on_rate_limit: str = "wait",
        reroute_after_s: float | None = None,
        hedge_after_s: float | None = None,
        **opts: Unpack[MessageOptions],
    ) -> Any:
        """Send and wait for the handler's result.

        ``opts`` are the message's options, as for :meth:`build` (``session_id``,
        ``priority``, ``timeout_s``, ``deadline_ms``, ``idempotency_key``, ``target``,
        ``policy``, ...); with neither ``timeout_s`` nor ``deadline_ms``, the client's
        ``default_timeout_s`` applies. Raises :class:`RemoteError` (the handler raised),
        :class:`DeadlineExceeded`, :class:`NoAgentAvailable`, or :class:`Rejected`
        (dead-lettered without retry). With Redis unreachable the request waits for it, up
        to its deadline, in the client's outage buffer (:class:`RedisUnavailable` when the
        buffer is full).

        A capability over its rate limit (``reach caps limit``): by default
        (``on_rate_limit="wait"``) the message waits for its turn, up to its deadline; with
        ``on_rate_limit="raise"``, :class:`RateLimited` (its ``retry_after_s`` says when a
        start is allowed again) is raised at once and nothing is sent. ``reroute_after_s``:
        not started within it, the message moves to another agent (docs/routing.md).
        ``hedge_after_s`` (an idempotent capability only): no answer by then, a second copy
        goes to another agent and the first answer wins (:mod:`reach._hedge`).
        """
        if opts.get("timeout_s") is None and opts.get("deadline_ms") is None:
            opts["timeout_s"] = await self.timeout_for(capability)
        env = self.build(capability, payload, **opts)
        hedge = _hedge.check_after(hedge_after_s, env)
        await self._check_rate_limit(env.capability, on_rate_limit)
        if reroute_after_s is None and hedge is None:  # no context to enter per message
            return await self.call(env, where=where)
        with _reroute.asking(reroute_after_s, env, cluster=self.commands.cluster):
            if hedge is not None:
                return await _hedge.request(self, env, where, hedge)
            return await self.call(env, where=where)

    @by_tenant_lazily
    def stream(
        self,
        capability: str,
        payload: Any,
        *,
        where: Mapping[str, Any] | None = None,
        max_bytes: int | None = None,
        **opts: Unpack[MessageOptions],
    ) -> Stream:
        """Send one message and iterate over its handler's chunks as they come:
        ``async for chunk in client.stream(cap, payload): ...`` (docs/concepts.md,
        *Streamed results*). ``opts`` as for :meth:`request` (the deadline bounds the
        whole stream). The loop ends with the final reply; the returned :class:`Stream`'s
        ``result`` then holds the final result. Raises as :meth:`request` does, from the
        loop (the handler's error after the chunks it sent); :class:`ConfigError` at once
        for bad options. The message is sent at the first iteration. ``max_bytes``: the
        encoded bytes of chunks the stream takes in all, read or not (None: no bound);
        past them nothing more is kept and the loop raises :class:`StreamTooLarge`."""
        told = opts.get("timeout_s") is not None or opts.get("deadline_ms") is not None
        env = self.build(capability, payload, **opts)  # else its deadline is set at the send
        return Stream(self, env, where, max_bytes=max_bytes, timeout_for=not told)

    async def call(
        self, env: Envelope, *, where: Mapping[str, Any] | None = None, gate: Gate | None = None
    ) -> Any:
        """Deliver a built envelope and wait for its reply (:meth:`request`, :meth:`deliver`)."""
        t0 = time.perf_counter()
        try:
            res = await self._call_with_fallback(env, where, gate)
        except BaseException as e:
            metrics.client_reply(
                env.capability, metrics.client_outcome(e), time.perf_counter() - t0
            )
            raise
        metrics.client_reply(env.capability, RequestOutcome.SUCCEEDED, time.perf_counter() - t0)
        return res

    async def _call(self, env: Envelope, where: Mapping[str, Any] | None, gate: Gate | None) -> Any:
        self._ensure_reader()
        ev = self._reader.expect(env.msg_id)
        try:
            got = await self._deliver_or_hold(env, where, track=True, gate=gate)
            if isinstance(got, Held):  # Redis was unreachable: sent when it is back
                agent_id = await self._buffer.wait(got)
                self.router.inflight.add(agent_id)
            else:
                agent_id = got
        except NoAgentAvailable:
            if not self._falls_back_on("no_agent"):
                self._forget(env, "", ok=True)
                raise
            log.info("no agent for %s: the fallback answers", env.capability)
            try:
                return await self._run_fallback(env)
            finally:
                self._forget(env, "", ok=True)
        except BaseException as e:
            self._forget(env, "", ok=True)
            if isinstance(e, anyio.get_cancelled_exc_class()):
                await self._abandon(env)  # it may have reached an inbox: cancel it there
            raise
        return await self._answer(env, agent_id, ev)

    async def _answer(self, env: Envelope, agent_id: str, ev: anyio.Event) -> Any:
        """Wait for the reply of ``env`` (delivered to ``agent_id``) and return its outcome;
        the call is forgotten after (see :meth:`_forget`) whatever happens."""
        ok = True
        t0 = time.monotonic()
        try:
            try:
                reply = await self._reader.wait(env, ev)
            except DeadlineExceeded:
                # Not the agent's fault when Redis was away meanwhile (its breaker stays).
                ok = self._buffer.failed_since(t0) or self._reader.failed_since(t0)
                raise
            except anyio.get_cancelled_exc_class():
                await self._abandon(env)
                raise
            ok = reply.status == Status.SUCCEEDED or not blames_agent(reply.reason)
        finally:
            self._forget(env, agent_id, ok=ok)
        return self._outcome(env, reply)

    def _forget(self, env: Envelope, agent_id: str, *, ok: bool) -> None:
        """The call of ``env`` is over: no longer waited for, no longer in flight to
        ``agent_id`` ('' when it was not delivered), its outcome counted by the breaker."""
        self._reader.forget(env.msg_id)
        if self._sender is not None:  # the agent it is with now, if it was moved
            agent_id = self._sender.reroute.end(env.msg_id, agent_id)
        if agent_id:
            self.router.inflight.done(agent_id)
            self.breakers.record(agent_id, ok)

    @classmethod
    def _outcome(cls, env: Envelope, reply: Reply) -> Any:
        return cls._outcome_of(env.capability, env.msg_id, reply)

    _outcome_of = staticmethod(outcome_of)

    @by_tenant
    async def cancel(self, msg_id: str, *, by: str = "", tenant: str | None = None) -> CancelResult:
        """Cancel a message sent earlier (docs/concepts.md, *Cancellation*).

        Not started yet: it never runs; the worker that reaches it dead-letters it (reason
        ``cancelled``) and its caller gets :class:`reach.Cancelled`. Running: its handler
        sees ``ctx.cancelled`` at once, and is cancelled after its agent's
        ``cancel_grace_s``; the messages it sent through ``ctx.client`` are cancelled too.
        Finished (succeeded, dead, expired): nothing changes, the answer says
        ``already_done``. ``by`` names who asked (kept in the task record's error).
        Returns a :class:`reach.CancelResult`; ``client.task(msg_id)`` shows ``cancelled``.
        """
        return await cancel_message(
            self.commands,
            self.keys,
            msg_id,
            cluster=self.commands.cluster,
            by=by or self.client_id,
            control=self.control,  # the audit trail's
        )

    _abandon = _later.abandon  # a caller cancelled while it waited: cancel its message

    @by_tenant
    async def task(self, msg_id: str, *, tenant: str | None = None) -> TaskStatus:
        """The status of a message sent earlier (``unknown`` once its record expired)."""
        return await get_status(self.commands, self.keys, msg_id)

    def watch(self, msg_id: str, *, timeout_s: float | None = None) -> AsyncIterator[TaskChange]:
        """Follow a message sent earlier, from this or any other process: ``async for
        change in client.watch(msg_id)`` yields first the task as it is now (its status
        and latest progress), then each change as it happens (``running``, the
        handler's ``ctx.progress(...)``, ``retrying``...), and ends after the final one
        (succeeded, dead, expired, cancelled; or ``unknown``: no such message, or its
        record expired), which carries the whole record (reply, error). Each is a
        :class:`reach.TaskChange`. ``timeout_s`` bounds the whole watch: past it,
        :class:`DeadlineExceeded`. docs/concepts.md, *Watching a task*."""
        return watch_task(
            self.commands, self.commands.redis, self.keys, msg_id, timeout_s=timeout_s
        )

    def resume(self, msg_id: str, *, after: int = 0, timeout_s: float | None = None) -> Resumed:
        """Read a streamed message's chunks again, from this or any other process, after
        chunk ``after``: ``async for chunk in client.resume(msg_id, after=n)`` yields chunk
        ``n + 1``, ``n + 2``, ... (chunks are numbered from 1; a caller that has seen ``n``
        chunks, ``stream.seq`` of its :class:`Stream`, resumes with ``after=n``), those
        written while nobody read included, each once and in order, then ends when the
        message ended, as :meth:`stream` does: the returned :class:`reach.Resumed`'s
        ``result`` holds the final result, or the loop raises its error after the last
        chunk. The worker keeps a stream's newest chunks only (``stream_keep_chunks``,
        ``stream_keep_bytes``, ``stream_keep_s``): asking for older ones raises
        :class:`ChunksNotKept` (so does a message with no record). ``timeout_s`` bounds the
        whole resume (:class:`DeadlineExceeded`). docs/concepts.md, *Resuming a stream*."""
        return Resumed(self, msg_id, after=after, timeout_s=timeout_s)

    @by_tenant
    async def result(
        self, msg_id: str, *, timeout_s: float | None = None, tenant: str | None = None
    ) -> Any:
        """The result of a message sent earlier, waiting up to ``timeout_s`` for it.

        For a caller that restarted with the same ``client_id``: replies sent while it was
        away wait in its reply stream; a message sent with :meth:`send` has its outcome in
        its task record. Raises like :meth:`request`; :class:`DeadlineExceeded` when no
        result came in time.
        """
        return await _later.result(self, msg_id, timeout_s)

"""The agent side of reach: what an agent author writes against.

``reach.Agent`` names an agent, declares what it can do and holds its handlers::

    app = reach.Agent("summarizer-1", capabilities=["text.summarize"])

    @app.handler("text.summarize")
    async def summarize(payload: dict, ctx: reach.Context) -> dict: ...

``await app.run(redis_url=...)`` (or ``reach worker module:app``) then registers (not
ready), creates the inbox consumer group, resumes its own pending entries, marks itself
ready, and serves until SIGTERM/SIGINT, when it drains and deregisters. How it serves is
the private package ``reach._worker`` (its ``__init__`` maps the parts);
:class:`RuntimeOptions` lists the settings of a run.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import threading
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict, Unpack

import msgspec
import msgspec.inspect

from . import authz
from ._emitting import KEEP_BYTES, KEEP_CHUNKS, KEEP_S, streamed
from ._sessions.tiers import DEFAULT_TIER, SessionTier, parse_tier
from ._worker.guarding import check_guards, guarded
from ._worker.readiness import READINESS_TIMEOUT_S, ReadinessCheck
from ._worker.runtime import Runtime
from .callpath import DEFAULT_MAX_HOPS, check_max_hops
from .config import resolve_redis_url
from .doctor import warn_once
from .errors import ConfigError
from .guards import Guard
from .hooks import Hooks
from .limits import RateLimit, parse_limit
from .planes import resolve_registry_url
from .recent import RECENT_MAXLEN
from .registry import (
    AUDITED_KEY,
    IDEMPOTENT_KEY,
    MAX_ADVERTISED_TIMEOUT_S,
    MAX_METADATA_BYTES,
    MAX_WEIGHT,
    TIMEOUTS_KEY,
    agent_key_id,
    check_app_version,
    normalize_capabilities,
    normalize_capability,
)
from .schemas import SCHEMAS_KEY, handler_schemas
from .scripts.delivery import DEFAULT_MAX_TAKEOVERS
from .signing import (
    SecretOption,
    WorkerSigning,
    make_signer,
    register_worker,
    require_signed_env,
    unregister_worker,
)
from .tasks import DLQ_MAXLEN

if typing.TYPE_CHECKING:
    from .context import Context

log = logging.getLogger("reach.agent")

Handler = Callable[[Any, "Context"], Any]
"""``fn(payload, ctx)``: async (runs on the event loop) or plain (runs in a worker thread)."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler and what the worker needs to know to call it."""

    fn: Handler
    is_async: bool
    payload_type: Any  # what payloads are validated into (Any: only decoded)
    limit: RateLimit | None = None  # the agent's own limit on starts (rate=, burst=)
    preemptible: bool = True  # a low-priority run may be cut and requeued for high work
    max_hops: int | None = None  # deepest call path it takes (None: the agent's max_hops)
    session: SessionTier = DEFAULT_TIER  # ctx.session's consistency (reach._sessions)


def _payload_type(fn: Handler) -> Any:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable hints: the payload stays untyped
        return Any
    params = list(inspect.signature(fn).parameters)
    if not params:
        return Any
    t = hints.get(params[0], Any)
    if t in (typing.Any, object):
        return Any
    # A type msgspec cannot validate into would fail every message: refuse it now.
    try:
        info = msgspec.inspect.type_info(t)
        why = "a class msgspec cannot build" if isinstance(info, msgspec.inspect.CustomType) else ""
    except TypeError as e:
        why = str(e)
    if why:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ConfigError(
            f"Handler {name}: its payload annotation {t!r} is not a type reach can "
            f"validate payloads into ({why}). Annotate the payload with a msgspec Struct, a "
            "dataclass, a TypedDict, dict, list or a builtin type, or with typing.Any to "
            "take it as decoded."
        ) from None
    return t


@dataclass
class RuntimeOptions:
    """How an agent runs: pass one to :meth:`Agent.run`, or its fields as keywords.

    Every setting has a default; out-of-range values raise :class:`reach.ConfigError`
    when the options are built, before anything connects.
    """

    redis_url: str | None = None
    """Redis to serve on; else ``REACH_REDIS_URL``, else the project file (reach.config)."""
    session_url: str | None = None
    """Redis of the session store (``ctx.session``), when not ``redis_url``'s: a
    ``best_effort`` session then survives that Redis being down (docs/operations.md)."""
    registry_url: str | None = None
    """Redis of the control plane (registry, limits, quotas, audit, access rules), when
    not ``redis_url``'s; else ``REACH_REGISTRY_URL``, else reach.toml's (reach.planes)."""
    namespace: str = "default"
    heartbeat_s: float = 3.0
    """How often the lease is renewed (from a thread of its own)."""
    lease_s: float = 9.0
    """Without a heartbeat for this long the agent is in probation (not routed to)."""
    evict_after_s: float = 18.0
    """Without a heartbeat for this long the agent is evicted and its inbox moved on."""
    stall_s: float = 30.0
    """An event loop without progress for this long stops the heartbeats."""
    max_takeovers: int = DEFAULT_MAX_TAKEOVERS
    """How many times a message's run that never ended (its agent killed, evicted, or its
    event loop blocked past ``stall_s``) may be taken over by another agent (or a restart of
    its own); the next takeover dead-letters it ``poisoned`` instead of running it."""
    concurrency: int = 16
    """Handlers running at once."""
    max_waiting_handlers: int = 100
    """Handlers waiting for input (``ctx.ask``) that give their slot back while they wait,
    at most (0: none; each waits in its slot). One more waits in its slot, so up to
    ``concurrency + max_waiting_handlers`` handlers may be waiting; each one holds a Redis
    connection of its own to hear its answer (docs/concepts.md, *Human input*)."""
    batch: int = 64
    """Most inbox entries read at once."""
    prefetch: int = 64
    """Entries read and claimed ahead of the free handler slots, so that the next batch's
    read and claim overlap the running handlers. Only while handlers are quick: when their
    recent mean run time says a read-ahead entry would wait over 50 ms for a slot (its claim
    lease running), the worker reads only what its free slots can start. 0: never."""
    cancel_grace_s: float = 3.0
    """A handler whose message is cancelled while it runs sees ``ctx.cancelled`` at once;
    this long after, its cancel scope is cancelled (0: at once)."""
    preempt_after_s: float | None = None
    """Priority preemption (None: off): when every handler slot is taken, low-priority
    handlers run and a high-priority message has waited this long in the inbox, the worker
    cuts a low-priority run (of a ``preemptible`` handler) per waiting high message and
    requeues it, its attempt not counted."""
    max_preempts: int = 2
    """Aging: a message preempted this many times is not preempted again (it runs to its
    end), so low priority still progresses under sustained high load."""
    drain_timeout_s: float = 30.0
    """The drain grace (``reach worker --drain-s``): on stop, how long running handlers
    may take to finish. Those still running then are cancelled and their messages run
    again once the agent has left (a plain function, which cannot be cancelled, is waited
    for); every outcome is written before the agent deregisters (docs/operations.md,
    "Drain")."""
    shadow_ttl_s: float = 3600.0
    """How long an evicted agent's record is kept (its id is recognised when it returns)."""
    sweep_interval_s: float = 1.0
    """How often the cluster-wide chores run (by whichever agent holds the sweeper lock)."""
    claim_lease_s: float = 60.0
    """How long a claim of a message without a deadline holds before another may take it.
    The claims of running handlers are renewed every third of it (however long they run);
    a worker that died renews nothing, and its claims are taken over once this runs out."""
    retry_base_s: float = 0.2
    """First retry backoff (doubled per attempt, times a random factor in [0.5, 1.5])."""
    retry_max_s: float = 30.0
    """Longest retry backoff."""
    block_ms: int = 1000
    """Longest blocking read of an idle inbox."""
    consumer_stall_s: float = 10.0
    """A consumer without progress for this long is marked not ready (routing avoids it)."""
    max_envelope_bytes: int = 2 * 1024 * 1024
    """Inbox entries larger than this are dead-lettered unread (``too_large``)."""
    pending_scan_s: float = 5.0
    """How often this agent's own read-but-unsettled entries are looked for."""
    dlq_maxlen: int = DLQ_MAXLEN
    """Dead-letter streams are trimmed to about this many entries."""
    recent_maxlen: int = RECENT_MAXLEN
    """The index of recent messages (the console's message list, ``reach tasks``) is
    trimmed to about this many entries (a settled batch writes one per 64 messages);
    0: this agent writes no index."""
    traceback_max_bytes: int = 8192
    """A handler's traceback is stored with its outcome (task record, dead letter) up to
    its last this many bytes (the frames nearest the error); 0: no tracebacks stored."""
    redact_traceback: Callable[[str], str] | None = field(default=None, repr=False)
    """Called with each traceback before it is stored or logged; returns the text to keep
    (e.g. with secrets masked). A hook that raises stores a note instead of the text."""
    stream_keep_chunks: int = KEEP_CHUNKS
    """A streaming handler's chunks are kept in Redis so that the stream can be resumed
    from any process (``Client.resume``, docs/concepts.md, *Resuming a stream*): at most
    this many per message, the newest (0: none kept, no resume)."""
    stream_keep_bytes: int = KEEP_BYTES
    """...and at most this many bytes of them per message (the newest)."""
    stream_keep_s: float = KEEP_S
    """...for this long after the latest chunk was written."""
    handle_signals: bool = True
    """SIGTERM/SIGINT drain the agent (a second one stops it at once); main thread only."""
    sweeper: bool = True
    """Take part in the cluster-wide chores (delayed retries, evicted inboxes...)."""
    ready_event: threading.Event | None = field(default=None)
    """Set once the agent is registered, ready and serving (for embedding and tests)."""
    secret: SecretOption = field(default=None, repr=False)
    """The namespace's signing secret (else ``REACH_SECRET``; a list, or comma-separated,
    for a key rollover: the first signs, any verifies). With one, the agent signs its
    replies and ``ctx.sender`` names who signed a message (docs/security.md)."""
    identity_file: str | None = None
    """Sign with this agent's own Ed25519 key (a file ``python -m reach.signing keygen``
    wrote) instead of a shared secret; else ``REACH_IDENTITY_FILE``."""
    trusted_keys_file: str | None = None
    """The public keys of the identities this agent believes (``NAME BASE64`` lines), with
    ``identity_file``; else ``REACH_TRUSTED_KEYS_FILE``."""
    require_signed: bool | None = None
    """Dead-letter (reason ``unauthenticated``) every message that is unsigned or whose
    signature does not verify; needs a secret. None: ``REACH_REQUIRE_SIGNED=1``."""

    def __post_init__(self) -> None:
        if not (0 < self.heartbeat_s < self.lease_s <= self.evict_after_s):
            raise ConfigError(
                "Need 0 < heartbeat_s < lease_s <= evict_after_s (got "
                f"{self.heartbeat_s}, {self.lease_s}, {self.evict_after_s})."
            )
        if self.concurrency < 1:
            raise ConfigError("concurrency must be >= 1.")
        if self.preempt_after_s is not None and not (0.001 <= self.preempt_after_s <= 3600):
            raise ConfigError(
                f"preempt_after_s must be None (off) or 0.001..3600, got {self.preempt_after_s}."
            )
        if self.evict_after_s > 86_400:
            raise ConfigError(
                f"lease_s and evict_after_s must be <= 86400 (a day), got "
                f"{self.lease_s} and {self.evict_after_s}."
            )
        if not (0.001 <= self.shadow_ttl_s <= 30 * 86_400):
            raise ConfigError(
                f"shadow_ttl_s must be between 0.001 and 2592000 (30 days), "
                f"got {self.shadow_ttl_s}."
            )
        # The delivery scripts refuse values outside these ranges: catch them here, with
        # words, rather than as every claim or fetch refused while messages stay pending.
        for name, lo, hi in (
            ("claim_lease_s", 0.001, 604_800.0),
            ("cancel_grace_s", 0, 86_400.0),
            ("max_preempts", 0, 1_000),
            ("max_takeovers", 0, 1_000_000),
            ("batch", 1, 10_000),
            ("max_waiting_handlers", 0, 100_000),
            ("prefetch", 0, 10_000),
            ("dlq_maxlen", 1, 10**9),
            ("traceback_max_bytes", 0, 1024 * 1024),
            ("recent_maxlen", 0, 10**7),
            ("block_ms", 1, 3_600_000),
            ("max_envelope_bytes", 1, 512 * 1024 * 1024),
            # keep_chunks.lua's ranges
            ("stream_keep_chunks", 0, 10**9),
            ("stream_keep_bytes", 1, 2**40),
            ("stream_keep_s", 0.001, 30 * 86_400.0),
        ):
            value = getattr(self, name)
            if not (lo <= value <= hi):
                raise ConfigError(f"{name} must be between {lo} and {hi}, got {value}.")

    def replace(self, **changes: Any) -> RuntimeOptions:
        """A copy with ``changes`` (checked again)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(
                f"Unknown runtime option(s) {', '.join(sorted(unknown))}: the options are "
                f"the fields of reach.RuntimeOptions."
            )
        return RuntimeOptions(
            **{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes}
        )


def worker_signing(opts: RuntimeOptions) -> WorkerSigning | None:
    """The signing an agent runs with: its keys (``secret=``, else ``REACH_SECRET``) and
    whether it refuses unsigned messages (``require_signed=``, else
    ``REACH_REQUIRE_SIGNED``). None: no secret, nothing signed or checked."""
    keys = make_signer(opts.namespace, opts.secret, opts.identity_file, opts.trusted_keys_file)
    required = opts.require_signed if opts.require_signed is not None else require_signed_env()
    if keys is None:
        if required:
            raise ConfigError(
                "Requiring signed messages needs keys: set REACH_SECRET (or secret=...), the "
                "namespace's secret the callers sign with, or REACH_IDENTITY_FILE and "
                "REACH_TRUSTED_KEYS_FILE (per-identity keys)."
            )
        return None
    return WorkerSigning(keys, required)


class RunOptions(TypedDict, total=False):
    """The keywords :meth:`Agent.run` takes: the fields of :class:`RuntimeOptions`."""

    redis_url: str | None
    session_url: str | None
    registry_url: str | None
    namespace: str
    heartbeat_s: float
    lease_s: float
    evict_after_s: float
    stall_s: float
    max_takeovers: int
    concurrency: int
    max_waiting_handlers: int
    batch: int
    prefetch: int
    cancel_grace_s: float
    preempt_after_s: float | None
    max_preempts: int
    drain_timeout_s: float
    shadow_ttl_s: float
    sweep_interval_s: float
    claim_lease_s: float
    retry_base_s: float
    retry_max_s: float
    block_ms: int
    consumer_stall_s: float
    max_envelope_bytes: int
    pending_scan_s: float
    dlq_maxlen: int
    recent_maxlen: int
    traceback_max_bytes: int
    redact_traceback: Callable[[str], str] | None
    stream_keep_chunks: int
    stream_keep_bytes: int
    stream_keep_s: float
    handle_signals: bool
    sweeper: bool
    ready_event: threading.Event | None
    secret: SecretOption
    identity_file: str | None
    trusted_keys_file: str | None
    require_signed: bool | None


VERSION_ENV = "REACH_AGENT_VERSION"
"""The environment variable an :class:`Agent` made without ``version=`` takes its version
from."""


class Agent:
    """A registered agent: an id, what it can do, and the handlers that do it.

    ``agent_id`` is stable across restarts (a restarted agent resumes its own pending
    messages). ``weight`` scales its share of weighted routing; ``metadata`` is matched by
    callers' ``where=`` filters; ``max_queue`` bounds its inbox (0 = unbounded).
    ``hooks`` watch it at work (:mod:`reach.hooks`): metrics, tracing, your own.
    ``max_hops`` (16) bounds call paths (docs/concepts.md, *Call graphs*): its handlers'
    calls through ``ctx.client`` go at most this many calls below the first message
    (:class:`~reach.HopLimitExceeded`), and a message deeper than that reaching it (or
    than its handler's own ``max_hops``) is dead-lettered ``hop_limit`` without running.
    ``guards`` (:mod:`reach.guards`) check the content of every capability's messages,
    before the guards of each handler (``@app.handler(..., guards=[...])``); they apply
    to the handlers decorated after (docs/security.md, *Guards*).

    ``version`` is the application version it runs, registered with it (``reach agents``)
    and routed by when its capability is split between versions (``reach caps split``,
    docs/routing.md, *Version canaries*); without it, ``REACH_AGENT_VERSION`` from the
    environment, else none (``""``). ``reach worker --version`` overrides both.
    """

    def __init__(
        self,
        agent_id: str,
        *,
        capabilities: Iterable[str],
        weight: float = 1.0,
        metadata: Mapping[str, Any] | None = None,
        card: Mapping[str, Any] | None = None,
        max_queue: int = 0,
        hooks: Iterable[Hooks] = (),
        max_hops: int = DEFAULT_MAX_HOPS,
        guards: Iterable[Guard | Callable[..., Any]] = (),
        version: str | None = None,
    ) -> None:
        if not agent_id or not isinstance(agent_id, str) or any(c in agent_id for c in "{}, "):
            raise ConfigError(
                f"Invalid agent_id {agent_id!r}: use a non-empty name without spaces, "
                "commas or braces, e.g. 'summarizer-1'."
            )
        if not (0 < weight <= MAX_WEIGHT):  # also refuses nan
            raise ConfigError(f"weight must be > 0 and <= {MAX_WEIGHT:g}, got {weight}.")
        agent_key_id(agent_id)  # its length and characters, as the registry will check them
        self.agent_id = agent_id
        self.capabilities = normalize_capabilities(capabilities)
        if not self.capabilities:
            raise ConfigError("An agent needs at least one capability.")
        self.weight = float(weight)
        self.metadata = dict(metadata or {})
        self.card = dict(card) if card else None
        self.max_queue = max_queue
        self.max_hops = check_max_hops(max_hops, f"Agent {agent_id!r}")
        self.guards = check_guards(guards, f"Agent {agent_id!r}")
        if version is None and os.environ.get(VERSION_ENV):
            try:
                version = check_app_version(os.environ[VERSION_ENV])
            except ConfigError as e:
                raise ConfigError(f"{VERSION_ENV}: {e}") from None
        self.version = check_app_version(version)
        self.handlers: dict[str, HandlerSpec] = {}
        self.hooks: list[Hooks] = []
        self.add_hooks(*hooks)
        self.readiness_check: ReadinessCheck | None = None  # @app.readiness
        self._paused = False  # set_ready(False): routing to it paused by hand
        self._runtime: Runtime | None = None
        # A stop asked for before the runtime exists (a SIGTERM while `reach worker` still
        # starts): the run stops as soon as it has started instead of serving on.
        self._stop_asked = threading.Event()

    def renamed(self, agent_id: str) -> Agent:
        """A copy of this agent under another ``agent_id``: the same capabilities,
        handlers, weight, metadata, card, queue bound and hooks. Several copies of one
        agent each need their own id (a second process with the same id replaces the
        first): ``reach worker mod:app --agent-id ID`` runs this."""
        other = Agent(
            agent_id,
            capabilities=self.capabilities,
            weight=self.weight,
            metadata=self.metadata,
            card=self.card,
            max_queue=self.max_queue,
            hooks=self.hooks,
            max_hops=self.max_hops,
            guards=self.guards,
            version=self.version,
        )
        other.handlers = dict(self.handlers)
        other.readiness_check = self.readiness_check
        return other

    def add_hooks(self, *hooks: Hooks) -> None:
        """Add hooks (subclasses of :class:`reach.Hooks`), called after the built-in ones
        and those added before, in order. They take effect at the next :meth:`run`."""
        for h in hooks:
            if not isinstance(h, Hooks):
                raise ConfigError(
                    f"Hooks must be instances of a reach.Hooks subclass, got {h!r}: subclass "
                    "reach.Hooks and override the methods you need."
                )
        self.hooks.extend(hooks)

    def handler(
        self,
        capability: str,
        *,
        rate: str | None = None,
        burst: int | None = None,
        preemptible: bool = True,
        max_hops: int | None = None,
        timeout_s: float | None = None,
        idempotent: bool = False,
        guards: Iterable[Guard | Callable[..., Any]] = (),
        audited: bool = False,
        allow: Iterable[str] | None = None,
        security: str | None = None,
        session: SessionTier | str = "strong",
    ) -> Callable[[Handler], Handler]:
        """Decorator: ``fn(payload, ctx)`` answers messages of ``capability``.

        Async functions run on the event loop; plain functions in a worker thread; an
        async generator streams its result: each value it yields goes to the caller as a
        chunk (``Client.stream``), and its final result is ``ctx.result`` (None unless
        set); any handler may also stream with ``await ctx.emit(chunk)``. When
        the first parameter is annotated with a type (a msgspec Struct, ``list[int]``...),
        payloads are validated into it and a payload that does not fit is dead-lettered.
        That type's JSON Schema, and the result annotation's, are published with the
        registration (``metadata["schemas"]``, :mod:`reach.schemas`): ``reach caps show``,
        the card's skills and ``reach mcp`` show them.

        ``rate`` (``"100/s"``, ``"600/m"``, ``"3/10s"``) limits how often this agent starts
        the handler, ``burst`` at once after a quiet spell (default 1: evenly spaced): an
        agent wrapping a paid model keeps to its quota. It is taken from a state in Redis
        (``lua/rate_limit.lua``) like an operator's ``reach caps limit`` (which applies to
        every agent of the capability: both hold); a message over it waits in the
        delayed set, its attempt not counted, and may then go to another agent.

        ``preemptible=False``: with the agent's ``preempt_after_s`` set, a low-priority run
        of this handler is never cut to make room for high-priority work (docs/concepts.md,
        *Priority preemption*).

        ``max_hops``: a message of this capability more than this many calls below the
        first one (the call path, docs/concepts.md *Call graphs*) is dead-lettered
        ``hop_limit`` without running, its caller told with :class:`~reach.HopLimitExceeded`
        (default: the agent's ``max_hops``).

        ``timeout_s`` advertises how long a call of ``capability`` should be given: a
        caller that passes no ``timeout_s``/``deadline_ms`` gets it instead of its client's
        ``default_timeout_s`` (docs/concepts.md, *Call graphs*). It is stored with the
        registration (``metadata["timeouts"]``) and shown by ``reach caps``, the agent's
        card and the A2A gateway. It does not bound a message whose caller chose a deadline.

        ``idempotent=True`` declares that running a message of ``capability`` twice does no
        harm (a lookup, an embedding, a pure computation): it is advertised with the
        registration (``metadata["idempotent"]``), and a caller may then hedge a slow
        request with ``hedge_after_s`` (a second copy to another agent; the first answer
        wins). Without it, reach never runs a started message twice on purpose.

        ``guards`` (:mod:`reach.guards`: ``Size``, ``Schema``, ``Deny``, ``OnwardCalls``, or
        a function ``fn(value, ctx)``) check the input before the handler runs, its output
        before the reply, its streamed chunks and its onward calls, after the agent's own
        ``guards``: a refusal is dead-lettered ``refused_by_guard`` at once and the caller
        gets :class:`~reach.GuardRefused` naming the rule (docs/security.md, *Guards*).

        ``audited=True`` records every call of ``capability`` in the namespace's audit
        trail as the agent settles it: who (the verified signer, else the claimed
        source), the agent, the outcome and msg_id (reach.audit; ``reach audit``). It is
        advertised with the registration (``metadata["audited"]``).

        ``allow`` says who may call ``capability``, from the message's verified signer:
        ``"id:NAME"`` (an identity), ``"role:NAME"`` (a role the trusted-keys file gives),
        ``"*"`` (any verified signer). ``security``: ``"public"`` (default), ``"internal"``
        (verified signers only) or ``"sensitive"`` (verified signers of the allow list
        only, even where signing is otherwise optional; needs ``allow``). A refused message
        is dead-lettered ``forbidden`` without running, its caller gets
        :class:`reach.Forbidden`; both are published with the registration
        (docs/security.md, *Who may call what*).

        ``session``: the consistency of ``ctx.session`` in this handler: ``"strong"``
        (every read and write a round trip), ``"cached"`` (reads from a copy in this
        process, dropped when the session is written; writes sent in one round trip when
        the handler returns) or ``"best_effort"`` (writes as cached; on a Redis error an
        empty session, ``ctx.session.degraded``), or a :class:`reach.SessionTier` for its
        ``cache_ttl_s`` / ``timeout_s`` (docs/concepts.md, *Session tiers*).
        """
        tier = parse_tier(session)
        if max_hops is not None:
            check_max_hops(max_hops, f"@app.handler({capability!r})")
        if timeout_s is not None and (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not 0 < timeout_s <= MAX_ADVERTISED_TIMEOUT_S
        ):
            raise ConfigError(
                f"timeout_s={timeout_s!r}: give a number of seconds above 0 and at most "
                f"{MAX_ADVERTISED_TIMEOUT_S:g} (a day), e.g. timeout_s=15, or leave it out "
                "for the callers' own default."
            )
        if burst is not None and rate is None:
            raise ConfigError(f"burst={burst} needs a rate, e.g. rate='100/s', burst={burst}.")
        limit = parse_limit(rate, burst=burst) if rate is not None else None
        cap = normalize_capability(capability)
        own_guards = check_guards(guards, f"@app.handler({capability!r})")
        if cap not in self.capabilities:
            raise ConfigError(
                f"Agent {self.agent_id!r} does not declare capability {cap!r}; add it to "
                f"capabilities=[...] (now {self.capabilities})."
            )
        if allow is not None or security is not None:  # enforced by reach._worker.authz
            authz.declare(self.metadata, cap, authz.declared_for(cap, allow, security))
        if idempotent:  # advertised with the registration, as the timeouts are
            listed = self.metadata.get(IDEMPOTENT_KEY)
            listed = listed if isinstance(listed, list) else []
            self.metadata[IDEMPOTENT_KEY] = [*listed, cap] if cap not in listed else listed
        if audited:  # advertised, and read by the settler (reach._worker.auditing)
            marked = self.metadata.get(AUDITED_KEY)
            marked = marked if isinstance(marked, list) else []
            self.metadata[AUDITED_KEY] = [*marked, cap] if cap not in marked else marked
        if timeout_s is not None:  # advertised with the registration, as policies are
            adv = self.metadata.get(TIMEOUTS_KEY)
            self.metadata[TIMEOUTS_KEY] = {
                **(adv if isinstance(adv, dict) else {}),
                cap: float(timeout_s),
            }

        def deco(fn: Handler) -> Handler:
            payload_type = _payload_type(fn)
            self.publish_schemas(cap, handler_schemas(fn, payload_type))
            is_async = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
            # a streaming handler: each yield is a chunk
            run = streamed(fn) if inspect.isasyncgenfunction(fn) else fn
            run = guarded(run, is_async, [*self.guards, *own_guards], cap, fn, payload_type)
            self.handlers[cap] = HandlerSpec(
                run, is_async, payload_type, limit, preemptible, max_hops, session=tier
            )
            return fn

        return deco

    def readiness(
        self, fn: Callable[[], Any] | None = None, /, *, timeout_s: float = READINESS_TIMEOUT_S
    ) -> Any:
        """Decorator: ``fn()`` decides whether this agent may be given new work, e.g.
        whether a database or model server it needs answers::

            @app.readiness
            async def db_up() -> bool:
                return await db.ping()

        It runs with each heartbeat (every ``heartbeat_s``, and once before the agent is
        first marked ready). Returning False, raising, or taking over ``timeout_s``
        (``@app.readiness(timeout_s=2)``; 5 s by default) marks the agent not ready:
        callers route around it (to other agents of the capability, or wait for one with
        ``NoAgentAvailable`` reason ``not_ready``) while it still finishes what reached
        it. The first run that passes makes it ready again. Async functions run on the
        event loop, plain ones in a worker thread (one at a time: a plain check still
        running at the next heartbeat keeps the agent not ready). Each flip is logged
        once, and ``/readyz`` of ``reach worker --metrics-port`` says why.
        """
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not 0 < timeout_s <= 3600
        ):
            raise ConfigError(
                f"@app.readiness(timeout_s={timeout_s!r}): give a number of seconds above 0 "
                "and at most 3600, e.g. timeout_s=2."
            )

        def deco(f: Callable[[], Any]) -> Callable[[], Any]:
            if not callable(f) or inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f):
                raise ConfigError(
                    f"@app.readiness takes a function returning True/False (async or plain), "
                    f"got {f!r}."
                )
            try:
                inspect.signature(f).bind()
            except TypeError:
                raise ConfigError(
                    f"@app.readiness: {getattr(f, '__qualname__', f)!r} must take no "
                    "arguments (it is called as fn())."
                ) from None
            except ValueError:  # no signature to look at (some builtins): try it
                pass
            self.readiness_check = ReadinessCheck(
                f, inspect.iscoroutinefunction(f), float(timeout_s)
            )
            return f

        return deco if fn is None else deco(fn)

    def set_ready(self, ready: bool = True) -> None:
        """Pause (False) or resume (True) routing new work to this agent, by hand
        (thread-safe: from a handler, ``ctx.agent.set_ready(False)``; from any thread).

        Applied at once while the agent runs (one registry write: callers' views read it
        within a round trip), and kept until the next call, whatever the readiness check
        says: ready needs both. Set before :meth:`run`, the agent starts paused. A paused
        agent stays registered and alive and finishes what reached it (running handlers,
        its inbox); only new routing avoids it.
        """
        self._paused = not ready
        rt = self._runtime
        if rt is not None and rt.readiness is not None:
            rt.readiness.poke()

    @property
    def paused(self) -> bool:
        """True while routing to this agent is paused by :meth:`set_ready` (False)."""
        return self._paused

    def publish_schemas(self, cap: str, schemas: dict[str, Any]) -> None:
        """Advertise ``cap``'s schemas with the registration (``metadata["schemas"]``,
        :mod:`reach.schemas`), as the timeouts are; a handler registered again replaces
        them. Left out, with a warning, when they would take the metadata past what a
        registration holds."""
        given = self.metadata.get(SCHEMAS_KEY)
        every = {k: v for k, v in (given if isinstance(given, dict) else {}).items() if k != cap}
        if schemas:
            every[cap] = schemas
            size = len(json.dumps({**self.metadata, SCHEMAS_KEY: every}, default=str))
            if size > MAX_METADATA_BYTES:
                log.warning(
                    "agent %s: the schemas of %s are not published (the registration's "
                    "metadata would be %d bytes, over %d)",
                    self.agent_id,
                    cap,
                    size,
                    MAX_METADATA_BYTES,
                )
                del every[cap]
        if every:
            self.metadata[SCHEMAS_KEY] = every
        else:
            self.metadata.pop(SCHEMAS_KEY, None)

    async def run(
        self, options: RuntimeOptions | None = None, /, **overrides: Unpack[RunOptions]
    ) -> None:
        """Serve until stopped (SIGTERM/SIGINT, :meth:`stop`, or a stale registration).

        Settings come from ``options`` (a :class:`RuntimeOptions`), the keywords (its field
        names: ``redis_url=``, ``concurrency=``...), or both (keywords win)::

            await app.run(redis_url="redis://localhost:6379/0", concurrency=32)
        """
        opts = (options or RuntimeOptions()).replace(**overrides)
        # redis_url=, else REACH_REDIS_URL, else reach.toml/.reach/config (reach.config)
        opts = opts.replace(redis_url=resolve_redis_url(opts.redis_url))
        opts = opts.replace(
            registry_url=resolve_registry_url(opts.registry_url, data_url=opts.redis_url)
        )
        self.check_handlers()
        await warn_once(opts.redis_url or "")  # eviction, persistence: once per process
        signing = worker_signing(opts)
        authz.check_declared_keys(
            authz.declared_rules(self.metadata), self.agent_id, signing is not None
        )
        rt = Runtime(self, opts, self.hooks)
        self._runtime = rt
        if self._stop_asked.is_set():  # set before stop() looked for the runtime
            rt.request_stop()
        if signing is not None:
            register_worker(opts.namespace, self.agent_id, signing)
        try:
            await rt.run()
        finally:
            unregister_worker(opts.namespace, self.agent_id, signing)
            self._runtime = None
            self._stop_asked.clear()  # it was for this run

    def check_handlers(self) -> None:
        """Refuse (:class:`ConfigError`) an agent that declares a capability without a
        handler for it: it would be routed messages it can only dead-letter."""
        missing = [c for c in self.capabilities if c not in self.handlers]
        if missing:
            names = ", ".join(repr(c) for c in missing)
            raise ConfigError(
                f"Agent {self.agent_id!r} declares {names} but has no handler for "
                f"{'it' if len(missing) == 1 else 'them'}: decorate a function with "
                f"@app.handler({missing[0]!r}) (app: this reach.Agent), or remove "
                f"{'it' if len(missing) == 1 else 'them'} from capabilities=[...]."
            )

    def stop(self) -> None:
        """Ask a running agent to drain and stop (thread-safe). Asked while :meth:`run`
        is still starting (or before it), the run stops as soon as it has started."""
        self._stop_asked.set()  # first: run() reads it after it sets the runtime
        rt = self._runtime
        if rt is not None:
            rt.request_stop()

    @property
    def runtime(self) -> Runtime | None:
        """The running worker (None when not running); its parts are private."""
        return self._runtime

"""The registry's operations on one namespace (:class:`Registry`): registering,
heartbeats, draining, the lease sweep, and the reads of agents, capabilities and events
across the registry's shards, each one typed script call or pipelined read; with the
checks of their arguments (a :class:`~reach.ConfigError` before anything is written).

The record shapes these read and write are in :mod:`reach.registry.records`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import anyio
from redis import exceptions as rexc

from ..clock import CLOCK, Clock
from ..connection import AnyRedis, is_cluster
from ..errors import (
    ConfigError,
    NoAgentAvailable,
    StaleRegistration,
    UnknownAgent,
)
from ..keys import CLUSTER_SHARDS, Keys, clean_id
from ..scripts import (
    Call,
    DeregisterCode,
    DrainCode,
    HeartbeatCode,
    MarkReadyCode,
    RegisterCode,
    agents,
)
from .records import (
    EVENTS_MAXLEN,
    MAX_BATCH,
    MAX_CARD_BYTES,
    MAX_EVENTS_MAXLEN,
    MAX_ID_BYTES,
    MAX_LEASE_MS,
    MAX_LOAD,
    MAX_LOCK_MS,
    MAX_METADATA_BYTES,
    MAX_QUEUE,
    MAX_SHADOW_TTL_MS,
    MAX_VERSION,
    MAX_WEIGHT,
    STATES,
    AgentInfo,
    Event,
    SweepResult,
    _entry_order,
    _event,
    _show,
    agent_key_id,
    check_app_version,
    decode_id,
    normalize_capabilities,
    normalize_capability,
    parse_agent,
    unknown_capability,
)

T = TypeVar("T")


def _load(x: int) -> int:
    return min(max(int(x), 0), MAX_LOAD)


def _int_arg(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as an int within ``lo..hi`` (an integral float is taken), else ConfigError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an integer within {lo}..{hi}, got {value!r}.")
    return value


def _text_arg(name: str, value: Any, lo: int = 1, hi: int = MAX_ID_BYTES) -> str:
    try:
        size = len(value.encode()) if isinstance(value, str) else -1
    except UnicodeEncodeError:
        size = -1
    if not lo <= size <= hi:
        raise ConfigError(
            f"{name} must be a string of {lo}..{hi} bytes (UTF-8), got {_show(value)}."
        )
    return str(value)


def _json_arg(name: str, value: Mapping[str, Any], limit: int) -> str:
    try:
        text = json.dumps(dict(value), separators=(",", ":"), default=str, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ConfigError(f"{name} must be JSON-serialisable without nan or inf: {e}") from None
    if len(text.encode()) > limit:
        raise ConfigError(f"{name} is {len(text.encode())} bytes as JSON: at most {limit}.")
    return text


def refusal(script: str, exc: BaseException) -> ConfigError | None:
    """The :class:`ConfigError` for a script's ``reach: bad ...`` error reply, else None.

    Every registry script checks all its arguments before its first write and answers
    ``ERR reach: bad <argument>: <why>`` when one is out of contract (nothing written).
    """
    text = str(exc)
    if isinstance(exc, rexc.ResponseError) and text.startswith("reach: bad "):
        return ConfigError(
            f"{script}.lua refused its arguments, nothing was written: {text[len('reach: ') :]}. "
            "See the script's header (or docs/protocol.md) for the allowed values."
        )
    return None


def default_shards(redis: Any) -> int:
    """Registry shards of a namespace on ``redis``: :data:`reach.keys.CLUSTER_SHARDS` on a
    Cluster (a client, or a wrapper such as the auto-pipeline with ``cluster`` True), else
    1. Every process of a namespace derives the same count from the kind of Redis it uses,
    so no setting has to agree between them."""
    if is_cluster(redis) or getattr(redis, "cluster", False) is True:
        return CLUSTER_SHARDS
    return 1


class Registry:
    """Registry operations for one namespace on one Redis (standalone or Cluster).

    Writes raise :class:`~reach.ConfigError` for arguments outside the limits of this
    module's docstring. Reads skip records that cannot be read (:func:`parse_agent`).
    ``shards``: the registry shards of the namespace; leave it to :func:`default_shards`
    (every process of a namespace must use the same count, or they see different
    registries: a test or benchmark may set it on a standalone Redis).
    """

    def __init__(
        self,
        redis: AnyRedis,
        namespace: str,
        *,
        events_maxlen: int = EVENTS_MAXLEN,
        shards: int | None = None,
    ):
        self.redis = redis
        self.keys = Keys(namespace, default_shards(redis) if shards is None else shards)
        self.events_maxlen = _int_arg("events_maxlen", events_maxlen, 1, MAX_EVENTS_MAXLEN)
        self.scripts = agents.RegistryScripts(self.keys, self.events_maxlen)

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    @property
    def shards(self) -> int:
        """The registry shards of the namespace (1 on a standalone Redis)."""
        return self.keys.shards

    def shard_of(self, agent_id: str) -> int:
        """The registry shard of ``agent_id`` (braces removed first)."""
        return self.keys.shard(agent_id)

    async def _each_shard(
        self,
        command: str,
        key_of: Any,
        *args: Any,
        starts: list[str] | None = None,
        **kw: Any,
    ) -> list[Any]:
        """``command`` on the key ``key_of(k)`` of every shard ``k``, in one pipeline (a
        plain call with one shard); the replies in shard order. ``starts``: one argument
        per shard, put in place of the first of ``args`` (which is None then)."""

        def argv(k: int) -> tuple[Any, ...]:
            return (starts[k], *args[1:]) if starts is not None else args

        if self.shards == 1:
            return [await getattr(self.redis, command)(key_of(0), *argv(0), **kw)]
        pipe = self.redis.pipeline(transaction=False)
        for k in range(self.shards):
            getattr(pipe, command)(key_of(k), *argv(k), **kw)
        return list(await pipe.execute())

    async def _run(self, call: Call[T]) -> T:
        """Run a registry script; its refusal (``reach: bad ...``) raises ConfigError."""
        try:
            return await call.run(self.redis)
        except rexc.ResponseError as e:
            err = refusal(call.script, e)
            if err is not None:
                raise err from e
            raise

    # -- writes -----------------------------------------------------------------------
    def register_call(
        self,
        agent_id: str,
        *,
        instance_id: str,
        version: int,
        capabilities: Iterable[str],
        weight: float = 1.0,
        metadata: Mapping[str, Any] | None = None,
        lease_ms: int,
        evict_after_ms: int,
        card: Mapping[str, Any] | None = None,
        ready: bool = False,
        max_queue: int = 0,
        slots: int = 0,
        host: str | None = None,
        pid: int | None = None,
        app_version: str = "",
    ) -> Call[agents.Registration]:
        """The ``register.lua`` call (run it, or its synchronous or pipelined form).
        ``host`` and ``pid`` name the process (stored; a registration replacing this one
        reports them). ``app_version``: the application version the agent runs (version
        canaries; ``''``: none).

        Raises :class:`ConfigError` for an argument outside the limits (module docstring).
        """
        agent_id = agent_key_id(agent_id)
        caps = normalize_capabilities(capabilities)
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT)
        ):
            raise ConfigError(
                f"weight must be a number, 0 < weight <= {MAX_WEIGHT:g}, got {weight!r}."
            )
        return self.scripts.register(
            agent_id,
            instance_id=_text_arg("instance_id", instance_id),
            version=_int_arg("version", version, 0, MAX_VERSION),
            weight=weight,
            capabilities=caps,
            metadata_json=_json_arg("metadata", metadata or {}, MAX_METADATA_BYTES),
            lease_ms=_int_arg("lease_ms", lease_ms, 1, MAX_LEASE_MS),
            evict_after_ms=_int_arg("evict_after_ms", evict_after_ms, 1, MAX_LEASE_MS),
            card_json=_json_arg("card", card, MAX_CARD_BYTES) if card else "",
            ready=ready,
            max_queue=_int_arg("max_queue", max_queue, 0, MAX_QUEUE),
            slots=_int_arg("slots", slots, 0, MAX_QUEUE),
            host=None if host is None else _text_arg("host", host, 0, 256),
            pid=None if pid is None else _int_arg("pid", pid, 0, MAX_VERSION),
            app_version=check_app_version(app_version),
        )

    @staticmethod
    def check_registration(
        agent_id: str, version: int, registration: agents.Registration
    ) -> RegisterCode:
        """NEW or REPLACED; raises :class:`StaleRegistration` when a newer version is stored."""
        if registration.code is RegisterCode.STALE:
            raise StaleRegistration(
                f"Agent {agent_id!r} is registered with a newer version "
                f"({registration.stored_version}) than this process ({version}): another "
                "process took over this agent_id. Stop this one, or give it another agent_id."
            )
        return registration.code

    async def register(self, agent_id: str, **kw: Any) -> RegisterCode:
        """Register (or re-register) an agent; returns NEW (1) or REPLACED (2).

        Raises :class:`StaleRegistration` when a newer version is stored, and
        :class:`ConfigError` for an argument outside the limits (nothing is written).
        """
        return (await self.register_detail(agent_id, **kw)).code

    async def register_detail(self, agent_id: str, **kw: Any) -> agents.Registration:
        """As :meth:`register`, with the whole answer: for REPLACED of another instance,
        the instance, host and pid replaced and whether its lease still ran."""
        registration = await self._run(self.register_call(agent_id, **kw))
        self.check_registration(agent_id, kw["version"], registration)
        return registration

    def heartbeat_call(
        self,
        agent_id: str,
        *,
        instance_id: str,
        version: int,
        queue_depth: int,
        inflight: int,
        slots: int = 0,
        handler_us: int = 0,
        cap_us: str | None = None,
    ) -> Call[agents.Heartbeat]:
        """The ``heartbeat.lua`` call. Load figures (queue depth, in flight, slots, mean
        handler time) are clamped to 0..2^53-1 (a heartbeat must not fail over a counter);
        ``cap_us``: per-capability mean run times (:class:`~reach.scripts.agents.Beat`)."""
        return self.scripts.heartbeat(
            agent_key_id(agent_id),
            instance_id=_text_arg("instance_id", instance_id),
            version=_int_arg("version", version, 0, MAX_VERSION),
            queue_depth=_load(queue_depth),
            inflight=_load(inflight),
            slots=_load(slots),
            handler_us=_load(handler_us),
            cap_us=cap_us,
        )

    def heartbeat_many_call(self, beats: Iterable[agents.Beat]) -> Call[list[agents.Heartbeat]]:
        """The ``heartbeat_many.lua`` call: the leases of several agents (1..1000 of one
        registry shard, :meth:`shard_of`; e.g. the agents one process hosts there) renewed
        in one call, each answered as by :meth:`heartbeat_call`, in order. Checked and
        clamped as :meth:`heartbeat_call`; ConfigError for agents of several shards."""
        checked = [
            agents.Beat(
                agent_key_id(b.agent_id),
                _text_arg("instance_id", b.instance_id),
                _int_arg("version", b.version, 0, MAX_VERSION),
                _load(b.queue_depth),
                _load(b.inflight),
                _load(b.slots),
                _load(b.handler_us),
                b.cap_us,
            )
            for b in beats
        ]
        if not 1 <= len(checked) <= agents.MAX_BEATS:
            raise ConfigError(
                f"heartbeat_many renews 1..{agents.MAX_BEATS} agents per call, got "
                f"{len(checked)}: split the agents into several calls."
            )
        if len({self.shard_of(b.agent_id) for b in checked}) > 1:
            raise ConfigError(
                "heartbeat_many renews the agents of one registry shard per call: group the "
                "agents by Registry.shard_of(agent_id), or use Registry.heartbeat_many."
            )
        return self.scripts.heartbeat_many(checked)

    async def heartbeat_many(
        self, beats: Iterable[agents.Beat]
    ) -> list[tuple[HeartbeatCode, bool]]:
        """Renew the leases of several agents, one call per registry shard of theirs;
        ``(code, draining)`` for each, in order, as :meth:`heartbeat` answers."""
        beats = list(beats)
        by_shard: dict[int, list[int]] = {}
        for i, b in enumerate(beats):
            by_shard.setdefault(self.shard_of(agent_key_id(b.agent_id)), []).append(i)
        out: list[tuple[HeartbeatCode, bool]] = [(HeartbeatCode.NOT_REGISTERED, False)] * len(beats)
        for idx in by_shard.values():
            answers = await self._run(self.heartbeat_many_call([beats[i] for i in idx]))
            for i, h in zip(idx, answers, strict=True):
                out[i] = (h.code, h.draining)
        return out

    async def heartbeat(
        self,
        agent_id: str,
        *,
        instance_id: str,
        version: int,
        queue_depth: int = 0,
        inflight: int = 0,
        slots: int = 0,
        handler_us: int = 0,
        cap_us: str | None = None,
    ) -> tuple[HeartbeatCode, bool]:
        """Renew the lease. Returns ``(code, draining)``: RENEWED (1), RECOVERED (2, after
        probation), NOT_REGISTERED (0: register again), STALE (-1: a newer registration of
        this agent_id exists: stop)."""
        hb = await self._run(
            self.heartbeat_call(
                agent_id,
                instance_id=instance_id,
                version=version,
                queue_depth=queue_depth,
                inflight=inflight,
                slots=slots,
                handler_us=handler_us,
                cap_us=cap_us,
            )
        )
        return hb.code, hb.draining

    async def deregister(self, agent_id: str, *, instance_id: str = "") -> DeregisterCode:
        """Remove an agent (only ``instance_id``'s registration, when given).

        Returns REMOVED (1), NOT_FOUND (0), OTHER_INSTANCE (-1: kept, another instance
        owns it).
        """
        return await self._run(
            self.scripts.deregister(
                agent_key_id(agent_id), instance_id=_text_arg("instance_id", instance_id, 0)
            )
        )

    async def mark_ready(
        self, agent_id: str, *, instance_id: str, ready: bool = True
    ) -> MarkReadyCode:
        """Set readiness; returns SET (1), NOT_REGISTERED (0), OTHER_INSTANCE (-1)."""
        return await self._run(
            self.scripts.mark_ready(
                agent_key_id(agent_id),
                instance_id=_text_arg("instance_id", instance_id),
                ready=ready,
            )
        )

    async def drain(self, agent_id: str, *, instance_id: str = "") -> DrainCode:
        """Ask an agent to drain: routing stops sending it work, it finishes and leaves.

        ``instance_id`` empty: an operator's drain of whatever instance is registered.
        Given: only that instance's registration (a process draining itself), so a stale
        process that stops never drains the newer one that replaced it.

        Returns DRAINING (1), ALREADY_DRAINING (2), OTHER_INSTANCE (-1: another instance
        owns the registration; only with ``instance_id``, nothing changed). Raises
        :class:`UnknownAgent` when no live agent has that id.
        """
        agent_id = agent_key_id(agent_id)
        code = await self._run(
            self.scripts.drain(agent_id, instance_id=_text_arg("instance_id", instance_id, 0))
        )
        if code is DrainCode.NOT_FOUND:
            raise UnknownAgent(
                f"No live agent {agent_id!r} in namespace {self.keys.namespace!r}; "
                "see `reach agents` for the registered ones."
            )
        return code

    async def sweep(
        self,
        *,
        owner: str = "cli",
        lock_ms: int = 0,
        shadow_ttl_ms: int = 3_600_000,
        batch: int = 1000,
        shards: Iterable[int] | None = None,
    ) -> SweepResult:
        """Advance every due lease (probation, eviction, shadow deletion) of every shard
        (or of ``shards`` only).

        With ``lock_ms > 0`` (at most 1 hour) a shard is swept only by the holder of its
        sweeper lock: this call takes the locks it finds free (or holds) and passes over
        the others (``locked=True`` when it held none; ``held``: the shards it swept).
        Loops over batches until nothing due is left in the shards it swept.
        """
        owner = _text_arg("owner", owner)
        lock_ms = _int_arg("lock_ms", lock_ms, 0, MAX_LOCK_MS)
        shadow_ttl_ms = _int_arg("shadow_ttl_ms", shadow_ttl_ms, 1, MAX_SHADOW_TTL_MS)
        batch = _int_arg("batch", batch, 1, MAX_BATCH)
        total = SweepResult()
        for k in range(self.shards) if shards is None else sorted(set(shards)):
            call = self.scripts.sweep(
                owner=owner, lock_ms=lock_ms, shadow_ttl_ms=shadow_ttl_ms, batch=batch, shard=k
            )
            while True:
                swept = await self._run(call)
                if swept.locked:
                    break
                total.due += swept.due
                total.probation += swept.probation
                total.deleted += swept.deleted
                total.evicted += [
                    x
                    for x in (
                        decode_id(i, namespace=self.namespace, where="sweep") for i in swept.evicted
                    )
                    if x
                ]
                if swept.due < batch:
                    total.swept += 1
                    total.held.append(k)
                    total.chores = total.chores or k == 0
                    break
        total.locked = total.swept == 0
        return total

    # -- reads ------------------------------------------------------------------------
    async def measure_clock(self, clock: Clock = CLOCK) -> float | None:
        """Measure this process's clock offset to Redis's (:mod:`reach.clock`) on the
        registry's connection: a plain ``TIME`` on standalone Redis, on a Cluster
        ``server_time.lua`` keyed by registry shard 0 (the registry's master, through the
        same auto-pipelined connection as the registry's calls). The skew in seconds, or
        None when Redis did not answer."""
        call = self.scripts.server_time()
        return await clock.measure(self.redis, lambda: call.run(self.redis))

    async def count_shards(self, *, sample: int = 1000) -> list[agents.AgentCounts]:
        """Each shard's agents by lease state and routable, in shard order, reading at most
        ``ceil(sample / shards)`` records of each (1 <= sample <= 100,000): one
        ``count_agents.lua`` call per shard, whatever the fleet size."""
        sample = _int_arg("sample", sample, 1, 100_000)
        each = max(1, -(-sample // self.shards))
        return [
            await self._run(self.scripts.count_agents(sample=each, shard=k))
            for k in range(self.shards)
        ]

    async def count_agents(self, *, sample: int = 1000) -> agents.AgentCounts:
        """The agents by lease state and the routable ones, summed over the shards
        (:meth:`count_shards`): exact up to ``sample / shards`` agents per shard, else from
        uniform random samples (``AgentCounts.scaled()`` estimates the namespace's counts;
        :meth:`count_states` scales each shard by its own ratio)."""
        parts = await self.count_shards(sample=sample)
        return agents.AgentCounts(
            *(
                sum(getattr(p, f.name) for p in parts)
                for f in dataclasses.fields(agents.AgentCounts)
            )
        )

    async def count_states(self, *, sample: int = 1000) -> tuple[dict[str, int], int]:
        """``({state: agents}, routable)`` of the namespace: each shard's count
        (:meth:`count_shards`) scaled by its own ``total / looked``, summed."""
        states = {s: 0 for s in STATES}
        routable = 0
        for part in await self.count_shards(sample=sample):
            counts, r = part.scaled()
            for name, n in counts.items():
                states[name] += n
            routable += r
        return states, routable

    async def figures(self) -> tuple[int, list[str]]:
        """The namespace's live (active) agents, counted as :meth:`count_states` counts
        them, and the capabilities live agents declare: what :meth:`no_agent` says."""
        states, _ = await self.count_states()
        return states.get("active", 0), [c for c, n in await self.capabilities() if n > 0]

    async def no_agent(self, capability: str) -> NoAgentAvailable:
        """The error for ``capability`` when none of its agents is known, with the
        namespace's figures (:meth:`figures`, :func:`unknown_capability`)."""
        live, caps = await self.figures()
        return unknown_capability(capability, live_agents=live, capabilities=caps)

    async def get(self, agent_id: str) -> AgentInfo | None:
        """The agent's record (live or shadow); None when there is none, or when it cannot
        be read (logged once, see :func:`parse_agent`)."""
        h = await self.redis.hgetall(self.keys.agent(agent_id))
        if not h:
            return None
        return parse_agent(h, agent_id=clean_id(agent_id), namespace=self.namespace)

    async def agent_ids(self, capability: str | None = None) -> list[str]:
        """Ids of the live agents of ``capability``, or of every known agent (shadows too).

        Ids that are not UTF-8 (no agent reach registered has one) are left out.
        """
        if capability is None:
            parts = await self._each_shard("zrange", self.keys.agents_of, 0, -1)
            where = "agents zset"
        else:
            cap = normalize_capability(capability)
            parts = await self._each_shard("smembers", lambda k: self.keys.cap_of(cap, k))
            where = f"capability set {cap}"
        decoded = (decode_id(i, namespace=self.namespace, where=where) for p in parts for i in p)
        return sorted({i for i in decoded if i})

    async def read_agents(self, ids: Iterable[str]) -> dict[str, AgentInfo | None]:
        """The records of ``ids`` in one pipeline: None for an id without a readable one."""
        ids = list(ids)
        if not ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for i in ids:
            pipe.hgetall(self.keys.agent(i))
        out: dict[str, AgentInfo | None] = {}
        for i, h in zip(ids, await pipe.execute(), strict=True):
            out[i] = parse_agent(h, agent_id=clean_id(i), namespace=self.namespace) if h else None
        return out

    async def agents(
        self,
        capability: str | None = None,
        *,
        state: str | None = None,
        ready: bool | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> list[AgentInfo]:
        """Agents, optionally of one capability, filtered by state, readiness and metadata.

        Records that cannot be read are left out (logged once)."""
        if state is not None and state not in STATES:
            raise ConfigError(f"Unknown state {state!r}: use one of {', '.join(STATES)}.")
        out = []
        for a in (await self.read_agents(await self.agent_ids(capability))).values():
            if a is None:
                continue
            if state is not None and a.state != state:
                continue
            if ready is not None and a.ready != ready:
                continue
            if a.matches(where):
                out.append(a)
        return out

    async def capabilities(self) -> list[tuple[str, int]]:
        """Every capability with at least one live agent, with how many declare it (the
        shards' counts summed), fewest first (then by name), as a caps zset orders them."""
        counts: dict[str, int] = {}
        for rows in await self._each_shard("zrange", self.keys.caps_of, 0, -1, withscores=True):
            for c, n in rows:
                cap = decode_id(c, namespace=self.namespace, where="caps zset")
                if cap is not None and math.isfinite(n):
                    counts[cap] = counts.get(cap, 0) + int(n)
        return sorted(counts.items(), key=lambda kv: (kv[1], kv[0]))

    async def events(self, *, after: str = "-", count: int = 100) -> list[Event]:
        """Registry events after id ``after`` (exclusive; an :attr:`Event.id`), oldest
        first: the shards' events merged by (entry id, shard). Each shard's ids come from
        its master's clock, so across shards the order is the masters' clocks'."""
        if after in ("-", "0", ""):
            starts = ["-"] * self.shards
        else:
            at, _, shard = after.partition("@")
            k = int(shard) if shard.isdigit() else self.shards  # no shard: after in each
            # a shard ordered after the resumed one may hold an entry of the same id
            starts = [f"({at}" if j <= k else at for j in range(self.shards)]
        parts = await self._each_shard(
            "xrange", self.keys.events_of, None, "+", count=count, starts=starts
        )
        return self._merged(parts)[:count]

    async def recent_events(self, count: int = 50) -> list[Event]:
        """The last ``count`` registry events (of every shard), oldest first."""
        parts = await self._each_shard("xrevrange", self.keys.events_of, "+", "-", count=count)
        merged = self._merged(parts)
        return merged[max(0, len(merged) - count) :]

    async def events_position(self) -> str:
        """The id of the newest event (``0-0`` when there is none yet): a follower that
        passes it to :meth:`tail_events` misses nothing written after this call, where
        ``$`` would miss what lands between two of its reads."""
        last = await self.recent_events(1)
        return last[-1].id if last else "0-0"

    async def tail_events(self, *, last_id: str = "$", block_ms: int = 1000) -> list[Event]:
        """Wait up to ``block_ms`` for events newer than ``last_id`` (``$``: from now).
        One blocking read with one shard; with more (their streams are in several slots,
        which one read cannot wait on), a read of every shard every 100 ms."""
        if self.shards == 1:
            key = self.keys.events_of(0)
            res = await self.redis.xread({key: last_id}, block=block_ms, count=100)
            return [self.event(i, f) for _, rows in res for i, f in rows] if res else []
        if last_id == "$":
            last = await self.recent_events(1)
            last_id = last[-1].id if last else "0-0"
        deadline = time.monotonic() + block_ms / 1000
        while True:
            new = await self.events(after=last_id, count=100)
            if new or time.monotonic() >= deadline:
                return new
            await anyio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _merged(self, parts: list[Any]) -> list[Event]:
        rows = sorted(
            ((_entry_order(i), k, i, f) for k, p in enumerate(parts) for i, f in p),
            key=lambda r: (r[0], r[1]),
        )
        if self.shards == 1:
            return [self.event(i, f) for _, _, i, f in rows]
        out = []
        for _, k, i, f in rows:
            e = self.event(i, f)
            e.id = f"{e.id}@{k}"
            out.append(e)
        return out

    def event(self, entry_id: bytes | str, fields: Mapping[bytes | str, bytes | str]) -> Event:
        """One events-stream entry as an :class:`Event`; never fails (see :class:`Event`)."""
        return _event(entry_id, fields, namespace=self.namespace)

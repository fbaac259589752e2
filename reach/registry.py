"""The capability registry: who is alive, what they can do, and how loaded they are.

Every change is one Lua script (``lua/register.lua`` ...), atomic in the namespace's hash
slot. Reads are plain commands on the same slot. Times are the Redis server's clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from . import scripts
from .connection import AnyRedis, as_text
from .errors import ConfigError, InvalidCapability, StaleRegistration, UnknownAgent
from .keys import Keys, clean_id

CAPABILITY_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
STATES = ("active", "probation", "evicted")
EVENTS_MAXLEN = 10_000


def normalize_capability(name: str) -> str:
    """Strip and lower-case ``name`` and check it is a dotted capability name.

    >>> normalize_capability("  Text.Summarize ")
    'text.summarize'
    """
    if not isinstance(name, str):
        raise InvalidCapability(f"A capability name must be a string, not {type(name).__name__}.")
    norm = name.strip().lower()
    if not CAPABILITY_RE.match(norm):
        raise InvalidCapability(
            f"Invalid capability name {name!r}: use lower-case words of letters, digits and "
            "'_' joined by dots, e.g. 'text.summarize' or 'code.review_python'."
        )
    return norm


def normalize_capabilities(names: Iterable[str]) -> list[str]:
    """Normalise each name, drop duplicates, keep order; at least one is required."""
    if isinstance(names, str):
        names = [names]
    out: list[str] = []
    for n in names:
        c = normalize_capability(n)
        if c not in out:
            out.append(c)
    if not out:
        raise InvalidCapability(
            "An agent must declare at least one capability, e.g. capabilities=['text.summarize']."
        )
    return out


def agent_key_id(agent_id: str) -> str:
    """The id under which an agent is stored: ``agent_id`` without ``{``/``}``.

    Scripts find agent hashes by appending the stored id to the hash prefix (``sweep.lua``),
    so the id passed in ARGV must be the one the key names were built from.
    """
    if not isinstance(agent_id, str) or not clean_id(agent_id).strip():
        raise ConfigError(f"Invalid agent_id {agent_id!r}: use a non-empty string.")
    return clean_id(agent_id)


class AgentInfo(msgspec.Struct, kw_only=True):
    """An agent's registration as stored in Redis."""

    agent_id: str
    instance_id: str = ""
    version: int = 0
    weight: float = 1.0
    capabilities: list[str] = []
    metadata: dict[str, Any] = {}
    card: dict[str, Any] | None = None
    state: str = "active"
    ready: bool = False
    draining: bool = False
    registered_ms: int = 0
    last_heartbeat_ms: int = 0
    state_ms: int = 0
    ready_ms: int = 0
    lease_ms: int = 0
    evict_after_ms: int = 0
    queue_depth: int = 0
    inflight: int = 0
    max_queue: int = 0

    @classmethod
    def from_hash(cls, h: Mapping[bytes | str, bytes | str]) -> AgentInfo:
        d = {as_text(k): as_text(v)
             for k, v in h.items()}  # fmt: skip
        card = d.get("card") or ""
        caps = d.get("caps", "")
        return cls(
            agent_id=d["agent_id"],
            instance_id=d.get("instance_id", ""),
            version=int(d.get("version", 0)),
            weight=float(d.get("weight", 1)),
            capabilities=[c for c in caps.split(",") if c],
            metadata=json.loads(d.get("metadata") or "{}"),
            card=json.loads(card) if card else None,
            state=d.get("state", "active"),
            ready=d.get("ready") == "1",
            draining=d.get("draining") == "1",
            registered_ms=int(d.get("registered_ms", 0)),
            last_heartbeat_ms=int(d.get("last_heartbeat_ms", 0)),
            state_ms=int(d.get("state_ms", 0)),
            ready_ms=int(d.get("ready_ms", 0)),
            lease_ms=int(d.get("lease_ms", 0)),
            evict_after_ms=int(d.get("evict_after_ms", 0)),
            queue_depth=int(d.get("queue_depth", 0)),
            inflight=int(d.get("inflight", 0)),
            max_queue=int(d.get("max_queue", 0)),
        )

    def matches(self, where: Mapping[str, Any] | None) -> bool:
        """True when every ``key=value`` of ``where`` equals this agent's metadata."""
        if not where:
            return True
        return all(k in self.metadata and str(self.metadata[k]) == str(v) for k, v in where.items())

    @property
    def routable(self) -> bool:
        """Active, ready and not draining: may be given new work."""
        return self.state == "active" and self.ready and not self.draining


class SweepResult(msgspec.Struct):
    """What one sweep did; ``locked`` means another runtime holds the sweeper lock."""

    locked: bool = False
    due: int = 0
    probation: int = 0
    evicted: list[str] = []
    deleted: int = 0


class Event(msgspec.Struct):
    """One registry event (``type`` is registered, ready, draining, unstable, ...)."""

    id: str
    type: str
    agent_id: str
    instance_id: str
    ts: int


class Registry:
    """Registry operations for one namespace on one Redis (standalone or Cluster)."""

    def __init__(self, redis: AnyRedis, namespace: str, *, events_maxlen: int = EVENTS_MAXLEN):
        self.redis = redis
        self.keys = Keys(namespace)
        self.events_maxlen = events_maxlen

    # -- writes -----------------------------------------------------------------------
    def register_args(
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
    ) -> tuple[list[str], list[Any]]:
        """The KEYS and ARGV of ``register.lua`` (shared by the async and sync paths)."""
        k = self.keys
        agent_id = agent_key_id(agent_id)
        caps = normalize_capabilities(capabilities)
        keys = [k.agents, k.agent(agent_id), k.caps, k.events, k.cap_prefix]
        args = [
            agent_id, instance_id, version, weight, ",".join(caps),
            json.dumps(dict(metadata or {}), separators=(",", ":"), default=str),
            lease_ms, evict_after_ms, self.events_maxlen,
            json.dumps(dict(card), separators=(",", ":")) if card else "",
            "1" if ready else "0", max_queue,
        ]  # fmt: skip
        return keys, args

    @staticmethod
    def check_register_reply(agent_id: str, version: int, reply: list[Any]) -> int:
        code = int(reply[0])
        if code < 0:
            raise StaleRegistration(
                f"Agent {agent_id!r} is registered with a newer version ({as_text(reply[1])}) than "
                f"this process ({version}): another process took over this agent_id. Stop "
                "this one, or give it another agent_id."
            )
        return code

    async def register(self, agent_id: str, **kw: Any) -> int:
        """Register (or re-register) an agent; returns 1 new, 2 replaced.

        Raises :class:`StaleRegistration` when a newer version is stored.
        """
        keys, args = self.register_args(agent_id, **kw)
        reply = await scripts.call(self.redis, "register", keys, args)
        return self.check_register_reply(agent_id, kw["version"], reply)

    def heartbeat_args(
        self, agent_id: str, *, instance_id: str, version: int, queue_depth: int, inflight: int
    ) -> tuple[list[str], list[Any]]:
        k = self.keys
        agent_id = agent_key_id(agent_id)
        return (
            [k.agents, k.agent(agent_id), k.events],
            [agent_id, instance_id, version, queue_depth, inflight, self.events_maxlen],
        )

    async def heartbeat(
        self,
        agent_id: str,
        *,
        instance_id: str,
        version: int,
        queue_depth: int = 0,
        inflight: int = 0,
    ) -> tuple[int, bool]:
        """Renew the lease. Returns ``(code, draining)``; code as in ``heartbeat.lua``."""
        keys, args = self.heartbeat_args(
            agent_id, instance_id=instance_id, version=version,
            queue_depth=queue_depth, inflight=inflight,
        )  # fmt: skip
        reply = await scripts.call(self.redis, "heartbeat", keys, args)
        return int(reply[0]), bool(int(reply[1]))

    async def deregister(self, agent_id: str, *, instance_id: str = "") -> int:
        """Remove an agent (only ``instance_id``'s registration, when given)."""
        k = self.keys
        agent_id = agent_key_id(agent_id)
        return int(
            await scripts.call(
                self.redis, "deregister",
                [k.agents, k.agent(agent_id), k.caps, k.events, k.cap_prefix],
                [agent_id, instance_id, self.events_maxlen],
            )
        )  # fmt: skip

    async def mark_ready(self, agent_id: str, *, instance_id: str, ready: bool = True) -> int:
        """Set readiness; returns 1 set, 0 not registered, -1 owned by another instance."""
        k = self.keys
        agent_id = agent_key_id(agent_id)
        return int(
            await scripts.call(
                self.redis, "mark_ready", [k.agent(agent_id), k.events],
                [agent_id, instance_id, "1" if ready else "0", self.events_maxlen],
            )
        )  # fmt: skip

    async def drain(self, agent_id: str) -> int:
        """Ask an agent to drain. Raises :class:`UnknownAgent` when it is not live."""
        k = self.keys
        agent_id = agent_key_id(agent_id)
        code = int(
            await scripts.call(
                self.redis, "drain", [k.agent(agent_id), k.events],
                [agent_id, self.events_maxlen],
            )
        )  # fmt: skip
        if code == 0:
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
    ) -> SweepResult:
        """Advance every due lease (probation, eviction, shadow deletion).

        With ``lock_ms > 0`` only the holder of the sweeper lock sweeps; others get
        ``locked=True``. Loops over batches until nothing due is left.
        """
        k = self.keys
        total = SweepResult()
        while True:
            reply = await scripts.call(
                self.redis, "sweep",
                [k.agents, k.caps, k.events, k.sweeper_lock, k.cap_prefix, k.agent_prefix,
                 k.reroute],
                [owner, lock_ms, shadow_ttl_ms, batch, self.events_maxlen],
            )  # fmt: skip
            if int(reply[0]) < 0:
                total.locked = True
                return total
            due, prob, _n_evicted, dele = (int(x) for x in reply[:4])
            total.due += due
            total.probation += prob
            total.deleted += dele
            total.evicted += [as_text(x) for x in reply[4:]]
            if due < batch:
                return total

    # -- reads ------------------------------------------------------------------------
    async def get(self, agent_id: str) -> AgentInfo | None:
        """The agent's record (live or shadow), or None."""
        h = await self.redis.hgetall(self.keys.agent(agent_id))
        return AgentInfo.from_hash(h) if h else None

    async def agent_ids(self, capability: str | None = None) -> list[str]:
        """Ids of the live agents of ``capability``, or of every known agent (shadows too)."""
        if capability is None:
            ids = await self.redis.zrange(self.keys.agents, 0, -1)
        else:
            ids = await self.redis.smembers(self.keys.cap(normalize_capability(capability)))
        return sorted(as_text(i) for i in ids)

    async def agents(
        self,
        capability: str | None = None,
        *,
        state: str | None = None,
        ready: bool | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> list[AgentInfo]:
        """Agents, optionally of one capability, filtered by state, readiness and metadata."""
        if state is not None and state not in STATES:
            raise ValueError(f"Unknown state {state!r}: use one of {', '.join(STATES)}.")
        ids = await self.agent_ids(capability)
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for i in ids:
            pipe.hgetall(self.keys.agent(i))
        out = []
        for h in await pipe.execute():
            if not h:
                continue
            a = AgentInfo.from_hash(h)
            if state is not None and a.state != state:
                continue
            if ready is not None and a.ready != ready:
                continue
            if a.matches(where):
                out.append(a)
        return out

    async def capabilities(self) -> list[tuple[str, int]]:
        """Every capability with at least one live agent, with how many declare it."""
        rows = await self.redis.zrange(self.keys.caps, 0, -1, withscores=True)
        return [(as_text(c), int(n)) for c, n in rows]

    async def events(self, *, after: str = "-", count: int = 100) -> list[Event]:
        """Registry events after id ``after`` (exclusive), oldest first."""
        start = "-" if after in ("-", "0", "") else f"({after}"
        rows = await self.redis.xrange(self.keys.events, start, "+", count=count)
        return [_event(i, f) for i, f in rows]

    async def recent_events(self, count: int = 50) -> list[Event]:
        """The last ``count`` registry events, oldest first."""
        rows = await self.redis.xrevrange(self.keys.events, "+", "-", count=count)
        return [_event(i, f) for i, f in reversed(rows)]

    async def tail_events(self, *, last_id: str = "$", block_ms: int = 1000) -> list[Event]:
        """Wait up to ``block_ms`` for events newer than ``last_id``."""
        res = await self.redis.xread({self.keys.events: last_id}, block=block_ms, count=100)
        return [_event(i, f) for _, rows in res for i, f in rows] if res else []


def _event(entry_id: bytes | str, fields: Mapping[bytes | str, bytes | str]) -> Event:
    f = {as_text(k): as_text(v) for k, v in fields.items()}
    return Event(
        id=as_text(entry_id),
        type=f.get("type", ""),
        agent_id=f.get("agent_id", ""),
        instance_id=f.get("instance_id", ""),
        ts=int(f.get("ts", 0)),
    )

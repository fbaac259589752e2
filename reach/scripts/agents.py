"""Typed calls of the registry scripts: register, heartbeat, heartbeat_many, mark_ready,
drain, deregister, sweep, count_agents, and server_time (the clock of the registry's node)
(``lua/<name>.lua``; each header is the contract).

Each method of :class:`RegistryScripts` encodes its arguments into KEYS and ARGV and
returns a :class:`~reach.scripts.Call` whose reply decodes into the script's code (an
IntEnum of :mod:`reach.scripts.codes`) or a small frozen result. Each call touches one
registry shard (one hash slot, :class:`reach.keys.Keys`): an agent's calls its own shard's,
``heartbeat_many`` the one shard of all its agents, ``sweep`` and ``count_agents`` the shard
named, ``server_time`` shard 0's; so these are the same on standalone Redis and on a
Cluster.

The values are encoded, not judged: :class:`reach.Registry` checks them against the limits
of its module (and raises ``ConfigError``); a value out of contract is refused by the
script itself (``reach: bad ...``) with nothing written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._version import PROTOCOL_VERSION
from ..keys import Keys
from ._call import Call, as_int, as_text, code_of
from .codes import (
    DeregisterCode,
    DrainCode,
    HeartbeatCode,
    MarkReadyCode,
    RegisterCode,
    SweepCode,
)


@dataclass(frozen=True, slots=True)
class Registration:
    """``register.lua``'s answer. ``now_ms``: the server time of the registration (NEW,
    REPLACED); ``stored_version``: the newer version that refused it (STALE). REPLACED of
    another instance's registration: ``replaced_instance``, its ``replaced_host`` and
    ``replaced_pid`` ('' when it stored none), ``replaced_live``: its lease still ran."""

    code: RegisterCode
    now_ms: int = 0
    stored_version: str = ""
    replaced_instance: str = ""
    replaced_host: str = ""
    replaced_pid: str = ""
    replaced_live: bool = False


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """``heartbeat.lua``'s answer; ``draining``: an operator asked the agent to drain."""

    code: HeartbeatCode
    draining: bool = False


@dataclass(frozen=True, slots=True)
class Swept:
    """What one ``sweep.lua`` call did (``locked``: another runtime holds the sweeper
    lock, nothing was done). ``evicted`` holds the evicted ids as Redis gave them (bytes:
    an id is untrusted until decoded). ``due == batch`` means more may be due."""

    locked: bool = False
    due: int = 0
    probation: int = 0
    deleted: int = 0
    evicted: tuple[Any, ...] = ()


def decode_registration(reply: Any) -> Registration:
    """``register.lua``'s raw reply as a :class:`Registration`."""
    code = RegisterCode(as_int(reply[0]))
    if code is RegisterCode.STALE:
        return Registration(code, stored_version=as_text(reply[1]))
    if len(reply) >= 6:
        return Registration(
            code,
            now_ms=as_int(reply[1]),
            replaced_instance=as_text(reply[2]),
            replaced_host=as_text(reply[3]),
            replaced_pid=as_text(reply[4]),
            replaced_live=as_text(reply[5]) == "1",
        )
    return Registration(code, now_ms=as_int(reply[1]))


@dataclass(frozen=True, slots=True)
class Beat:
    """One agent's part of a ``heartbeat_many.lua`` call (``agent_id``: the id its keys
    are named by)."""

    agent_id: str
    instance_id: str
    version: int
    queue_depth: int = 0
    inflight: int = 0
    slots: int = 0
    handler_us: int = 0
    cap_us: str | None = None
    """Per-capability mean run times, ``"<capability>=<µs> ..."`` (heartbeat.lua's
    ARGV[9]); None: not reported (the record's are left as they are)."""


@dataclass(frozen=True, slots=True)
class AgentCounts:
    """``count_agents.lua``'s answer: ``total`` agents in the agents zset, of which
    ``looked`` records were read (all of them, or a uniform random sample), and what those
    records hold: per lease state, routable (active, ready, not draining), ``other`` (no
    readable record or state). :meth:`scaled` estimates the whole namespace's counts."""

    total: int
    looked: int
    active: int
    probation: int
    evicted: int
    routable: int
    other: int

    @property
    def exact(self) -> bool:
        """Every record was read: the counts are the namespace's, not an estimate."""
        return self.looked >= self.total

    def scaled(self) -> tuple[dict[str, int], int]:
        """``({state: agents}, routable)`` for the whole namespace: the counts as read when
        :attr:`exact`, else each scaled by ``total / looked`` (rounded)."""
        f = 1.0 if self.exact or not self.looked else self.total / self.looked
        counts = {
            "active": round(self.active * f),
            "probation": round(self.probation * f),
            "evicted": round(self.evicted * f),
        }
        return counts, round(self.routable * f)


def server_time(reply: Any) -> tuple[int, int]:
    """``server_time.lua``'s reply (``TIME``'s) as ``(seconds, microseconds)``."""
    return as_int(reply[0]), as_int(reply[1])


def _counts(reply: Any) -> AgentCounts:
    return AgentCounts(*(as_int(x) for x in reply[:7]))


MAX_BEATS = 1000
"""Most agents in one ``heartbeat_many.lua`` call (the script refuses more)."""


def _heartbeat(reply: Any) -> Heartbeat:
    return Heartbeat(HeartbeatCode(as_int(reply[0])), bool(as_int(reply[1])))


def _heartbeats(reply: Any) -> list[Heartbeat]:
    return [
        Heartbeat(HeartbeatCode(as_int(reply[i])), bool(as_int(reply[i + 1])))
        for i in range(0, len(reply), 2)
    ]


def _swept(reply: Any) -> Swept:
    if as_int(reply[0]) == SweepCode.LOCKED:
        return Swept(locked=True)
    due, probation, _n_evicted, deleted = (as_int(x) for x in reply[:4])
    return Swept(due=due, probation=probation, deleted=deleted, evicted=tuple(reply[4:]))


_deregistered = code_of(DeregisterCode)
_marked = code_of(MarkReadyCode)
_drained = code_of(DrainCode)


@dataclass(frozen=True, slots=True)
class RegistryScripts:
    """The registry scripts of one namespace (``keys``), whose events stream is trimmed to
    about ``events_maxlen`` entries. ``agent_id`` is always the id the agent's keys are
    named by (braces removed)."""

    keys: Keys
    events_maxlen: int

    def _hash_and_prefixes(self, agent_id: str) -> tuple[str, ...]:
        k, s = self.keys, self.keys.shard(agent_id)
        return (
            k.agents_of(s),
            k.agent(agent_id),
            k.caps_of(s),
            k.events_of(s),
            k.cap_prefix_of(s),
            k.agent_prefix_of(s),
        )

    def register(
        self,
        agent_id: str,
        *,
        instance_id: str,
        version: int,
        weight: float,
        capabilities: Sequence[str],
        metadata_json: str,
        lease_ms: int,
        evict_after_ms: int,
        card_json: str = "",
        ready: bool = False,
        max_queue: int = 0,
        slots: int = 0,
        protocol: int = PROTOCOL_VERSION,
        host: str | None = None,
        pid: int | None = None,
        app_version: str = "",
    ) -> Call[Registration]:
        """Register ``agent_id``, or replace an older registration of it.
        ``capabilities``: normalised names; ``metadata_json`` and ``card_json`` (``''``:
        none): JSON objects as text; ``protocol``: the protocol version the record states;
        ``host`` and ``pid`` (both or neither): the process, stored so that a registration
        replacing this one can name it; ``app_version``: the application version the agent
        runs (``''``: none; sent with host and pid, ``''`` and 0 when they are not given)."""
        args: tuple[Any, ...] = (
            agent_id,
            instance_id,
            version,
            repr(float(weight)),
            ",".join(capabilities),
            metadata_json,
            lease_ms,
            evict_after_ms,
            self.events_maxlen,
            card_json,
            "1" if ready else "0",
            max_queue,
            slots,
            protocol,
        )
        if host is not None and pid is not None:
            args = (*args, host, pid)
        if app_version:  # ARGV[17] comes after host and pid
            args = (*args, app_version) if len(args) == 16 else (*args, "", 0, app_version)
        return Call("register", self._hash_and_prefixes(agent_id), args, decode_registration)

    def heartbeat(
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
    ) -> Call[Heartbeat]:
        """Renew the lease of ``instance_id``'s registration and report its load
        (``cap_us``: per-capability mean run times, as :class:`Beat` says)."""
        s = self.keys.shard(agent_id)
        keys = (self.keys.agents_of(s), self.keys.agent(agent_id), self.keys.events_of(s))
        load = (queue_depth, inflight, slots, handler_us)
        args: tuple[str | int, ...] = (agent_id, instance_id, version, *load, self.events_maxlen)
        if cap_us is not None:
            args += (cap_us,)
        return Call("heartbeat", keys, args, _heartbeat)

    def heartbeat_many(self, beats: Sequence[Beat]) -> Call[list[Heartbeat]]:
        """Renew the leases of ``beats`` (1..:data:`MAX_BEATS` agents, all of one registry
        shard: :meth:`reach.keys.Keys.shard`) in one call; the answers come in the same
        order. Raises ValueError for agents of several shards (one call is one slot)."""
        shards = {self.keys.shard(b.agent_id) for b in beats}
        if len(shards) > 1:
            raise ValueError(
                f"heartbeat_many renews the agents of one registry shard, got shards "
                f"{sorted(shards)}: group the agents by Keys.shard(agent_id)"
            )
        s = shards.pop() if shards else 0
        k = self.keys
        keys = (k.agents_of(s), k.events_of(s), *(k.agent(b.agent_id) for b in beats))
        args: list[str | int] = [self.events_maxlen]
        # Per-capability run times (an 8th argument per agent) when any beat reports them.
        caps = any(b.cap_us is not None for b in beats)
        for b in beats:
            args += [b.agent_id, b.instance_id, b.version, b.queue_depth, b.inflight]
            args += [b.slots, b.handler_us]
            if caps:
                args.append(b.cap_us or "")
        return Call("heartbeat_many", keys, tuple(args), _heartbeats)

    def deregister(self, agent_id: str, *, instance_id: str = "") -> Call[DeregisterCode]:
        """Remove the registration (only ``instance_id``'s, when given); a removed agent is
        listed in its shard's reroute set and left zset (its late arrivals get moved)."""
        args = (agent_id, instance_id, self.events_maxlen)
        k, s = self.keys, self.keys.shard(agent_id)
        keys = (*self._hash_and_prefixes(agent_id), k.reroute_of(s), k.left_of(s))
        return Call("deregister", keys, args, _deregistered)

    def mark_ready(self, agent_id: str, *, instance_id: str, ready: bool) -> Call[MarkReadyCode]:
        """Set the readiness of ``instance_id``'s registration."""
        args = (agent_id, instance_id, "1" if ready else "0", self.events_maxlen)
        events = self.keys.events_of(self.keys.shard(agent_id))
        return Call("mark_ready", (self.keys.agent(agent_id), events), args, _marked)

    def drain(self, agent_id: str, *, instance_id: str = "") -> Call[DrainCode]:
        """Mark the agent draining; only ``instance_id``'s registration when given
        (``''``: whatever instance is registered, an operator's drain)."""
        args = (agent_id, self.events_maxlen, instance_id)
        events = self.keys.events_of(self.keys.shard(agent_id))
        return Call("drain", (self.keys.agent(agent_id), events), args, _drained)

    def sweep(
        self, *, owner: str, lock_ms: int, shadow_ttl_ms: int, batch: int, shard: int = 0
    ) -> Call[Swept]:
        """One sweep of at most ``batch`` due agents of registry shard ``shard``, under
        that shard's sweeper lock (``lock_ms`` 0: without the lock)."""
        k, s = self.keys, shard
        keys = (
            k.agents_of(s),
            k.caps_of(s),
            k.events_of(s),
            k.sweeper_lock_of(s),
            k.cap_prefix_of(s),
            k.agent_prefix_of(s),
            k.reroute_of(s),
        )
        args = (owner, lock_ms, shadow_ttl_ms, batch, self.events_maxlen)
        return Call("sweep", keys, args, _swept)

    def count_agents(self, *, sample: int, shard: int = 0) -> Call[AgentCounts]:
        """Count registry shard ``shard``'s agents by state, reading at most ``sample``
        records (all of them when there are no more; else a uniform random sample)."""
        keys = (self.keys.agents_of(shard), self.keys.agent_prefix_of(shard))
        return Call("count_agents", keys, (sample,), _counts)

    def server_time(self) -> Call[tuple[int, int]]:
        """Redis's clock (``TIME``: epoch seconds, microseconds) read on the node of
        registry shard 0, routed by its agents zset like the registry's other calls (on a
        Cluster a keyless ``TIME`` would take a connection of its own to some master).
        What :mod:`reach.clock` measures a process's offset with."""
        return Call("server_time", (self.keys.agents_of(0),), (), server_time)

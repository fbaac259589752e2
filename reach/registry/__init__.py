"""The capability registry: who is alive, what they can do, and how loaded they are.

Every change is one Lua script (``lua/register.lua`` ...), atomic in one registry shard's
hash slot. The registry of a namespace is partitioned into shards by agent id
(:func:`reach.keys.shard_of`): an agent's record, lease, capability-set entries and events
live in its shard, so heartbeats, sweeps and lookups spread over a Cluster's masters. One
shard on a standalone Redis or Sentinel, :data:`reach.keys.CLUSTER_SHARDS` on a Cluster
(:func:`default_shards`). Reads of the whole namespace (every agent, a capability's agents,
the capabilities, the events) read every shard in one pipeline. Times are the Redis
server's clock.

Limits. The scripts refuse (and :class:`Registry` raises :class:`~reach.ConfigError` for)
arguments outside these bounds, so every stored record is one any reader can use:
agent and instance ids 1..256 bytes of UTF-8 (no ``{``/``}``); versions 0..2^53-1;
``0 < weight <= 1000``; ``lease_ms`` and ``evict_after_ms`` 1 ms..1 day; ``max_queue``
0..10^9; 1..1000 capabilities of at most 200 bytes; metadata a JSON object of at most
64 KiB, the card one of at most 256 KiB (both nested at most 64 deep); sweeper
``lock_ms`` 0..1 hour, ``shadow_ttl_ms`` 1 ms..30 days.

Untrusted records. Anyone holding the namespace's keys can write a record behind the
scripts' back. Readers never fail on one: a record that cannot be read (a field that is
not a number, metadata that is not a JSON object, bytes that are not UTF-8...) is left
out (so never routed to) and logged once (:func:`parse_agent`); an unreadable event is
read with replacement characters (:class:`Event`).

The package's modules: :mod:`.records` (the limits, capability names, :class:`AgentInfo`,
:class:`Event` and their reading from Redis) and :mod:`.operations` (:class:`Registry`: the
scripts and reads over the shards).
"""

from .operations import (
    Registry,
    default_shards,
    refusal,
)
from .records import (
    APP_VERSION_RE,
    AUDITED_KEY,
    CAPABILITY_RE,
    EVENTS_MAXLEN,
    IDEMPOTENT_KEY,
    MAX_ADVERTISED_TIMEOUT_S,
    MAX_BATCH,
    MAX_CAPABILITIES,
    MAX_CAPABILITY_BYTES,
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
    TIMEOUTS_KEY,
    AgentInfo,
    BadRecord,
    Event,
    SweepResult,
    advertised_timeout,
    agent_key_id,
    check_app_version,
    decode_id,
    normalize_capabilities,
    normalize_capability,
    parse_agent,
    unknown_capability,
)

__all__ = [
    "APP_VERSION_RE",
    "AUDITED_KEY",
    "CAPABILITY_RE",
    "EVENTS_MAXLEN",
    "IDEMPOTENT_KEY",
    "MAX_ADVERTISED_TIMEOUT_S",
    "MAX_BATCH",
    "MAX_CAPABILITIES",
    "MAX_CAPABILITY_BYTES",
    "MAX_CARD_BYTES",
    "MAX_EVENTS_MAXLEN",
    "MAX_ID_BYTES",
    "MAX_LEASE_MS",
    "MAX_LOAD",
    "MAX_LOCK_MS",
    "MAX_METADATA_BYTES",
    "MAX_QUEUE",
    "MAX_SHADOW_TTL_MS",
    "MAX_VERSION",
    "MAX_WEIGHT",
    "STATES",
    "TIMEOUTS_KEY",
    "AgentInfo",
    "BadRecord",
    "Event",
    "Registry",
    "SweepResult",
    "advertised_timeout",
    "agent_key_id",
    "check_app_version",
    "decode_id",
    "default_shards",
    "normalize_capabilities",
    "normalize_capability",
    "parse_agent",
    "refusal",
    "unknown_capability",
]

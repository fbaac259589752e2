"""Helpers shared by the registry tests (Lua scripts, concurrency, cluster, NOSCRIPT).

Everything goes through :class:`reach.registry.Registry` or plain reads of the keys that
:class:`reach.keys.Keys` builds; nothing here writes to Redis behind the scripts' back.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any, TypeVar

from reach.registry import Registry
from tests.support.waiting import wait_until as wait_until  # noqa: PLC0414 (re-exported)

T = TypeVar("T")

LONG_LEASE_MS = 60_000
LONG_EVICT_MS = 120_000

_last_version = 0


def new_version() -> int:
    """A start stamp in microseconds (like the runtime's), strictly increasing here."""
    global _last_version
    _last_version = max(time.time_ns() // 1000, _last_version + 1)
    return _last_version


def new_instance() -> str:
    return uuid.uuid4().hex[:12]


async def register(
    reg: Registry,
    agent_id: str,
    capabilities: Iterable[str] = ("text.summarize",),
    *,
    instance_id: str | None = None,
    version: int | None = None,
    lease_ms: int = LONG_LEASE_MS,
    evict_after_ms: int = LONG_EVICT_MS,
    **kw: Any,
) -> tuple[int, str, int]:
    """Register ``agent_id``; returns ``(code, instance_id, version)``."""
    instance_id = instance_id or new_instance()
    version = version if version is not None else new_version()
    code = await reg.register(
        agent_id,
        instance_id=instance_id,
        version=version,
        capabilities=list(capabilities),
        lease_ms=lease_ms,
        evict_after_ms=evict_after_ms,
        **kw,
    )
    return code, instance_id, version


def _s(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


async def _shard_snapshot(reg: Registry, shard: int) -> dict[str, Any]:
    r, k = reg.redis, reg.keys
    agent_prefix, cap_prefix = k.agent_prefix_of(shard), k.cap_prefix_of(shard)
    zset_ids = {_s(i) for i in await r.zrange(k.agents_of(shard), 0, -1)}
    hash_keys = [_s(x) async for x in r.scan_iter(match=f"{agent_prefix}*", count=1000)]
    set_keys = [_s(x) async for x in r.scan_iter(match=f"{cap_prefix}*", count=1000)]
    hashes: dict[str, dict[str, str]] = {}
    for key in hash_keys:
        h = await r.hgetall(key)
        if h:
            hashes[key[len(agent_prefix) :]] = {_s(a): _s(b) for a, b in h.items()}
    sets: dict[str, set[str]] = {}
    for key in set_keys:
        members = {_s(m) for m in await r.smembers(key)}
        if members:
            sets[key[len(cap_prefix) :]] = members
    caps = {_s(c): int(n) for c, n in await r.zrange(k.caps_of(shard), 0, -1, withscores=True)}
    return {"zset_ids": zset_ids, "hashes": hashes, "sets": sets, "caps": caps}


async def registry_snapshot(reg: Registry) -> dict[str, Any]:
    """Read every registry key of the namespace (agents zset, hashes, cap sets, caps zset)
    of every shard: ``shards`` holds each shard's, the other keys their union (sets merged,
    caps summed)."""
    shards = [await _shard_snapshot(reg, k) for k in range(reg.shards)]
    sets: dict[str, set[str]] = {}
    caps: dict[str, int] = {}
    for snap in shards:
        for cap, members in snap["sets"].items():
            sets.setdefault(cap, set()).update(members)
        for cap, n in snap["caps"].items():
            caps[cap] = caps.get(cap, 0) + n
    return {
        "zset_ids": set().union(*(s["zset_ids"] for s in shards)),
        "hashes": {i: h for s in shards for i, h in s["hashes"].items()},
        "sets": sets,
        "caps": caps,
        "shards": shards,
    }


async def assert_consistent(
    reg: Registry, *, allow_expired_shadows: bool = False
) -> dict[str, Any]:
    """Check the registry invariants of one namespace and return the snapshot.

    * each live (active/probation) agent is in exactly the capability sets it declares;
    * an evicted shadow is in no capability set; no set names an agent without a hash;
    * the ``caps`` zset score of each capability equals its set's cardinality, and it
      lists exactly the capabilities with a non-empty set;
    * every agent hash has an entry in the agents zset (else no sweep would ever see it),
      and every zset entry has a hash (unless shadows may have expired by TTL);
    * all of it per registry shard: an agent's hash, lease and set entries in its shard.
    """
    snap = await registry_snapshot(reg)
    for shard, part in enumerate(snap["shards"]):
        _assert_shard_consistent(reg, shard, part, allow_expired_shadows)
    return snap


def _assert_shard_consistent(
    reg: Registry, shard: int, snap: dict[str, Any], allow_expired_shadows: bool
) -> None:
    hashes: dict[str, dict[str, str]] = snap["hashes"]
    expected: dict[str, set[str]] = {}
    for agent_id, h in hashes.items():
        assert reg.shard_of(agent_id) == shard, (agent_id, shard)
        assert h.get("agent_id") == agent_id, (agent_id, h)
        assert h.get("state") in ("active", "probation", "evicted"), (agent_id, h)
        if h["state"] == "evicted":
            continue
        for cap in filter(None, h.get("caps", "").split(",")):
            expected.setdefault(cap, set()).add(agent_id)
    assert snap["sets"] == expected, {"shard": shard, "sets": snap["sets"], "expected": expected}
    assert snap["caps"] == {c: len(m) for c, m in expected.items()}, (shard, snap["caps"], expected)
    assert set(hashes) <= snap["zset_ids"], (shard, set(hashes) - snap["zset_ids"])
    if not allow_expired_shadows:
        assert snap["zset_ids"] <= set(hashes), (shard, snap["zset_ids"] - set(hashes))

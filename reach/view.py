"""The client's local view of the registry: a pick reads memory, never Redis.

The view holds every agent of the namespace. It is kept fresh three ways:

* it tails the registry events stream (``XREAD BLOCK``) and re-reads the agent an event
  names, so a registration, readiness change, drain or eviction is seen within one round
  trip of the event;
* it re-reads everything every ``refresh_s`` (load figures that heartbeats report, such as
  queue depth, emit no event), and
* a caller that suspects an agent (a failed delivery) asks for :meth:`RegistryView.recheck`.

When the view is older than ``max_staleness_s`` (the event tail is broken, Redis was
away) the next read refreshes it first.

Whatever the registry holds, the view keeps going: a record that cannot be read is left
out (never routed to) and logged once, an unreadable event is skipped, and the background
tasks survive any error (logged, rate-limited) rather than take the process down. ``version`` counts changes that matter to routing
(membership, state, readiness, draining, weight, capabilities, metadata) and not load
figures, so the router's cached structures stay valid across heartbeats.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
from redis import exceptions as rexc

from .connection import AnyRedis
from .logs import OutageLog
from .registry import AgentInfo, Registry, decode_id

log = logging.getLogger("reach.view")

_EVENTS_PER_READ = 200


def _static(a: AgentInfo) -> tuple[Any, ...]:
    return (
        a.state,
        a.ready,
        a.draining,
        a.weight,
        a.ready_ms,
        tuple(a.capabilities),
        repr(sorted(a.metadata.items())),
        a.instance_id,
    )


class RegistryView:
    """A snapshot of the namespace's agents, by capability, with a change counter."""

    def __init__(
        self,
        registry: Registry,
        *,
        refresh_s: float = 2.0,
        max_staleness_s: float = 5.0,
        on_gone: Callable[[str], None] | None = None,
        name: str = "registry view",
    ) -> None:
        """``on_gone(agent_id)`` is called when an agent's record left the registry
        (deregistered, or its shadow expired), so per-agent state elsewhere can go too.
        ``name`` starts its log lines about Redis outages (e.g. ``"client c-42: registry
        view"``)."""
        self.registry = registry
        self.on_gone = on_gone
        self.refresh_s = refresh_s
        self.max_staleness_s = max_staleness_s
        self.version = 0
        self._agents: dict[str, AgentInfo] = {}
        self._by_cap: dict[str, list[AgentInfo]] = {}
        self._loaded_at = 0.0
        self._last_event = "$"
        self._lock = anyio.Lock()
        self._running = False
        self._last_unexpected = -1e9
        # Redis away: a few lines per outage (start, reminders, end), not one per retry.
        self._tail_outage = OutageLog(log, f"{name}: reading registry events")
        self._refresh_outage = OutageLog(log, f"{name}: periodic refresh")

    @property
    def redis(self) -> AnyRedis:
        return self.registry.redis

    @property
    def age_s(self) -> float:
        return time.monotonic() - self._loaded_at if self._loaded_at else float("inf")

    async def candidates(self, capability: str) -> tuple[list[AgentInfo], int]:
        """Agents declaring ``capability`` (any state) and the view's version."""
        limit = self.max_staleness_s if self._running else self.refresh_s
        if self.age_s > limit:
            async with self._lock:
                if self.age_s > limit:  # callers that waited on the lock find it fresh
                    await self._reload()
        return self._by_cap.get(capability, []), self.version

    def invalidate(self) -> None:
        """Make the next read refresh from Redis."""
        self._loaded_at = 0.0

    async def refresh(self) -> None:
        """Re-read every agent of the namespace."""
        async with self._lock:
            await self._reload()

    async def _reload(self) -> None:
        ids = await self.registry.agent_ids()
        found = await self.registry.read_agents(ids)
        self._apply({a.agent_id: a for a in found.values() if a is not None}, replace=True)
        self._loaded_at = time.monotonic()

    async def recheck(self, agent_id: str) -> None:
        """Re-read one agent now (after a failed delivery to it)."""
        self._apply(await self.registry.read_agents([agent_id]), replace=False)

    def _apply(self, new: dict[str, AgentInfo | None], *, replace: bool) -> None:
        changed = False
        old = self._agents
        merged: dict[str, AgentInfo] = {} if replace else dict(old)
        for agent_id, a in new.items():
            if a is None:
                if merged.pop(agent_id, None) is not None or agent_id in old:
                    changed = True
                continue
            prev = old.get(agent_id)
            if prev is None or _static(prev) != _static(a):
                changed = True
            merged[agent_id] = a
        gone = set(old) - set(merged)
        if gone:
            changed = True
        self._agents = merged
        if changed:
            self.version += 1
        # Rebuilt every time: load figures change the objects even when the version stays.
        by_cap: dict[str, list[AgentInfo]] = {}
        for a in sorted(merged.values(), key=lambda x: x.agent_id):
            for c in a.capabilities:
                by_cap.setdefault(c, []).append(a)
        self._by_cap = by_cap
        if self.on_gone is not None:
            for agent_id in gone:
                self.on_gone(agent_id)

    async def run(self) -> None:
        """Keep the view fresh until cancelled (events, plus a periodic full refresh)."""
        self._running = True
        try:
            try:
                last = await self.redis.xrevrange(self.registry.keys.events, "+", "-", count=1)
                self._last_event = last[0][0] if last else "0"
                await self.refresh()
            except (rexc.RedisError, OSError) as e:
                log.warning("registry view: initial load failed (%s)", e)
            except Exception:  # noqa: BLE001 - the periodic refresh tries again
                self._unexpected("initial load")
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._tail)
                tg.start_soon(self._periodic)
        finally:
            self._running = False

    async def _periodic(self) -> None:
        while True:
            await anyio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except (rexc.RedisError, OSError) as e:
                self._refresh_outage.failed(e)
            except Exception:  # noqa: BLE001 - a bug or bad data must not stop the process
                self._unexpected("refresh")
            else:
                self._refresh_outage.ok()

    async def _tail(self) -> None:
        key = self.registry.keys.events
        while True:
            try:
                res = await self.redis.xread(
                    {key: self._last_event}, block=1000, count=_EVENTS_PER_READ
                )
            except (rexc.RedisError, OSError) as e:
                self._tail_outage.failed(e)
                await anyio.sleep(0.2)
                continue
            except Exception:  # noqa: BLE001 - e.g. a reply redis-py cannot parse
                self._unexpected("events read")
                await anyio.sleep(0.2)
                continue
            if not res:
                self._tail_outage.ok()
                continue
            try:
                ids = self._named(res)
                self._apply(await self.registry.read_agents(sorted(ids)), replace=False)
            except (rexc.RedisError, OSError) as e:
                self._tail_outage.failed(e)
                continue
            except Exception:  # noqa: BLE001 - a bug or bad data must not stop the process
                self._unexpected("update")
            self._tail_outage.ok()

    def _named(self, res: Any) -> set[str]:
        """Agent ids the events name (the last id read is kept even when the entry is bad:
        a bad entry is passed over, never read again)."""
        ids: set[str] = set()
        for _, entries in res:
            for entry_id, fields in entries:
                self._last_event = entry_id
                raw = fields.get(b"agent_id") or fields.get("agent_id")
                if isinstance(raw, bytes | str) and raw:
                    a = decode_id(raw, namespace=self.registry.namespace, where="events stream")
                    if a:
                        ids.add(a)
        return ids

    def _unexpected(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_unexpected >= 10.0:  # one traceback per 10 s at most
            self._last_unexpected = now
            log.exception("registry view %s failed unexpectedly; going on", what)

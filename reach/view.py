"""The client's local view of the registry: a pick reads memory, never Redis.

The view's cost follows changes and the capabilities this process calls, never the size of
the fleet (docs/architecture.md, "The registry view"):

* **Lazy, per capability.** The view holds only the agents of the capabilities it was asked
  for. The first :meth:`RegistryView.candidates` of a capability loads it (its capability
  set, then its agents' records); a process that never calls (a worker that only serves)
  never reads the registry at all, and with :meth:`RegistryView.attach` its background
  tasks start only on that first call.
* **Events.** Once started, it tails the registry events streams (one per registry shard,
  :mod:`reach.registry`) and re-reads an agent an event names when the view holds that
  agent (or a ``registered`` event could add it to a loaded capability), so a
  registration, readiness change, drain or eviction is seen within one round trip of the
  event (one shard: ``XREAD BLOCK``), or within ``poll_s`` (several shards, whose streams
  are in several slots that one read cannot wait on: one pipeline of non-blocking
  ``XREAD``s, one per shard, every ``poll_s``).
* **A cheap consistency check** every ``refresh_s``: one ``XINFO STREAM`` per shard's
  events stream (one pipeline), whose ``entries-added`` counts every event ever written
  (trimming does not lower it). When the view has read up to a stream's last id but
  counted fewer entries, events were lost (trimmed before it read them, deleted); when the
  stream's last id went back, the stream was recreated or a failover lost events: either
  way the view re-reads the capabilities it holds (only those).
* **Load figures** (queue depth, in flight) that heartbeats report emit no event: the
  records of the capabilities asked for within ``busy_s`` are re-read every ``refresh_s``.
  A capability not asked for that long keeps its membership and states (events) but not
  its figures; the next ask returns what the view holds and wakes a refresh of it. One not
  asked for within ``unload_s`` is dropped (asking again loads it).
* A caller that suspects an agent (a failed delivery) asks for :meth:`RegistryView.recheck`.

When the event tail is broken (no successful read for ``max_staleness_s``: Redis was away)
the next ask re-reads its capability first; a view that was never started re-reads a
capability whose records are older than ``refresh_s`` on ask.

Whatever the registry holds, the view keeps going: a record that cannot be read is left
out (never routed to) and logged once, an unreadable event is skipped, and the background
tasks survive any error (logged, rate-limited) rather than take the process down. ``version``
counts changes that matter to routing (membership, state, readiness, draining, weight,
capabilities, metadata) and not load figures, so the router's cached structures stay valid
across heartbeats.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import anyio
import anyio.abc
from redis import exceptions as rexc

from .connection import AnyRedis, as_text
from .logs import OutageLog
from .registry import AgentInfo, Registry, decode_id

log = logging.getLogger("reach.view")

_EVENTS_PER_READ = 200
CLOCK_CHECK_S = 30.0  # how often a client measures its clock's offset to Redis's again
_ADDS = frozenset({"registered", b"registered"})  # the one event that can add an agent to a cap


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
        a.app_version,
    )


class _Tail:
    """Where the view is in one shard's events stream: the last id read and how many
    entries it has read up to there (entries-added at that id); ``behind``: the stream's
    last id a check saw ahead of the tail."""

    __slots__ = ("added", "behind", "key", "last")

    def __init__(self, key: str, last: str, added: int) -> None:
        self.key, self.last, self.added = key, last, added
        self.behind: str | None = None


def _stream_id(value: Any) -> tuple[int, int]:
    """A stream entry id as a comparable pair (``0-0`` for anything else)."""
    ms, _, seq = as_text(value).partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


class _Cap:
    """A capability the view was asked for: when its records were last read (0: never, or
    invalidated) and when it was last asked for (monotonic seconds)."""

    __slots__ = ("loaded_at", "used_at")

    def __init__(self, now: float) -> None:
        self.loaded_at = 0.0
        self.used_at = now


class RegistryView:
    """The agents of the capabilities asked for, by capability, with a change counter."""

    def __init__(
        self,
        registry: Registry,
        *,
        refresh_s: float = 2.0,
        max_staleness_s: float = 5.0,
        busy_s: float = 30.0,
        unload_s: float = 600.0,
        poll_s: float = 0.25,
        on_gone: Callable[[str], None] | None = None,
        name: str = "registry view",
    ) -> None:
        """``on_gone(agent_id)`` is called when an agent leaves the view (its record left
        the registry, or it no longer declares a capability the view holds), so per-agent
        state elsewhere can go too. ``busy_s``: a capability asked for within that long has
        its load figures re-read every ``refresh_s``; ``unload_s``: one not asked for that
        long is dropped. ``poll_s``: with several registry shards, how often their events
        streams are read. ``name`` starts its log lines about Redis outages (e.g.
        ``"client c-42: registry view"``)."""
        self.registry = registry
        self.on_gone = on_gone
        self.refresh_s = refresh_s
        self.max_staleness_s = max_staleness_s
        self.busy_s = busy_s
        self.unload_s = unload_s
        self.poll_s = poll_s
        self.version = 0
        self._caps: dict[str, _Cap] = {}
        self._agents: dict[str, AgentInfo] = {}
        self._by_cap: dict[str, list[AgentInfo]] = {}
        # Where the tail is in each shard's events stream; None until positioned.
        self._tails: list[_Tail] | None = None
        self._tail_ok_at = 0.0
        self._lock = anyio.Lock()
        self._wake = anyio.Event()
        self._changed = anyio.Event()  # set (and replaced) when the version moves
        self._tg: anyio.abc.TaskGroup | None = None
        self._started = False
        self._running = False
        self._last_unexpected = -1e9
        self.resyncs = 0  # times the consistency check found events lost and re-read
        # Redis away: a few lines per outage (start, reminders, end), not one per retry.
        self._tail_outage = OutageLog(log, f"{name}: reading registry events")
        self._refresh_outage = OutageLog(log, f"{name}: periodic refresh")

    @property
    def redis(self) -> AnyRedis:
        return self.registry.redis

    @property
    def capabilities(self) -> list[str]:
        """The capabilities the view holds (asked for, not yet unloaded)."""
        return sorted(self._caps)

    @property
    def agent_ids(self) -> list[str]:
        """The ids of the agents the view holds."""
        return sorted(self._agents)

    @property
    def age_s(self) -> float:
        """Seconds since the oldest read of a held capability's records (inf: none read)."""
        if not self._caps or not all(c.loaded_at for c in self._caps.values()):
            return float("inf")
        return time.monotonic() - min(c.loaded_at for c in self._caps.values())

    # -- reads --------------------------------------------------------------------------
    async def candidates(self, capability: str) -> tuple[list[AgentInfo], int]:
        """Agents declaring ``capability`` (any state) and the view's version.

        The first ask of a capability loads it (a few commands); later asks read memory."""
        now = time.monotonic()
        c = self._caps.get(capability)
        if c is None or self._due(c, now):
            async with self._lock:
                c = self._caps.get(capability)
                if c is None:
                    c = self._caps[capability] = _Cap(now)
                if self._due(c, time.monotonic()):  # callers that waited find it fresh
                    await self._reload()
        c.used_at = now
        if not self._started:
            self._start()
        elif self._running and now - c.loaded_at > 2 * self.refresh_s:
            self._wake.set()  # figures of a capability not asked for a while: refresh now
        return self._by_cap.get(capability, []), self.version

    def peek(self, capability: str) -> tuple[list[AgentInfo], int] | None:
        """What :meth:`candidates` would answer from memory without anything to do first
        (the capability loaded and fresh, the view following events, no refresh to wake):
        a send's fast path asks this and takes :meth:`candidates`'s path on None."""
        c = self._caps.get(capability)
        if c is None or not self._running:
            return None
        now = time.monotonic()
        if self._due(c, now) or now - c.loaded_at > 2 * self.refresh_s:
            return None
        c.used_at = now
        return self._by_cap.get(capability, []), self.version

    def _due(self, c: _Cap, now: float) -> bool:
        """Must ``c`` be read before it is answered from?"""
        if not c.loaded_at:
            return True
        if self._running:  # events keep it; unless the tail is broken
            return (
                now - self._tail_ok_at > self.max_staleness_s
                and now - c.loaded_at > self.max_staleness_s
            )
        return now - c.loaded_at > self.refresh_s

    def invalidate(self) -> None:
        """Make the next ask of each capability re-read it from Redis."""
        for c in self._caps.values():
            c.loaded_at = 0.0

    async def refresh(self) -> None:
        """Re-read every capability the view holds (nothing when it holds none)."""
        async with self._lock:
            await self._load(list(self._caps))

    async def _reload(self) -> None:
        """Read the capabilities that are due (not read yet, or stale); under the lock."""
        now = time.monotonic()
        await self._load([n for n, c in self._caps.items() if self._due(c, now)])

    async def _load(self, caps: list[str]) -> None:
        """Read ``caps``' sets and their agents' records, replacing what the view held of
        them; under the lock."""
        if not caps:
            return
        if self._tails is None:
            await self._position()  # before the sets: no event after them is missed
        started = time.monotonic()
        ids: set[str] = set()
        for cap in caps:
            ids.update(await self.registry.agent_ids(cap))
        found = await self.registry.read_agents(sorted(ids))
        self._apply(found, replaced=set(caps))
        for cap in caps:
            c = self._caps.get(cap)
            if c is not None:
                c.loaded_at = started

    async def wait_changed(self, timeout_s: float) -> bool:
        """Wait until the view changes in a way that matters to routing (a registration,
        a state, readiness or drain change: :attr:`version` moves), at most ``timeout_s``.
        True when it changed. The change comes from the registry events the view tails,
        so a recovery is seen within a round trip of its heartbeat."""
        if not self._started:
            self._start()
        ev = self._changed
        with anyio.move_on_after(max(0.0, timeout_s)):
            await ev.wait()
            return True
        return False

    async def recheck(self, agent_id: str) -> None:
        """Re-read one agent now (after a failed delivery to it)."""
        self._apply(await self.registry.read_agents([agent_id]))

    def _apply(
        self, new: Mapping[str, AgentInfo | None], *, replaced: Collection[str] = ()
    ) -> None:
        """Merge records read from Redis (None: no readable record). ``replaced``: those
        capabilities were read whole: an agent of theirs that ``new`` lacks left them."""
        changed = False
        old = self._agents
        held = self._caps
        merged = dict(old)
        for agent_id, a in old.items():
            # an agent of the sets read that they no longer hold left them; it stays only
            # when a capability that was not re-read holds it
            if (
                replaced
                and agent_id not in new
                and any(c in replaced for c in a.capabilities)
                and not any(c in held and c not in replaced for c in a.capabilities)
            ):
                del merged[agent_id]
        for agent_id, info in new.items():
            if info is None or not any(c in held for c in info.capabilities):
                merged.pop(agent_id, None)
                continue
            prev = old.get(agent_id)
            if prev is None or _static(prev) != _static(info):
                changed = True
            merged[agent_id] = info
        gone = set(old) - set(merged)
        if gone or set(merged) - set(old):
            changed = True
        self._agents = merged
        if changed:
            self.version += 1
            self._changed.set()
            self._changed = anyio.Event()
        self._index()
        if self.on_gone is not None:
            for agent_id in sorted(gone):
                self.on_gone(agent_id)

    def _index(self) -> None:
        # Rebuilt every time: load figures change the objects even when the version stays.
        held = self._caps
        by_cap: dict[str, list[AgentInfo]] = {}
        for agent_id in sorted(self._agents):
            a = self._agents[agent_id]
            for c in a.capabilities:
                if c in held:
                    by_cap.setdefault(c, []).append(a)
        self._by_cap = by_cap

    # -- background ---------------------------------------------------------------------
    def attach(self, tg: anyio.abc.TaskGroup) -> None:
        """Run the background tasks in ``tg``, from the first :meth:`candidates` on (a
        process that never calls never starts them)."""
        self._tg = tg
        self._started = False

    def _start(self) -> None:
        if self._tg is None:
            return
        self._started = True
        try:
            self._tg.start_soon(self.run)
        except RuntimeError:  # the task group has ended (the client stopped)
            self._tg = None
            self._started = False

    async def run(self) -> None:
        """Keep the view fresh until cancelled (events, the consistency check and the
        held capabilities' load figures)."""
        self._started = self._running = True
        self._tail_ok_at = time.monotonic()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._tail)
                tg.start_soon(self._periodic)
        finally:
            self._started = self._running = False

    async def _position(self) -> None:
        """Put the tails at the ends of the events streams; under the lock."""
        keys = self.registry.keys
        self._tails = [
            _Tail(keys.events_of(k), last, added)
            for k, (last, added) in enumerate(await self._stream_ends())
        ]

    async def _stream_ends(self) -> list[tuple[str, int]]:
        """Each shard's events stream's last id and entries-added (``0-0``, 0: no stream),
        in one pipeline."""
        keys = self.registry.keys
        pipe = self.redis.pipeline(transaction=False)
        for k in range(keys.shards):
            pipe.xinfo_stream(keys.events_of(k))
        out: list[tuple[str, int]] = []
        for info in await pipe.execute(raise_on_error=False):
            if isinstance(info, rexc.ResponseError) and "no such key" in str(info).lower():
                out.append(("0-0", 0))
            elif isinstance(info, BaseException):
                raise info
            else:
                out.append(
                    (
                        as_text(info.get("last-generated-id") or "0-0"),
                        int(info.get("entries-added", 0)),
                    )
                )
        return out

    async def _periodic(self) -> None:
        timed_at = time.monotonic()
        while True:
            with anyio.move_on_after(self.refresh_s):
                await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self._check()
                await self._refresh_figures()
                if time.monotonic() - timed_at >= CLOCK_CHECK_S:
                    timed_at = time.monotonic()
                    await self.registry.measure_clock()  # the offset deadlines are set with
            except (rexc.RedisError, OSError) as e:
                self._refresh_outage.failed(e)
            except Exception:  # noqa: BLE001 - a bug or bad data must not stop the process
                self._unexpected("refresh")
            else:
                self._refresh_outage.ok()

    async def _check(self) -> None:
        """The consistency check: one ``XINFO STREAM`` per shard; re-read the held
        capabilities when events were lost."""
        if self._tails is None:
            return
        ends = await self._stream_ends()
        async with self._lock:
            tails = self._tails
            if tails is None or len(tails) != len(ends):
                return
            lost_in = []
            for t, (last, added) in zip(tails, ends, strict=True):
                at, head = _stream_id(t.last), _stream_id(last)
                if head == at:
                    lost = added != t.added
                    t.behind = None
                elif head < at:
                    lost = True  # the stream went back: recreated, or a failover lost events
                else:  # events in flight, unless the tail is still short of the last end
                    lost = t.behind is not None and at < _stream_id(t.behind)
                    t.behind = None if lost else last
                if lost:
                    lost_in.append((t.key, last, added, t.last, t.added))
                    t.last, t.added, t.behind = last, added, None
            if lost_in:
                self.resyncs += 1
                log.info(
                    "registry view: events were lost (stream, its end, entries added, the "
                    "view's place, its count: %s): re-reading %d capabilities",
                    lost_in,
                    len(self._caps),
                )
                await self._load(list(self._caps))

    async def _refresh_figures(self) -> None:
        """Re-read the records of capabilities asked for within ``busy_s`` (load figures);
        drop capabilities not asked for within ``unload_s``."""
        now = time.monotonic()
        idle = [n for n, c in self._caps.items() if now - c.used_at > self.unload_s]
        due = {
            n
            for n, c in self._caps.items()
            if c.loaded_at
            and now - c.used_at <= self.busy_s
            and now - c.loaded_at >= 0.9 * self.refresh_s
        }
        if not idle and not due:
            return
        async with self._lock:
            if idle:
                for n in idle:
                    self._caps.pop(n, None)
                self._drop_unheld()
            ids = sorted(
                i for i, a in self._agents.items() if any(c in due for c in a.capabilities)
            )
            if ids:
                started = time.monotonic()
                self._apply(await self.registry.read_agents(ids))
                for n in due:
                    c = self._caps.get(n)
                    if c is not None:
                        c.loaded_at = started

    def _drop_unheld(self) -> None:
        held = self._caps
        keep = {i: a for i, a in self._agents.items() if any(c in held for c in a.capabilities)}
        gone = set(self._agents) - set(keep)
        self._agents = keep
        if gone:
            self.version += 1
        self._index()
        if self.on_gone is not None:
            for agent_id in sorted(gone):
                self.on_gone(agent_id)

    async def _read_events(self, tails: list[_Tail]) -> list[tuple[_Tail, Any]]:
        """New entries of each tail's stream (a tail with none left out): one blocking
        ``XREAD`` of the one stream, or one pipeline of non-blocking reads of several (then,
        when none had any, a pause of ``poll_s``)."""
        if len(tails) == 1:
            t = tails[0]
            res = await self.redis.xread({t.key: t.last}, block=1000, count=_EVENTS_PER_READ)
            return [(t, res)] if res else []
        pipe = self.redis.pipeline(transaction=False)
        for t in tails:
            pipe.xread({t.key: t.last}, count=_EVENTS_PER_READ)
        out = [(t, res) for t, res in zip(tails, await pipe.execute(), strict=True) if res]
        if not out:
            await anyio.sleep(self.poll_s)
        return out

    async def _tail(self) -> None:
        while True:
            try:
                if self._tails is None:
                    async with self._lock:
                        if self._tails is None:
                            await self._position()
                tails = self._tails
                assert tails is not None
                at = [t.last for t in tails]
                got = await self._read_events(tails)
            except (rexc.RedisError, OSError) as e:
                self._tail_outage.failed(e)
                await anyio.sleep(0.2)
                continue
            except Exception:  # noqa: BLE001 - e.g. a reply redis-py cannot parse
                self._unexpected("events read")
                await anyio.sleep(0.2)
                continue
            self._tail_ok_at = time.monotonic()
            if not got:
                self._tail_outage.ok()
                continue
            try:
                async with self._lock:
                    if self._tails is not tails or [t.last for t in tails] != at:
                        continue  # a resync moved a tail meanwhile: read from there
                    ids: set[str] = set()
                    for t, res in got:
                        ids |= self._named(res, t)
                    if ids:
                        self._apply(await self.registry.read_agents(sorted(ids)))
            except (rexc.RedisError, OSError) as e:
                self._tail_outage.failed(e)
                continue
            except Exception:  # noqa: BLE001 - a bug or bad data must not stop the process
                self._unexpected("update")
            self._tail_outage.ok()

    def _named(self, res: Any, tail: _Tail) -> set[str]:
        """Agent ids the events name that the view must re-read: agents it holds, and
        registered ones (they may declare a held capability). The tail's place and count
        move past every entry, a bad one too (passed over, never read again)."""
        ids: set[str] = set()
        held = self._caps
        for _, entries in res:
            for entry_id, fields in entries:
                tail.last = as_text(entry_id)
                tail.added += 1
                if not held:
                    continue
                raw = fields.get(b"agent_id") or fields.get("agent_id")
                if not isinstance(raw, bytes | str) or not raw:
                    continue
                a = decode_id(raw, namespace=self.registry.namespace, where="events stream")
                if not a:
                    continue
                if a in self._agents or (fields.get(b"type") or fields.get("type")) in _ADDS:
                    ids.add(a)
        return ids

    def _unexpected(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_unexpected >= 10.0:  # one traceback per 10 s at most
            self._last_unexpected = now
            log.exception("registry view %s failed unexpectedly; going on", what)

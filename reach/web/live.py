"""The console's one reader of the namespace: a sample every ``interval_s`` (what
``reach top`` shows, :mod:`reach.overview`), the last minutes of them for the charts, and
the registry events as they come. Every page and live stream reads from here, so ten
open browser tabs cost Redis what one does."""

from __future__ import annotations

import collections
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import anyio
from redis import exceptions as rexc

from ..connection import AnyRedis
from ..overview import CancelledCounts, Sample, collect, empty_sample, frame_data
from ..registry import Event, Registry

log = logging.getLogger("reach.web")

EVENTS_KEPT = 200


@dataclass(frozen=True, slots=True)
class Point:
    """One sample's figures for the charts (None: not known at that sample)."""

    ts_ms: int
    in_per_s: float | None
    taken_per_s: float | None
    dead_per_s: float | None
    queued: int
    inflight: int
    oldest_pending_ms: int | None
    """Age of the longest-waiting delivered, unacked message of any inbox."""
    time_in_inbox_ms: float | None
    """Little's law: entries in the inboxes / messages taken per second."""


def point_of(frame: dict[str, Any]) -> Point:
    t = frame["totals"]
    ages = [a["oldest_pending_age_ms"] for a in frame["agents"]]
    known = [x for x in ages if x is not None]
    dead = [c["dead_per_s"] for c in frame["capabilities"] if c["dead_per_s"] is not None]
    taken = t["taken_per_s"]
    return Point(
        ts_ms=frame["ts_ms"],
        in_per_s=t["in_per_s"],
        taken_per_s=taken,
        dead_per_s=sum(dead) if dead or frame["interval_s"] else None,
        queued=t["queued"],
        inflight=t["inflight"],
        oldest_pending_ms=max(known) if known else (0 if frame["agents"] else None),
        time_in_inbox_ms=(t["queued"] / taken * 1000) if taken else None,
    )


class Monitor:
    """Samples the namespace while :meth:`run` runs; readers wait with :meth:`changed`."""

    def __init__(
        self,
        redis: AnyRedis,
        namespace: str,
        *,
        interval_s: float = 1.0,
        history_s: float = 600.0,
        control: AnyRedis | None = None,
    ) -> None:
        self.redis = redis
        self.control = control or redis  # the registry's Redis (reach.planes)
        self.namespace = namespace
        self.interval_s = interval_s
        self.history_s = history_s
        self.frame: dict[str, Any] = frame_data(empty_sample(), None, namespace)
        self.history: collections.deque[Point] = collections.deque(
            maxlen=max(2, int(history_s / interval_s) + 1)
        )
        self.events: collections.deque[Event] = collections.deque(maxlen=EVENTS_KEPT)
        self.error = ""
        self.version = 0
        self.sampled = False
        self.cancelled = CancelledCounts()  # cancelled letters, shown apart from failures
        self._changed = anyio.Event()
        self._prev: Sample | None = None
        self._last_event = ""  # the newest event read ("$": none yet, "": not read yet)

    def _notify(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self, seen: int, *, timeout_s: float) -> int:
        """Wait until something newer than version ``seen`` (at most ``timeout_s``)."""
        if self.version == seen:
            with anyio.move_on_after(timeout_s):
                await self._changed.wait()
        return self.version

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._sample_loop)
            tg.start_soon(self._event_loop)

    async def sample_now(self, prev: Sample | None) -> Sample:
        cur = await collect(
            self.redis, self.namespace, cancelled=self.cancelled, control=self.control
        )
        self.frame = frame_data(cur, prev, self.namespace)
        if prev is not None:
            self.history.append(point_of(self.frame))
        self.error = ""
        self.sampled = True
        return cur

    def dlq_signature(self) -> tuple[Any, ...] | None:
        """What changes whenever a dead letter is filed or removed (None: not known)."""
        p = self._prev
        if p is None or self.error:
            return None
        return tuple(sorted(p.dlq.items())), tuple(sorted(p.dlq_added.items()))

    async def prime(self) -> None:
        """Take the first sample (before the first page is served: no empty page while
        the namespace has agents); a failure is kept in :attr:`error`, not raised."""
        await self._sample_once()
        with contextlib.suppress(rexc.RedisError, OSError):  # the event loop tries again
            await self._past_events()

    async def _past_events(self) -> None:
        past = await Registry(self.control, self.namespace).recent_events(50)
        self.events.extend(past)
        # Not "$" when there is none: each read would then start from its own moment, and
        # an event landing between two reads (an agent registering) would never be seen.
        self._last_event = past[-1].id if past else "0-0"
        self._notify()

    async def _sample_once(self) -> None:
        try:
            self._prev = await self.sample_now(self._prev)
        except (rexc.RedisError, OSError) as e:
            self.error = f"Redis: {e or type(e).__name__}"
            self._prev = None  # a rate across the outage would mislead
        except Exception as e:  # the console keeps running, and says why
            log.exception("reach web: a sample failed")
            self.error = f"{type(e).__name__}: {e}"
        self._notify()

    async def _sample_loop(self) -> None:
        while True:
            await anyio.sleep(self.interval_s)
            await self._sample_once()

    async def _event_loop(self) -> None:
        reg = Registry(self.control, self.namespace)
        while True:
            try:
                if not self._last_event:
                    await self._past_events()
                new = await reg.tail_events(last_id=self._last_event, block_ms=1000)
                if new:
                    self.events.extend(new)
                    self._last_event = new[-1].id
                    self._notify()
            except (rexc.RedisError, OSError) as e:
                self.error = f"Redis: {e or type(e).__name__}"
                await anyio.sleep(1.0)

"""The clock deadlines are judged on: this host's, corrected by its offset to Redis's.

A deadline is an absolute time (epoch ms) set by the caller and judged by the worker, on
two machines. Both judge it on Redis's clock: each process measures the offset of its own
clock to Redis's ``TIME`` (a worker when it starts and with its heartbeats, a Client when
it starts and with its registry view's refreshes) and :func:`now_ms` adds it. A worker
whose clock runs 30 s ahead then neither expires every message with a deadline under
30 s nor gives handlers 30 s less than their time.

An offset that is not :data:`APPLY_S` beyond what its round trip can tell (half the round
trip: the reply was made somewhere within it) is taken as 0: clocks kept by NTP agree to
a few ms, and a slow round trip must not invent a skew. An offset of
:data:`WARN_S` or more is logged once per process (logger ``reach.clock``): the clocks
should be synced (``reach doctor`` reports the skew too), the offset only hides it.

The offset is the process's: a process talking to several Redis servers uses the one it
measured last. On a Redis Cluster it is measured against the master holding the
namespace's registry (``server_time.lua``, keyed by registry shard 0's agents zset: a
keyless ``TIME`` would take a connection of its own to some master), so every process of
a namespace judges deadlines on that one master's clock. The scripts on the other masters
use their own (leases, the ``l`` of a claim made at send): the masters' clocks must agree
(NTP), and ``reach doctor`` checks each master's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from .connection import is_cluster

__all__ = ["APPLY_S", "CLOCK", "WARN_S", "Clock", "now_ms", "skew_s"]

APPLY_S: Final = 0.1
WARN_S: Final = 1.0

log = logging.getLogger("reach.clock")


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def skew_s(reply: Sequence[Any], sent_s: float, got_s: float) -> float:
    """How far Redis's clock is ahead of the local one (seconds, negative: behind), from a
    ``TIME`` reply (``[seconds, microseconds]``) sent at ``sent_s`` and answered at
    ``got_s`` (local epoch seconds): the reply was made within that round trip, taken as
    its middle."""
    sec, usec = (int(_text(x)) for x in reply[:2])
    return sec + usec / 1e6 - (sent_s + got_s) / 2


class Clock:
    """This host's clock (``local``: epoch seconds) corrected by its measured offset to
    Redis's. Injectable for tests: ``Clock(local=lambda: time.time() + 30)`` is a host
    30 s ahead."""

    def __init__(self, local: Callable[[], float] | None = None) -> None:
        self._local = local
        self.offset_ms = 0
        self.measured = 0  # measurements taken
        self.warned = False

    def local_s(self) -> float:
        """The host's own time (epoch seconds), uncorrected."""
        return self._local() if self._local is not None else time.time()

    def now_ms(self) -> int:
        """Epoch ms on Redis's clock, as far as this process measured it."""
        if self._local is None:
            return time.time_ns() // 1_000_000 + self.offset_ms
        return int(self._local() * 1000) + self.offset_ms

    def observe(self, reply: Sequence[Any], sent_s: float, got_s: float) -> float:
        """Take a ``TIME`` measurement (see :func:`skew_s`; times from :meth:`local_s`);
        returns the skew in seconds."""
        skew = skew_s(reply, sent_s, got_s)
        self.measured += 1
        uncertain_s = max(0.0, got_s - sent_s) / 2
        self.offset_ms = round(skew * 1000) if abs(skew) - uncertain_s >= APPLY_S else 0
        if abs(skew) >= WARN_S and not self.warned:
            self.warned = True
            log.warning(
                "this host's clock is %.1f s %s Redis's: deadlines are judged on Redis's "
                "clock (the offset is applied). Sync the clocks (NTP: chrony or "
                "systemd-timesyncd); `reach doctor` checks them",
                abs(skew),
                "behind" if skew > 0 else "ahead of",
            )
        return skew

    async def measure(
        self, r: Any, keyed: Callable[[], Awaitable[Sequence[Any]]] | None = None
    ) -> float | None:
        """Measure the offset with one read of Redis's clock; the skew in seconds, or None
        when Redis did not answer (the offset is kept) or is a Cluster measured without
        ``keyed``.

        ``r``: an asyncio Redis client (or the auto-pipeline over one). On a standalone
        server (or Sentinel's master) the read is a plain ``TIME`` on ``r``: it goes where
        every other command goes, and needs no script in the server's cache (a restarted
        server answers it at once). On a Cluster a keyless ``TIME`` would take a connection
        of its own to some master, so the read is ``keyed()``: a keyed call answering as
        ``TIME`` does, routed like the process's other commands to one key's node
        (:meth:`reach.registry.Registry.measure_clock` passes ``server_time.lua`` keyed by
        the registry, on the registry's connection; it is passed in, not built here, as this
        module sits below the script layer)."""
        cluster = getattr(r, "cluster", False) is True or is_cluster(r)
        if cluster and keyed is None:
            return None
        try:
            t0 = self.local_s()
            reply = await (keyed() if cluster and keyed is not None else r.execute_command("TIME"))
            t1 = self.local_s()
        except Exception as e:  # noqa: BLE001 - a measurement must never fail its caller
            log.debug("could not read Redis's clock: %s", e)
            return None
        return self.observe(reply, t0, t1)


CLOCK: Final = Clock()
"""The process's clock: what :func:`now_ms` (and ``reach.envelope.now_ms``) reads."""


now_ms = CLOCK.now_ms
"""Epoch ms on Redis's clock (this host's clock plus its measured offset): the clock's own
method (one call less on every read)."""

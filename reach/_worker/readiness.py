"""Readiness: whether a running agent may be given new work, and what the probes read.

The registry's ``ready`` flag of a running agent is written by this part alone. It is set
when nothing holds the agent back, and cleared while anything does:

* ``starting``: until the pending entries of its agent_id are resumed;
* ``stalled``: its consumer has not come round its loop for ``consumer_stall_s`` (a read
  that hangs: it is alive, heartbeats go on, but it takes nothing in);
* ``check``: the application's readiness check (``@app.readiness``) returned False,
  raised, or did not answer within its timeout, at its last run (every ``heartbeat_s``);
* ``paused``: ``agent.set_ready(False)`` (``ctx.agent.set_ready(False)`` in a handler),
  until ``set_ready(True)``.

A flip is written at once (``mark_ready.lua``: an ``unready`` or ``ready`` event that
callers' registry views read within a round trip) and logged once; a write Redis refuses
is tried again at the next tick. A drain is apart: its own flag stops routing, and
readiness is no longer written. Liveness (``/healthz``) and readiness (``/readyz``) as a
platform reads them come from :meth:`Readiness.not_alive` and :meth:`Readiness.not_ready`,
which read this process's own state only (no Redis call: a probe answers at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from redis import exceptions as rexc

from .liveness import Liveness
from .state import Part, Shared

log = logging.getLogger("reach.runtime")

READINESS_TIMEOUT_S = 5.0
"""How long a readiness check may take by default before it counts as failed."""

WHY_MAX_CHARS = 200
"""The most of a failed check's exception text kept in its reason (logs, ``/readyz``)."""


@dataclass(frozen=True, slots=True)
class ReadinessCheck:
    """An application's readiness check (``@app.readiness``): ``fn()``, async or plain
    (a plain one runs in a worker thread), given ``timeout_s`` to answer."""

    fn: Callable[[], Any]
    is_async: bool
    timeout_s: float = READINESS_TIMEOUT_S


class Readiness(Part):
    """The ``ready`` flag of one running agent: what holds it back, written as it flips."""

    def __init__(self, shared: Shared, *, liveness: Liveness) -> None:
        super().__init__(shared)
        self.liveness = liveness
        self.why: dict[str, str] = {"starting": "starting"}  # what holds the agent back
        self.started = False
        self.written: bool | None = None  # the flag as last written to the registry
        self._wake = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = anyio.Lock()
        self._thread_since: float | None = None  # a plain check's thread still running

    # -- from any thread ------------------------------------------------------------------
    def poke(self) -> None:
        """Look again now (``agent.set_ready`` changed); thread-safe."""
        loop = self._loop
        if loop is None:  # not started: start() reads the pause itself
            return
        try:
            loop.call_soon_threadsafe(self._set_wake)
        except RuntimeError:  # the loop closed: the agent has stopped
            pass

    def _set_wake(self) -> None:
        self._wake.set()

    # -- on the agent's event loop ---------------------------------------------------------
    async def start(self) -> None:
        """Once the pending entries are resumed: run the check once, then write the flag
        (ready unless something holds the agent back). A write Redis refuses raises, as
        any step of the start does."""
        self._loop = asyncio.get_running_loop()
        await self._check()
        self._note_pause()
        self.why.pop("starting", None)
        async with self._lock:
            await self._write(not self.why)
            self.started = True
        caps = ", ".join(self.agent.capabilities)
        if self.why:
            log.warning(
                "agent %s serving (%s) but not ready, routing avoids it: %s",
                self.agent_id,
                caps,
                self.reasons(),
            )
        else:
            log.info("agent %s ready (%s)", self.agent_id, caps)

    async def run(self) -> None:
        """Every ``heartbeat_s``: watch the consumer and run the check; at once on a poke;
        then write a flip, if any."""
        self._loop = asyncio.get_running_loop()
        period = self.opts.heartbeat_s
        due = time.monotonic() + period
        while True:
            with anyio.move_on_after(max(0.0, due - time.monotonic())):
                await self._wake.wait()
            self._wake = anyio.Event()  # before reading the pause: a later poke is kept
            if not self.started:
                due = time.monotonic() + period
                continue
            if time.monotonic() >= due:
                self._watch_consumer()
                await self._check()
                due = time.monotonic() + period
            self._note_pause()
            await self.apply()

    async def apply(self) -> None:
        """Write the flag if it flipped (not during a drain, nor once replaced)."""
        async with self._lock:
            st = self.state
            if not self.started or st.draining or st.stale:
                return
            want = not self.why
            if want is self.written:
                return
            try:
                await self._write(want)
            except (rexc.RedisError, OSError) as e:
                self.outages.failed("readiness update", e)
                return
            if want:
                log.info("agent %s ready again: routable", self.agent_id)
            else:
                log.warning(
                    "agent %s not ready, routing avoids it: %s", self.agent_id, self.reasons()
                )

    async def _write(self, ready: bool) -> None:
        # the state first: a heartbeat that registers the agent again carries it
        await self.liveness.set_ready(ready)
        self.written = ready

    def _watch_consumer(self) -> None:
        stuck_s = time.monotonic() - self.state.consumer_tick
        if stuck_s > self.opts.consumer_stall_s:
            self.why["stalled"] = f"consumer made no progress for {stuck_s:.1f}s"
        else:
            self.why.pop("stalled", None)

    def _note_pause(self) -> None:
        if self.agent.paused:
            self.why["paused"] = "paused by set_ready(False)"
        else:
            self.why.pop("paused", None)

    async def _check(self) -> None:
        chk = self.agent.readiness_check
        if chk is None:
            return
        failed = await self._run_check(chk)
        if failed:
            self.why["check"] = failed
        else:
            self.why.pop("check", None)

    async def _run_check(self, chk: ReadinessCheck) -> str:
        """'' when the check passed, else why it did not."""
        since = self._thread_since
        if since is not None:  # a thread cannot be stopped: never two at once
            return (
                f"readiness check still running after {time.monotonic() - since:.1f}s "
                "(a plain function: its thread cannot be stopped)"
            )
        with anyio.move_on_after(chk.timeout_s) as scope:
            try:
                if chk.is_async:
                    ok = await chk.fn()
                else:
                    ok = await anyio.to_thread.run_sync(
                        self._in_thread, chk.fn, abandon_on_cancel=True
                    )
            except Exception as e:  # noqa: BLE001 - the application's check: any error fails it
                return f"readiness check raised {type(e).__name__}: {e}"[:WHY_MAX_CHARS]
        if scope.cancelled_caught:
            return f"readiness check did not answer within {chk.timeout_s:g}s"
        return "readiness check returned False" if ok is False else ""

    def _in_thread(self, fn: Callable[[], Any]) -> Any:
        self._thread_since = time.monotonic()
        try:
            return fn()
        finally:
            self._thread_since = None

    # -- what the probes read (any thread) ------------------------------------------------
    def reasons(self) -> str:
        return "; ".join(self._why_now())

    def _why_now(self) -> list[str]:
        for _ in range(3):
            try:
                return list(self.why.values())
            except RuntimeError:  # changed by the loop meanwhile: read it again
                continue
        return ["readiness changing"]

    def not_ready(self) -> list[str]:
        """Why this agent is not routable now (``[]``: it is): registered, its lease
        running, ready in the registry, nothing holding it back, not draining."""
        st = self.state
        if st.stale:
            return ["replaced by a newer registration of its agent_id"]
        if st.draining or st.stop_requested.is_set():
            return ["draining"]
        out = self._why_now()
        if not out and self.written is not True:
            out.append("not marked ready in the registry yet")
        silent_s = time.monotonic() - st.beat_ok_at
        if silent_s > self.opts.lease_s:
            out.append(
                f"no heartbeat answered for {silent_s:.1f}s (over the {self.opts.lease_s:g}s "
                "lease): Redis unreachable?"
            )
        return out

    def not_alive(self) -> list[str]:
        """Why this agent's process should be restarted (``[]``: it is alive): its event
        loop has made no progress for ``stall_s``, or its heartbeat thread stopped or has
        not come round for ``evict_after_s``. Redis being away is not a reason: a restart
        would not bring it back."""
        out = []
        stalled_s = time.monotonic() - self.state.loop_tick
        if stalled_s > self.opts.stall_s:
            out.append(f"event loop made no progress for {stalled_s:.1f}s")
        hb = self.liveness.heartbeats
        if hb is not None:
            quiet_s = hb.quiet_s()
            if quiet_s is None:
                out.append("heartbeat thread stopped")
            elif quiet_s > self.opts.evict_after_s:
                out.append(f"heartbeat thread has not come round for {quiet_s:.1f}s")
        return out

"""Liveness: the agent's registration and everything that keeps it true.

* registration (not ready at first), readiness, the drain flag, and on a clean stop
  deregistration and leaving the inbox;
* heartbeats from a thread with its own connection, so a handler that blocks the event
  loop for a while does not cost the lease; a loop without progress for ``stall_s``
  (the ticker proves progress) withholds them. A heartbeat that finds the registration
  gone registers again; one that finds a newer registration stops this agent;
* the watchdog: a consumer alive but stuck (a read that hangs) is marked not ready;
* signals: the first SIGTERM/SIGINT drains, a second one stops at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import anyio
from redis import exceptions as rexc

from ..connection import connect_sync
from ..errors import StaleRegistration
from ..keys import PRIORITIES
from ..registry import Registry
from ..scripts import inbox
from ..scripts.codes import DeregisterCode, DropInboxCode, HeartbeatCode
from .consumer import create_groups_sync
from .state import Part, Shared

log = logging.getLogger("reach.runtime")


class Liveness(Part):
    """Registration, heartbeats, readiness and stopping, for one running agent."""

    def __init__(self, shared: Shared, *, url: str, registry: Registry, version: int) -> None:
        super().__init__(shared)
        self.url = url  # the heartbeat thread opens its own connection
        self.registry = registry
        self.version = version  # the process start stamp: a newer registration wins
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()

    # -- registration -------------------------------------------------------------------
    def _register_kw(self) -> dict[str, Any]:
        a, o = self.agent, self.opts
        return {
            "instance_id": self.state.instance_id,
            "version": self.version,
            "capabilities": a.capabilities,
            "weight": a.weight,
            "metadata": a.metadata,
            "lease_ms": int(o.lease_s * 1000),
            "evict_after_ms": int(o.evict_after_s * 1000),
            "card": a.card,
            "ready": self.state.ready,
            "max_queue": a.max_queue,
        }

    async def register(self) -> None:
        await self.registry.register(self.agent_id, **self._register_kw())

    async def set_ready(self, ready: bool) -> None:
        self.state.ready = ready
        await self.registry.mark_ready(
            self.agent_id, instance_id=self.state.instance_id, ready=ready
        )

    async def announce_drain(self) -> None:
        """Set the drain flag (routing stops sending here); best effort."""
        try:
            await self.registry.drain(self.agent_id, instance_id=self.state.instance_id)
        except Exception as e:  # noqa: BLE001 - best effort: the drain goes on without it
            log.info("drain flag not set: %s", e)

    async def leave(self) -> None:
        """On a clean stop: deregister (unless a newer registration replaced this one)
        and leave the inbox. Shielded from cancellation; failures are logged."""
        if self.state.stale:
            return
        with anyio.CancelScope(shield=True):
            try:
                deregistered = await self.registry.deregister(
                    self.agent_id, instance_id=self.state.instance_id
                )
                if deregistered is DeregisterCode.REMOVED:
                    await self._leave_inbox()
            except (rexc.RedisError, OSError) as e:
                log.warning("deregister failed: %s", e)

    async def _leave_inbox(self) -> None:
        """After a clean deregistration: drop the emptied inbox (an agent id that is not
        coming back must not leave streams forever), or, if messages came in after the
        drain, hand them to the sweeper, which moves them to live agents."""
        dropped = await inbox.drop_inbox(self.keys, agent_id=self.agent_id).run(self.redis)
        if dropped is DropInboxCode.KEPT:
            log.info("messages arrived during shutdown: the sweeper moves them on")
            await self.redis.sadd(self.keys.reroute, self.agent_id)

    # -- progress -----------------------------------------------------------------------
    async def watchdog(self) -> None:
        """Readiness follows the consumer: a consumer that is alive but has not come round
        its loop for ``consumer_stall_s`` (a read that hangs) is marked not ready, so
        routing avoids it, and ready again once it moves."""
        st = self.state
        unready_by_us = False
        while True:
            await anyio.sleep(self.opts.heartbeat_s)
            stuck_s = time.monotonic() - st.consumer_tick
            try:
                if stuck_s > self.opts.consumer_stall_s and st.ready and not st.draining:
                    log.error("consumer made no progress for %.1fs: marked not ready", stuck_s)
                    await self.set_ready(False)
                    unready_by_us = True
                elif stuck_s <= self.opts.consumer_stall_s and unready_by_us:
                    log.warning("consumer moves again: ready")
                    await self.set_ready(True)
                    unready_by_us = False
            except (rexc.RedisError, OSError) as e:
                self.outages.failed("readiness update", e)

    async def ticker(self) -> None:
        """Proof of event-loop progress, read by the heartbeat thread."""
        period = min(self.opts.heartbeat_s, self.opts.stall_s / 4)
        while True:
            self.state.loop_tick = time.monotonic()
            await anyio.sleep(period)

    # -- heartbeats ---------------------------------------------------------------------
    def start_heartbeat(self) -> None:
        self._hb_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"reach-heartbeat-{self.agent_id}", daemon=True
        )
        self._hb_thread.start()

    def stop_heartbeat(self) -> None:
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=5)

    def _heartbeat_loop(self) -> None:
        """Heartbeats from a thread: a handler that blocks the loop for a while does not
        cost the lease, but a loop without progress for ``stall_s`` stops them."""
        st, reg = self.state, self.registry
        inboxes = self.keys.inboxes(self.agent_id)
        r = None
        while not self._hb_stop.wait(self.opts.heartbeat_s):
            stalled = time.monotonic() - st.loop_tick
            if stalled > self.opts.stall_s:
                log.error("event loop made no progress for %.1fs: heartbeats withheld", stalled)
                continue
            try:
                if r is None:
                    r = connect_sync(self.url)
                depths = [int(r.xlen(k)) for k in inboxes]
                self.hooks.on_heartbeat(st, dict(zip(PRIORITIES, depths, strict=True)))
                hb = reg.heartbeat_call(
                    self.agent_id,
                    instance_id=st.instance_id,
                    version=self.version,
                    queue_depth=sum(depths),
                    inflight=st.inflight,
                ).run_sync(r)
                if hb.code is HeartbeatCode.NOT_REGISTERED:
                    log.warning("registration lost (evicted or flushed): registering again")
                    call = reg.register_call(self.agent_id, **self._register_kw())
                    reg.check_registration(self.agent_id, self.version, call.run_sync(r))
                    create_groups_sync(r, inboxes)
                elif hb.code is HeartbeatCode.STALE:
                    raise StaleRegistration("a newer registration of this agent_id exists")
                elif hb.draining and not st.stop_requested.is_set():
                    log.info("drain requested by an operator")
                    st.request_stop()
                self.outages.ok()
            except StaleRegistration as e:
                log.error("stopping: %s", e)
                st.stale = True
                st.request_stop()
                return
            except (rexc.RedisError, OSError) as e:
                self.outages.failed("heartbeat", e)
                if r is not None:
                    try:
                        r.close()
                    except Exception:  # noqa: BLE001, S110 - closing a broken connection
                        pass
                r = None
        if r is not None:
            r.close()

    # -- stopping -----------------------------------------------------------------------
    async def watch_stop(self) -> None:
        """Turn a stop request (from any thread) into the consumer's stop."""
        while not self.state.stop_requested.is_set():
            await anyio.sleep(0.05)
        self.state.stopping.set()

    async def signals(self, scope: anyio.CancelScope) -> None:
        """First SIGTERM/SIGINT: drain. Second: cancel ``scope`` (stop at once)."""
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            n = 0
            async for sig in sigs:
                n += 1
                if n == 1:
                    log.info("signal %s: draining (again to stop at once)", sig)
                    self.state.request_stop()
                else:
                    log.warning("second signal: stopping without draining")
                    scope.cancel()
                    return

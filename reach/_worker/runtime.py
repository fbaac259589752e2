"""The running worker: builds the parts (see this package's ``__init__``), starts their
tasks in one task group, and owns the lifecycle.

Start: connect, register (not ready), create the inbox groups, start the heartbeat
thread and the tasks, resume this agent_id's pending entries, mark ready, serve.
Stop (``stop()``, a signal, an operator's drain, a newer registration): the consumer
stops reading, running handlers get ``drain_timeout_s`` to finish, queued outcomes are
settled, the agent deregisters and leaves its inbox.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from ..client import Client
from ..connection import AnyRedis, connect, is_cluster
from ..envelope import new_id
from ..errors import ConfigError
from ..hooks import Hooks
from ..keys import Keys
from ..metrics import MetricsHooks
from ..registry import Registry
from .consumer import Consumer, create_groups
from .execution import Execution
from .hookchain import HookChain
from .letters import DeadLetters
from .liveness import Liveness
from .settlement import Settlement
from .state import Outages, Shared, WorkerState
from .stats import Stats
from .sweeping import sweep_forever

if TYPE_CHECKING:
    from ..agent import Agent, RuntimeOptions

log = logging.getLogger("reach.runtime")


class Runtime:
    """One run of an agent (``Agent.run()`` makes one per call)."""

    def __init__(self, agent: Agent, opts: RuntimeOptions, hooks: Sequence[Hooks] = ()) -> None:
        self.agent = agent
        self.opts = opts
        self.keys = Keys(opts.namespace)
        self.version = time.time_ns() // 1000  # the process start stamp, in µs
        self.state = WorkerState(agent.agent_id, new_id(), opts.namespace)
        self.owner = f"{agent.agent_id}/{self.state.instance_id}"
        self.stats = Stats()
        self.hooks = HookChain([self.stats, MetricsHooks(), *hooks])
        self.consumer: Consumer | None = None

    @property
    def instance_id(self) -> str:
        return self.state.instance_id

    def request_stop(self) -> None:
        """Drain and stop (thread-safe)."""
        self.state.request_stop()

    async def run(self) -> None:
        o, st, keys = self.opts, self.state, self.keys
        url = o.redis_url or os.environ.get("REACH_REDIS_URL")
        if not url:
            raise ConfigError("No Redis: pass redis_url=... or set REACH_REDIS_URL.")
        redis: AnyRedis = await connect(url)
        cluster = is_cluster(redis)
        registry = Registry(redis, o.namespace)
        client = Client(redis=redis, namespace=o.namespace, client_id=f"a-{self.agent.agent_id}")
        hooks = self.hooks
        outages = Outages(self.agent.agent_id)
        letters = DeadLetters(
            keys=keys, agent_id=self.agent.agent_id, dlq_maxlen=o.dlq_maxlen, hooks=hooks
        )
        shared = Shared(self.agent, o, st, keys, redis, cluster, hooks, outages)
        settlement = Settlement(shared, letters=letters)
        execution = Execution(
            shared,
            registry=registry,
            client=client,
            owner=self.owner,
            settlement=settlement,
            letters=letters,
        )
        consumer = self.consumer = Consumer(
            shared, execution=execution, settlement=settlement, letters=letters
        )
        liveness = Liveness(shared, url=url, registry=registry, version=self.version)
        hooks.on_start(st)
        try:
            await liveness.register()
            await create_groups(redis, keys.inboxes(self.agent.agent_id))
            async with client, anyio.create_task_group() as tg:
                liveness.start_heartbeat()
                tg.start_soon(liveness.ticker)
                tg.start_soon(liveness.watchdog)
                tg.start_soon(settlement.run)
                for _ in range(o.concurrency):
                    tg.start_soon(execution.pool_member)
                if o.sweeper:
                    tg.start_soon(lambda: sweep_forever(shared, client=client, registry=registry))
                if o.handle_signals and threading.current_thread() is threading.main_thread():
                    tg.start_soon(liveness.signals, tg.cancel_scope)
                tg.start_soon(liveness.watch_stop)
                await consumer.resume_pending()
                await liveness.set_ready(True)
                if o.ready_event is not None:
                    o.ready_event.set()
                log.info(
                    "agent %s ready (%s)", self.agent.agent_id, ", ".join(self.agent.capabilities)
                )
                await consumer.run()
                await self._drain(liveness, settlement)
                tg.cancel_scope.cancel()
        finally:
            hooks.on_stop(st)
            liveness.stop_heartbeat()
            await liveness.leave()
            with anyio.CancelScope(shield=True):
                await redis.aclose()

    async def _drain(self, liveness: Liveness, settlement: Settlement) -> None:
        """Stop taking work, let in-flight handlers finish (bounded), flush settles."""
        st = self.state
        st.draining = True
        await liveness.announce_drain()
        with anyio.move_on_after(self.opts.drain_timeout_s):
            while st.inflight > 0:
                await st.wait_slot()
        if st.inflight:
            log.warning("drain timeout: %d handlers still running are abandoned", st.inflight)
        await settlement.settle_rest()

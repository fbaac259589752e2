"""The running worker: builds the parts (see this package's ``__init__``), starts their
tasks in one task group, and owns the lifecycle.

Start: connect, register (not ready), create the inbox groups, start the heartbeat
thread and the tasks, resume this agent_id's pending entries, mark ready, serve.
Stop (``stop()``, a signal, an operator's drain, a newer registration): the consumer
stops reading, running handlers get ``drain_timeout_s`` to finish, queued outcomes are
settled, the agent deregisters and leaves its inbox.

Agents run by one process share what can be shared (:class:`_Host`, one per Redis URL and
event loop): one Redis client, whose commands go out auto-pipelined on one multiplexed
connection (:class:`reach._autopipe.AutoPipeline`; blocking reads take a connection of their
own: 3 connections per process on standalone Redis and Sentinel), one heartbeat thread (:class:`reach._worker.liveness.Heartbeats`) and one sweeper
task per namespace (taken over by another agent of the process when its agent stops).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

import anyio
from redis import exceptions as rexc

from .._autopipe import AutoPipeline
from ..client import Client
from ..connection import AnyRedis, as_text, connect, is_cluster
from ..envelope import new_id
from ..errors import ConfigError
from ..hooks import Hooks
from ..keys import Keys
from ..metrics import MetricsHooks
from ..registry import Registry
from .cancelling import CancelPeers, Cancels
from .consumer import Consumer, create_groups
from .execution import Execution
from .hookchain import HookChain
from .letters import DeadLetters
from .liveness import Liveness
from .preempting import Preemption
from .settlement import Settlement
from .state import Outages, Shared, WorkerState
from .stats import Stats
from .sweeping import sweep_forever

if TYPE_CHECKING:
    from ..agent import Agent, RuntimeOptions

log = logging.getLogger("reach.runtime")

HOST_PIPELINES = 2
"""With ``multiplex=False`` only (not the default): auto-pipelined batches in flight at once
for the agents of one process, the connections per node their (non-blocking) commands use.
Two, not one: with one pipeline at a time a worker's fetch, claim and settle wait for each
other's round trips (`bench/profile_worker.py --profile none`, backlog, standalone when
pipelines were used there: 5,300-7,300 msgs/s with one in 2 runs; 7,000-14,400 with two,
6,400-11,800 with four in 5 runs each). By default the commands share one multiplexed
connection on standalone Redis and Sentinel, one per node on a Cluster (batches written
without waiting for earlier replies, see :mod:`reach._autopipe`), whatever this number: a
standalone worker process holds 3 connections (that one, its blocking read, its heartbeat
thread), and the backlog drains faster than with two pipelines (`reach bench --floor
--repeat 3`, 3 alternated runs each, medians: 24,353 -> 26,735 msgs/s at load ~1, 20,373 ->
21,612 at load 2-3; docs/operations.md has the rest). On a Cluster a worker process holds,
per master, that one plus a blocking inbox read per agent whose inbox is there and its
heartbeat thread's connection if the thread talks to that master (one agent: 3 on its
inbox's master, 1-2 on the others; tests/integration/test_cluster_concurrency.py)."""


RESYNC_S = 15.0
"""How often a waiting agent re-reads where its inbox ends even without a wake-up."""


class _Wakeups:
    """One blocking ``XREAD`` on a connection of its own for every agent of the process
    that waits for messages (standalone Redis and Sentinel: ``XREAD`` names keys of one
    slot only on a Cluster), instead of one blocked ``XREADGROUP`` connection per agent.

    A waiting agent's streams are watched from the last entry it knew of (explicit ids:
    nothing added after that id can be missed, whenever the ``XREAD`` is sent); an entry
    past it wakes the agent, which then reads with a plain ``XREADGROUP``. Streams stay
    watched after a wait timed out (the agent usually waits again at once, with the same
    ids), and are dropped when they wake nobody. A stream watched anew while the ``XREAD``
    is blocked unblocks it (``CLIENT UNBLOCK``) so it is sent again with that stream.
    """

    def __init__(self, url: str, block_ms: int) -> None:
        self.url = url
        self.block_ms = block_ms
        self.watch: dict[str, str] = {}  # stream -> id after which an entry wakes
        self.waiters: dict[str, asyncio.Event] = {}  # stream -> its waiting agent's event
        self._changed = asyncio.Event()
        self._blocked_with: frozenset[str] | None = None  # streams of the XREAD in flight
        self._unblocking = False
        self._conn: AnyRedis | None = None
        self._conn_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self.unblocks = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001, S110 - cancelled (or failed) on close
                pass
        if self._conn is not None:
            await self._conn.aclose()

    def wait_for(self, from_ids: dict[str, str], commands: AnyRedis) -> asyncio.Event:
        """Watch ``from_ids`` (stream -> last id known); the event is set by an entry past
        one of them."""
        ev = asyncio.Event()
        added = False
        for k, i in from_ids.items():
            self.waiters[k] = ev
            if self.watch.get(k) != i:
                self.watch[k] = i
                added = True
        if added:
            self._changed.set()
            blocked = self._blocked_with
            if blocked is not None and not set(from_ids) <= blocked and not self._unblocking:
                self._unblocking = True
                asyncio.get_running_loop().create_task(self._unblock(commands))
        return ev

    def done(self, streams: Sequence[str], ev: asyncio.Event) -> None:
        for k in streams:
            if self.waiters.get(k) is ev:
                del self.waiters[k]

    async def _unblock(self, commands: AnyRedis) -> None:
        try:
            if self._conn_id is not None:
                self.unblocks += 1
                await commands.execute_command("CLIENT", "UNBLOCK", self._conn_id)
        except (rexc.RedisError, OSError) as e:  # the XREAD ends at its timeout anyway
            log.debug("CLIENT UNBLOCK failed: %s", e)
        finally:
            self._unblocking = False

    def _wake_all(self) -> None:
        for ev in self.waiters.values():
            ev.set()

    async def _run(self) -> None:
        while True:
            if not self.watch:
                self._changed = asyncio.Event()
                await self._changed.wait()
                continue
            try:
                if self._conn is None:
                    self._conn = await connect(self.url, max_connections=1)
                    self._conn_id = int(await self._conn.execute_command("CLIENT", "ID"))
                streams = dict(self.watch)
                self._blocked_with = frozenset(streams)
                try:
                    res = await self._conn.xread(streams, count=1, block=self.block_ms)
                finally:
                    self._blocked_with = None
            except Exception as e:  # the shared read must outlive any error
                # Redis away or a refusal: the waiting agents read for themselves (and
                # meet the error there, where the consumer handles it). Anything else is a
                # bug: logged, and the read goes on (its agents would otherwise wait out
                # every block).
                if isinstance(e, (rexc.RedisError, OSError)):
                    log.debug("wake-up read failed: %s", e)
                else:
                    log.exception("wake-up read failed unexpectedly; going on")
                self._wake_all()
                if self._conn is not None:
                    await self._conn.aclose()
                self._conn, self._conn_id = None, None
                await asyncio.sleep(0.2)
                continue
            for key, entries in res or []:
                k = as_text(key)
                ev = self.waiters.get(k)
                if entries:
                    self.watch.pop(k, None)  # read again from where its agent reads next
                if ev is not None:
                    ev.set()


class _AgentRedis:
    """The Redis client one agent's parts use in a process whose agents share a
    :class:`_Wakeups`: every command goes to the shared auto-pipelined client, but while
    the process runs several agents a blocking ``XREADGROUP`` waits for a wake-up and then
    reads without blocking."""

    def __init__(self, commands: AnyRedis, wakeups: _Wakeups, host: _Host) -> None:
        self._commands = commands
        self._wakeups = wakeups
        self._host = host
        self._from: dict[str, str] | None = None  # stream -> the last entry id known
        self._synced = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._commands, name)

    async def aclose(self, *args: Any, **kwargs: Any) -> None:
        """The process's host closes the shared client."""

    async def xreadgroup(self, *args: Any, **kwargs: Any) -> Any:
        block = kwargs.get("block")
        if block is None or self._host.users < 2:
            # The one agent of its process blocks on a connection of its own (as many
            # connections, and a round trip less per message than a wake-up).
            self._from = None
            return await self._commands.xreadgroup(*args, **kwargs)
        group, consumer, streams = args[0], args[1], args[2]
        count = kwargs.get("count")
        if self._from is None or time.monotonic() - self._synced > RESYNC_S:
            got = await self._read(group, consumer, streams, count)
            if got:
                return got
        assert self._from is not None
        ev = self._wakeups.wait_for(self._from, self._commands)
        try:
            with anyio.move_on_after(block / 1000):
                await ev.wait()
        finally:
            self._wakeups.done(list(self._from), ev)
        if not ev.is_set():
            return []
        return await self._read(group, consumer, streams, count)

    async def _read(self, group: Any, consumer: Any, streams: dict[str, str], count: Any) -> Any:
        """Where each stream ends now, then a read without blocking (in this order: an
        entry added in between is read, not missed)."""
        pipe = self._commands.pipeline(transaction=False)
        keys = list(streams)
        for k in keys:
            pipe.xrevrange(k, "+", "-", count=1)
        pipe.xreadgroup(group, consumer, streams, count=count)
        replies = await pipe.execute(raise_on_error=False)
        for x in replies:
            if isinstance(x, Exception):
                raise x
        self._from = {
            k: (as_text(last[0][0]) if last else "0-0")
            for k, last in zip(keys, replies, strict=False)
        }
        self._synced = time.monotonic()
        return replies[-1] or []


@dataclass(eq=False)
class _Host:
    """What the agents one process runs on one Redis URL in one event loop share: the
    Redis client (``raw``; ``redis``, its auto-pipelined form, for commands) and which
    agent sweeps each namespace."""

    raw: AnyRedis
    redis: AnyRedis
    wakeups: _Wakeups | None = None  # None on a Cluster: each agent blocks on its own
    users: int = 0
    sweeping: set[str] = field(default_factory=set)  # namespaces with a sweeper running
    # Cancel notices: one reader per process and namespace, for all its agents.
    cancels: dict[str, CancelPeers] = field(default_factory=dict)

    _hosts: ClassVar[dict[tuple[str, int], _Host]] = {}
    _connecting: ClassVar[dict[tuple[str, int], asyncio.Lock]] = {}

    @classmethod
    async def enter(cls, url: str, block_ms: int) -> _Host:
        key = (url, id(asyncio.get_running_loop()))
        async with cls._connecting.setdefault(key, asyncio.Lock()):
            host = cls._hosts.get(key)
            if host is None:
                raw = await connect(url)
                redis: AnyRedis = AutoPipeline(raw, max_pipelines=HOST_PIPELINES)
                wakeups = None if is_cluster(raw) else _Wakeups(url, block_ms)
                host = cls._hosts[key] = _Host(raw, redis, wakeups)
            host.users += 1
            return host

    async def leave(self, url: str) -> None:
        self.users -= 1
        if self.users:
            return
        key = (url, id(asyncio.get_running_loop()))
        if self._hosts.get(key) is self:
            del self._hosts[key]
            self._connecting.pop(key, None)
        with anyio.CancelScope(shield=True):
            if self.wakeups is not None:
                await self.wakeups.close()
            await self.redis.aclose()  # waits for the batches in flight, closes ``raw``

    def agent_redis(self) -> AnyRedis:
        """The client one agent's parts use (its blocking reads through the wake-ups)."""
        if self.wakeups is None:
            return self.redis
        self.wakeups.start()
        return cast(AnyRedis, _AgentRedis(self.redis, self.wakeups, self))

    def cancel_peers(self, namespace: str) -> CancelPeers:
        """The agents of ``namespace`` in this process that a cancel notice may concern, and
        where their one reader is (reach._worker.cancelling)."""
        return self.cancels.setdefault(namespace, CancelPeers())

    async def sweep_when_free(
        self, namespace: str, interval_s: float, sweep: Callable[[], Awaitable[None]]
    ) -> None:
        """Run ``sweep`` (until cancelled) once no other agent of this process sweeps
        ``namespace``: one sweeper per process and namespace, handed on when its agent
        stops (looked at every ``interval_s``)."""
        while namespace in self.sweeping:
            await anyio.sleep(interval_s)
        self.sweeping.add(namespace)
        try:
            await sweep()
        finally:
            self.sweeping.discard(namespace)


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
        self.cancels: Cancels | None = None
        self.preemption: Preemption | None = None

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
        host = await _Host.enter(url, o.block_ms)
        redis = host.agent_redis()
        cluster = is_cluster(host.raw)
        registry = Registry(redis, o.namespace)
        # The agent's own Client (ctx.client) shares the process's auto-pipelined client:
        # calls from handlers add no connection.
        client = Client(
            redis=host.redis,
            namespace=o.namespace,
            client_id=f"a-{self.agent.agent_id}",
            # ctx.client signs (and checks replies) with the agent's own keys
            secret=o.secret,
            identity_file=o.identity_file,
            trusted_keys_file=o.trusted_keys_file,
        )
        hooks = self.hooks
        outages = Outages(self.agent.agent_id)
        letters = DeadLetters(
            keys=keys, agent_id=self.agent.agent_id, dlq_maxlen=o.dlq_maxlen, hooks=hooks
        )
        shared = Shared(self.agent, o, st, keys, redis, cluster, hooks, outages)
        settlement = Settlement(shared, letters=letters)
        cancels = self.cancels = Cancels(
            shared, client=client, peers=host.cancel_peers(o.namespace)
        )
        preemption = self.preemption = Preemption(shared, cancels=cancels)
        execution = Execution(
            shared,
            registry=registry,
            client=client,
            owner=self.owner,
            settlement=settlement,
            letters=letters,
            cancels=cancels,
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
                tg.start_soon(cancels.watch_when_free)
                tg.start_soon(preemption.watch)
                for _ in range(o.concurrency):
                    tg.start_soon(execution.pool_member)
                if o.sweeper:
                    tg.start_soon(
                        host.sweep_when_free,
                        o.namespace,
                        o.sweep_interval_s,
                        lambda: sweep_forever(shared, client=client, registry=registry),
                    )
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
            await host.leave(url)

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

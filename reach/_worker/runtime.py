"""The running worker: builds the parts (see this package's ``__init__``), starts their
tasks in one task group, and owns the lifecycle.

Start: connect, register (not ready), create the inbox groups, start the heartbeat
thread and the tasks, resume this agent_id's pending entries, mark ready (unless the
application's readiness check fails or it paused itself: ``readiness``), serve.
Stop (``stop()``, a signal, an operator's drain, a newer registration): the consumer
stops reading, entries read but not started are left pending, running handlers get
``drain_timeout_s`` to finish (then they are cancelled), every outcome is settled, and
only then are the tasks cancelled and the agent deregisters and leaves its inbox.

Agents run by one process share what can be shared (:class:`_Host`, one per Redis URL and
event loop): one Redis client, whose commands go out auto-pipelined on one multiplexed
connection (:class:`reach._autopipe.AutoPipeline`; blocking reads take a connection of their
own: 3 connections per process on standalone Redis and Sentinel, 2 per master on a Cluster
where the agents wait on sharded pub/sub), one heartbeat thread (:class:`reach._worker.liveness.Heartbeats`, whose rounds the event loop sends) and one sweeper
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
from .._sessions.store import SessionStore
from ..callpath import SelfSlots
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
from .readiness import Readiness
from .settlement import Settlement
from .state import Outages, Shared, WorkerState
from .stats import Stats
from .sweeping import sweep_forever

if TYPE_CHECKING:
    from ..agent import Agent, RuntimeOptions

log = logging.getLogger("reach.runtime")

HOST_PIPELINES = 2
"""With ``multiplex=False`` only (not the default): auto-pipelined batches in flight at once for
the agents of one process, the connections per node their (non-blocking) commands use. Two, not
one: with one pipeline at a time a worker's fetch, claim and settle wait for each other's round
trips (`bench/profile_worker.py --profile none`, backlog, standalone when pipelines were used
there: 5,300-7,300 msgs/s with one in 2 runs; 7,000-14,400 with two, 6,400-11,800 with four in 5
runs each). By default the commands share one multiplexed connection on standalone Redis and
Sentinel, one per node on a Cluster (batches written without waiting for earlier replies, see
:mod:`reach._autopipe`), whatever this number: a standalone worker process holds at most 3
connections (that one, which also carries the heartbeat rounds, its blocking read, and the
heartbeat thread's own while a handler blocks the loop), and the backlog drains faster than with
two pipelines (`reach bench --floor --repeat 3`, 3 alternated runs each, medians: 24,353 ->
26,735 msgs/s at load ~1, 20,373 -> 21,612 at load 2-3; docs/operations.md has the rest). On a
Cluster a worker process holds 2 per master whatever its agents: that one and the wake-up
subscription of its agents whose inboxes are there (:class:`_ShardWakeups`;
tests/integration/test_cluster_concurrency.py)."""

RESYNC_S = 15.0
"""How often a waiting agent re-reads where its inbox ends even without a wake-up."""


class _Wakeups:
    """One blocking ``XREAD`` on a connection of its own for every agent of the process that
    waits for messages (standalone Redis and Sentinel: ``XREAD`` names keys of one slot only
    on a Cluster), instead of one blocked ``XREADGROUP`` connection per agent.

    A waiting agent's streams are watched from the last entry it knew of (explicit ids: nothing
    added after that id can be missed, whenever the ``XREAD`` is sent); an entry past it wakes
    the agent, which then reads with a plain ``XREADGROUP``. Streams stay watched after a wait
    timed out (the agent usually waits again at once, with the same ids), and are dropped when
    they wake nobody. A stream watched anew while the ``XREAD`` is blocked unblocks it
    (``CLIENT UNBLOCK``) so it is sent again with that stream.
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

    blocks_alone = property(lambda self: self._host.users < 2)  # see xreadgroup

    async def xreadgroup(self, *args: Any, **kwargs: Any) -> Any:
        block = kwargs.get("block")
        if block is None or self._host.users < 2:
            # The one agent of its process blocks on a connection of its own (a round trip
            # less per message than a wake-up; reach._blocking holds it).
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


class _NodeWakeups:
    """The ``SSUBSCRIBE`` connection of one Cluster master: the wake-up channels
    (:meth:`reach.keys.Keys.wake`) of this process's agents whose inboxes are there. A
    message on a channel sets its agent's event. A channel subscribed is confirmed before
    :meth:`subscribe` returns, so an entry added after that is announced to this process.
    A connection lost loses the messages sent meanwhile: every agent of the node is woken
    (it reads its inbox) and the channels are subscribed again on a new connection; a
    channel the server unsubscribes (its slot moved) wakes its agent, which subscribes
    again where the slot map says."""

    def __init__(self, node: Any, events: dict[str, asyncio.Event]) -> None:
        self.node = node
        self.events = events  # channel -> its agent's event (shared by the process's nodes)
        self.channels: set[str] = set()
        self.confirmed: dict[str, asyncio.Future[None]] = {}
        self.moved: set[str] = set()  # unsubscribed by the server: subscribe again
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def _connected(self) -> Any:
        async with self._lock:
            if self._conn is None:
                conn = self.node.connection_class(**self.node.connection_kwargs)
                await conn.connect()
                self._conn = conn
                for ch in self.channels:
                    await conn.send_command("SSUBSCRIBE", ch)
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._read())
            return self._conn

    async def subscribe(self, channel: str) -> None:
        fut = self.confirmed.get(channel)
        if fut is None or fut.done():
            fut = self.confirmed[channel] = asyncio.get_running_loop().create_future()
        self.channels.add(channel)
        conn = await self._connected()
        await conn.send_command("SSUBSCRIBE", channel)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=10)
        except TimeoutError:
            raise rexc.TimeoutError(f"SSUBSCRIBE {channel} not confirmed in 10 s") from None

    async def unsubscribe(self, channel: str) -> None:
        self.channels.discard(channel)
        conn = self._conn
        # A connection the reader already lost has no writer left (redis-py then raises
        # AttributeError): there is nothing to unsubscribe from.
        if conn is not None and conn.is_connected:
            try:
                await conn.send_command("SUNSUBSCRIBE", channel)
            except (rexc.RedisError, OSError):  # the connection is going anyway
                pass

    def _fail(self, e: BaseException) -> None:
        for ch in self.channels:
            fut = self.confirmed.get(ch)
            if fut is not None and not fut.done():
                fut.set_exception(rexc.ConnectionError(f"wake-up subscription failed: {e}"))
                fut.exception()  # retrieved: the subscriber may have given up already
            ev = self.events.get(ch)
            if ev is not None:
                ev.set()

    async def _read(self) -> None:
        while True:
            conn = self._conn
            if conn is None:
                return
            try:
                # push_request: on RESP3 the messages are push replies, returned only so
                msg = await conn.read_response(
                    disable_decoding=True, timeout=30.0, push_request=True
                )
            except Exception as e:  # noqa: BLE001 - lost: wake everyone, subscribe again
                log.debug("wake-up subscription lost: %s", e)
                self._conn = None
                try:
                    await conn.disconnect()
                except Exception:  # noqa: BLE001, S110 - closing a broken connection
                    pass
                self._fail(e)
                return
            if not isinstance(msg, list) or len(msg) < 2:
                continue  # a read that timed out (None), or nothing reach sends
            kind, ch = msg[0], as_text(msg[1])
            if kind == b"smessage":
                ev = self.events.get(ch)
                if ev is not None:
                    ev.set()
            elif kind == b"ssubscribe":
                fut = self.confirmed.get(ch)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            elif kind == b"sunsubscribe" and ch in self.channels:
                self.channels.discard(ch)  # the server's doing: its slot moved
                self.moved.add(ch)
                ev = self.events.get(ch)
                if ev is not None:
                    ev.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001, S110 - cancelled on close
                pass
        if self._conn is not None:
            await self._conn.disconnect()
            self._conn = None


class _ShardWakeups:
    """Cluster: one ``SSUBSCRIBE`` connection per master (:class:`_NodeWakeups`) for every
    waiting agent of the process whose inbox is there, instead of a blocked
    ``XREADGROUP`` connection per agent. ``enqueue.lua`` (and the plain ``XADD`` of an
    unbounded send) publishes on the agent's wake-up channel, in its inbox's slot; the
    agent reads its inbox then, without blocking, on the multiplexed connection. A worker
    process so holds 2 connections per master (that one and this), however many agents it
    runs and whatever their concurrency."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.nodes: dict[str, _NodeWakeups] = {}
        self.events: dict[str, asyncio.Event] = {}
        self.where: dict[str, _NodeWakeups] = {}

    async def join(self, channel: str) -> asyncio.Event:
        """Subscribe ``channel`` (confirmed on return); its event is set by a message."""
        ev = self.events.setdefault(channel, asyncio.Event())
        node = self.raw.get_node_from_key(channel)
        sub = self.nodes.get(node.name)
        if sub is None:
            sub = self.nodes[node.name] = _NodeWakeups(node, self.events)
        old = self.where.get(channel)
        if old is not None and old is not sub:
            await old.unsubscribe(channel)
        self.where[channel] = sub
        sub.moved.discard(channel)
        await sub.subscribe(channel)
        return ev

    def live(self, channel: str) -> bool:
        """``channel`` is subscribed on a connection that is up."""
        sub = self.where.get(channel)
        return (
            sub is not None
            and channel in sub.channels
            and sub._conn is not None
            and (fut := sub.confirmed.get(channel)) is not None
            and fut.done()
            and fut.exception() is None
        )

    async def leave(self, channel: str) -> None:
        sub = self.where.pop(channel, None)
        self.events.pop(channel, None)
        if sub is not None:
            await sub.unsubscribe(channel)

    async def close(self) -> None:
        # A copy per round: another agent of the process may subscribe (and add a node)
        # while a close awaits; what it added is closed in the next round.
        while self.nodes:
            nodes = list(self.nodes.values())
            self.nodes.clear()
            for sub in nodes:
                await sub.close()


class _ClusterAgentRedis:
    """The Redis client of one agent on a Cluster: every command goes to the shared
    auto-pipelined client; a blocking ``XREADGROUP`` of its inbox subscribes (once) to its
    wake-up channel (:class:`_ShardWakeups`), reads without blocking, and when that finds
    nothing waits for a wake-up (or the block time) and reads again."""

    def __init__(self, commands: AnyRedis, wakeups: _ShardWakeups, channel: str) -> None:
        self._commands = commands
        self._wakeups = wakeups
        self._channel = channel
        self._event: asyncio.Event | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._commands, name)

    async def aclose(self, *args: Any, **kwargs: Any) -> None:
        """The process's host closes the shared client."""

    async def xreadgroup(self, *args: Any, **kwargs: Any) -> Any:
        block = kwargs.pop("block", None)
        if block is None:
            return await self._commands.xreadgroup(*args, **kwargs)
        if self._event is None or not self._wakeups.live(self._channel):
            # subscribed (again) before the read: nothing added after it goes unannounced
            self._event = await self._wakeups.join(self._channel)
        ev = self._event
        ev.clear()
        got = await self._commands.xreadgroup(*args, **kwargs)
        if got:
            return got
        with anyio.move_on_after(block / 1000):
            await ev.wait()
        if not ev.is_set():
            return []
        return await self._commands.xreadgroup(*args, **kwargs)


@dataclass(eq=False)
class _Host:
    """What the agents one process runs on one Redis URL in one event loop share: the
    Redis client (``raw``; ``redis``, its auto-pipelined form, for commands) and which
    agent sweeps each namespace."""

    raw: AnyRedis
    redis: AnyRedis
    wakeups: _Wakeups | None = None  # standalone and Sentinel
    shard_wakeups: _ShardWakeups | None = None  # Cluster
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
                cluster = is_cluster(raw)
                host = cls._hosts[key] = _Host(
                    raw,
                    redis,
                    None if cluster else _Wakeups(url, block_ms),
                    _ShardWakeups(raw) if cluster else None,
                )
            host.users += 1
            return host

    async def leave(self, url: str, wake_channel: str = "") -> None:
        self.users -= 1
        if self.shard_wakeups is not None and wake_channel:
            with anyio.CancelScope(shield=True):
                await self.shard_wakeups.leave(wake_channel)
        if self.users:
            return
        key = (url, id(asyncio.get_running_loop()))
        if self._hosts.get(key) is self:
            del self._hosts[key]
            self._connecting.pop(key, None)
        with anyio.CancelScope(shield=True):
            if self.wakeups is not None:
                await self.wakeups.close()
            if self.shard_wakeups is not None:
                await self.shard_wakeups.close()
            await self.redis.aclose()  # waits for the batches in flight, closes ``raw``

    def agent_redis(self, wake_channel: str) -> AnyRedis:
        """The client one agent's parts use (its blocking reads through the wake-ups)."""
        if self.shard_wakeups is not None:
            return cast(AnyRedis, _ClusterAgentRedis(self.redis, self.shard_wakeups, wake_channel))
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
        self.hooks = HookChain([self.stats, MetricsHooks(agent.version), *hooks])
        self.consumer: Consumer | None = None
        self.cancels: Cancels | None = None
        self.preemption: Preemption | None = None
        self.readiness: Readiness | None = None  # what /healthz and /readyz read

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
        # The control plane on a Redis of its own when registry_url names one (reach.planes)
        split = o.registry_url if o.registry_url and o.registry_url != url else None
        control_host = await _Host.enter(split, o.block_ms) if split else host
        control = None if split is None else control_host.redis
        wake_channel = keys.wake(self.agent.agent_id)
        redis = host.agent_redis(wake_channel)
        cluster = is_cluster(host.raw)
        registry = Registry(control or redis, o.namespace)
        # The agent's own Client (ctx.client) shares the process's auto-pipelined client:
        # calls from handlers add no connection.
        client = Client(
            redis=host.redis,
            registry_redis=control,
            namespace=o.namespace,
            client_id=f"a-{self.agent.agent_id}",
            # ctx.client signs (and checks replies) with the agent's own keys
            secret=o.secret,
            identity_file=o.identity_file,
            trusted_keys_file=o.trusted_keys_file,
            max_hops=self.agent.max_hops,  # how deep its handlers' calls may go
        )
        st.self_slots = SelfSlots(o.concurrency, lambda: st.inflight)
        hooks = self.hooks
        outages = Outages(self.agent.agent_id)
        letters = DeadLetters(
            keys=keys, agent_id=self.agent.agent_id, dlq_maxlen=o.dlq_maxlen, hooks=hooks
        )
        shared = Shared(self.agent, o, st, keys, redis, cluster, hooks, outages, control)
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
        liveness = Liveness(
            shared, url=url, registry=registry, version=self.version, registry_url=split
        )
        readiness = self.readiness = Readiness(shared, liveness=liveness)
        hooks.on_start(st)
        try:
            sessions = st.sessions = await SessionStore.open(
                self.agent, keys, url=o.session_url, redis=host.redis, raw=host.raw
            )
            await liveness.register()
            await create_groups(redis, keys.inboxes(self.agent.agent_id))
            async with client, anyio.create_task_group() as tg:
                tg.start_soon(sessions.run)  # the cached tier's subscription, if any
                liveness.start_heartbeat()
                tg.start_soon(liveness.ticker)
                tg.start_soon(readiness.run)
                tg.start_soon(settlement.run)
                tg.start_soon(cancels.watch_when_free)
                tg.start_soon(execution.renew_claims)
                tg.start_soon(preemption.watch)
                pool = _Pool(execution, o.concurrency)
                tg.start_soon(pool.run)
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
                await readiness.start()  # ready, unless its check or a pause says otherwise
                if o.ready_event is not None:
                    o.ready_event.set()
                await consumer.run()
                await self._drain(liveness, settlement, execution, pool)
                tg.cancel_scope.cancel()  # every outcome settled (or given up): no settle cut
        finally:
            with anyio.CancelScope(shield=True):
                if settlement.pending:  # stopped at once (a second signal): what is
                    # computed already is written, briefly; the rest runs again
                    await settlement.settle_rest(retry_s=STOP_SETTLE_S)
                if st.plain.running:  # a thread goes on whatever the signal
                    await self._wait_plain()
            hooks.on_stop(st)
            if st.sessions is not None:
                await st.sessions.aclose()
            liveness.stop_heartbeat()
            await liveness.leave()
            await host.leave(url, wake_channel)
            if split:
                await control_host.leave(split)

    async def _drain(
        self, liveness: Liveness, settlement: Settlement, execution: Execution, pool: _Pool
    ) -> None:
        """The drain, in order (docs/operations.md, "Drain"): the consumer has stopped
        reading; entries read but not started are handed back (left pending, claimed by
        nothing that runs: this agent_id's next start or, once it has left, the sweeper
        takes them); running handlers get ``drain_timeout_s`` to finish, and those still
        running then are cancelled (their entries stay pending and run again); every
        outcome is settled, the flushes already under way awaited. Only then does the
        caller cancel the task group and the agent deregister."""
        st, o = self.state, self.opts
        st.draining = True
        await liveness.announce_drain()
        handed = execution.hand_back()
        if handed:
            log.info("drain: %d entries read but not started are left pending", handed)
        if execution.waiting.waiting:
            log.info(
                "drain: %d handlers waiting for input are stopped with the agent; their "
                "messages run again elsewhere and ask again (an answer given meanwhile is "
                "kept, not asked for twice)",
                execution.waiting.waiting,
            )
        with anyio.move_on_after(o.drain_timeout_s):
            while st.inflight > 0:
                await st.wait_slot()
        if st.inflight:
            log.warning(
                "drain grace of %gs is over: cancelling %d handlers still running; their "
                "messages stay pending and run again once this agent has left",
                o.drain_timeout_s,
                st.inflight,
            )
            await pool.stop(CANCEL_WAIT_S)
            if st.inflight:
                # Leaving now would let their messages run elsewhere beside them.
                log.error(
                    "%d handlers did not end %gs after they were cancelled (they ignore "
                    "cancellation): waiting for them before leaving (SIGKILL to stop now)",
                    st.inflight,
                    CANCEL_WAIT_S,
                )
                while st.inflight:
                    await anyio.sleep(0.1)
            await self._wait_plain()
        left = await settlement.settle_rest(retry_s=SETTLE_RETRY_S)
        if left:
            log.error(
                "drain: %d outcomes could not be written to Redis within %gs; their "
                "messages stay pending and run again (or replay a stored result)",
                left,
                SETTLE_RETRY_S,
            )

    async def _wait_plain(self) -> None:
        """Plain handlers go on in their threads when cancelled: the agent stays
        registered (draining, its heartbeats going) until they return, so that their
        messages, left pending, do not run elsewhere meanwhile; their results are
        dropped (those messages run again). Only SIGKILL ends the wait (the agent is then
        evicted after ``evict_after_s``, the threads gone with the process)."""
        plain = self.state.plain
        if not plain.running:
            return
        log.warning(
            "%d plain (non-async) handlers cannot be cancelled: waiting for them to "
            "return before leaving (SIGKILL to stop now)",
            plain.running,
        )
        while plain.running:  # polled: a thread cannot wake the loop
            self.state.loop_tick = time.monotonic()  # the ticker may be cancelled already
            await anyio.sleep(0.1)


STOP_SETTLE_S = 1.0
"""Stopped at once (a second signal): how long outcomes already computed may take to be
written before the worker leaves them."""

CANCEL_WAIT_S = 5.0
"""At the end of the drain grace, how long the cancelled handlers get to end."""

SETTLE_RETRY_S = 10.0
"""How long a drain keeps writing outcomes that Redis refused (a restart, a failover)
before it leaves them pending."""


class _Pool:
    """The handler pool's tasks, in a task group of their own so that the end of a drain
    grace cancels the handlers, and nothing else (the settler, the heartbeats)."""

    def __init__(self, execution: Execution, size: int) -> None:
        self.execution = execution
        self.size = size
        self._scope: anyio.CancelScope | None = None
        self._done = anyio.Event()

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._scope = tg.cancel_scope
                # a handler waiting for input lends its slot to one more task
                self.execution.waiting.spawn = lambda: tg.start_soon(self.execution.pool_member)
                for _ in range(self.size):
                    tg.start_soon(self.execution.pool_member)
        finally:
            self._done.set()

    async def stop(self, wait_s: float) -> None:
        """Cancel the handlers and wait (up to ``wait_s``) for them to end."""
        if self._scope is not None:
            self._scope.cancel()
        with anyio.move_on_after(wait_s):
            await self._done.wait()

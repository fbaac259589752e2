"""Cluster routing of the auto-pipeline's commands (:class:`_ClusterRouter`): each goes
to the multiplexed connection of the node that holds its slot, redirections (MOVED, ASK,
TRYAGAIN, CLUSTERDOWN) and failed nodes are followed as redis-py does, and what cannot
be routed goes through the plain cluster client. See the package docstring."""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from typing import TYPE_CHECKING, Any

from redis import exceptions as rexc
from redis.client import EMPTY_RESPONSE, NEVER_DECODE

from ..connection import parser_follows_map
from .mux import _Mux
from .pending import (
    _CLEAN,
    _NO_EMPTY,
    _STREAMS,
    MAX_REDIRECTS,
    _answer,
    _backoff,
    _consumed,
    _Pending,
    _policy_of,
)

if TYPE_CHECKING:  # annotations only: the core imports this module
    from .core import AutoPipeline

log = logging.getLogger("reach.autopipe")


class _NodePool:
    """A Cluster node's connections (redis-py's ``ClusterNode``) as a :class:`_Mux`'s
    pool: the mux takes one and keeps it while it is in use, outside the node's count
    (the plain client's commands keep every one of ``max_connections``: reach's gate lets
    that many run at once, and one more would fail with ``MaxConnectionsError``)."""

    def __init__(self, node: Any) -> None:
        self.node = node

    async def get_connection(self) -> Any:
        node = self.node
        conn = node.acquire_connection()
        node._connections.remove(conn)  # held apart from the pool until released
        if getattr(conn, "should_reconnect", bool)():  # marked by a map refresh: a new socket
            await conn.disconnect()
        return conn

    async def release(self, conn: Any) -> None:
        node = self.node
        # A master turned replica (a failover) gets no more commands: nothing kept open.
        if node.server_type != "replica" and len(node._connections) < node.max_connections:
            node._connections.append(conn)
            node.release(conn)
        else:
            await conn.disconnect()


class _ClusterRouter:
    """Cluster, multiplexed: each command goes to the multiplexed connection of the node
    that holds its keys' slot (redis-py's own routing: ``_determine_slot``, the slot map
    of its ``nodes_manager``). A redirection or a failed connection sends the command on
    after the slot map is patched or refreshed as redis-py does (``move_slot``,
    ``nodes_manager.initialize``); what it cannot route (no key, keys of several slots, a
    command redis-py sends to chosen nodes) goes through the plain cluster client."""

    def __init__(self, auto: AutoPipeline) -> None:
        self.auto = auto
        self.redis: Any = auto.redis
        self.muxes: dict[str, _Mux] = {}  # by node name
        self.retired: list[_Mux] = []  # of node objects the slot map replaced
        self.backlog: collections.deque[_Pending] = collections.deque()  # wait for the map
        self.moves: list[Exception] = []  # MOVED replies not applied to the slot map yet
        self.refresh = False  # reload the whole slot map before routing the backlog
        self.failed_node: str | None = None
        self.pause = 0.0
        self.task: asyncio.Task[None] | None = None  # refreshes, then routes the backlog
        self.plain: set[asyncio.Task[None]] = set()  # commands sent by the plain client
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._kinds: dict[str, str] = {}  # how a command word's slot is found
        self.followed: collections.Counter[str] = collections.Counter()
        """Redirections followed so far, by kind (``MovedError``, ``AskError``, ...)."""
        # The words of a command, as a standalone pipeline makes them (a Cluster pipeline
        # refuses some methods, EVALSHA among them); nothing is connected.
        self._capture: Any = None

    # -- routing ----------------------------------------------------------------------------
    def submit(self, p: _Pending) -> None:
        if self.closed:
            p.fut.set_exception(rexc.ConnectionError("the client is closed"))
            return
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            if self.loop is not None:
                self._moved_loop()
            self.loop = loop
            self._tidy_later()
        if p.words is None:
            try:
                self._capture_words(p)
            except Exception as e:  # noqa: BLE001 - refused before the write: its own error
                _answer(p, e)
                return
        if self.task is not None or self.backlog or self.redis._initialize:
            self.backlog.append(p)  # after the commands waiting for the slot map
            self._start()
            return
        self._route(p)

    def _tidy_later(self) -> None:
        task = asyncio.get_running_loop().create_task(self._tidy())
        self.plain.add(task)
        task.add_done_callback(self.plain.discard)

    async def _tidy(self) -> None:
        """Close the idle connections of redis-py's startup nodes (the objects it asks
        for the slot map, not those it sends commands to): each keeps the connection it
        read the map on, one more per node than the commands need. Reopened when the map
        is read again."""
        nodes = self.redis.nodes_manager
        for name, node in list(getattr(nodes, "startup_nodes", {}).items()):
            close = getattr(node, "disconnect_free_connections", None)
            if close is not None and nodes.nodes_cache.get(name) is not node and node._free:
                try:
                    await close()
                except Exception:  # only a socket left open
                    log.debug("closing a startup node's connection failed", exc_info=True)

    def _moved_loop(self) -> None:
        # The old loop's tasks and futures stay with it (each mux starts afresh too).
        self.backlog = collections.deque()
        self.moves = []
        self.task = None
        self.plain = set()
        self.pause = 0.0

    def _capture_raw(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        cap = self._capture
        if cap is None:
            from redis.asyncio import Redis  # only its pipeline's command methods are used

            cap = self._capture = Redis().pipeline(transaction=False)
        cap.command_stack.clear()
        getattr(cap, method)(*args, **kwargs)
        words, options = cap.command_stack.pop()
        return words, options

    def _capture_words(self, p: _Pending) -> None:
        words, options = self._capture_raw(p.method, p.args, p.kwargs)
        p.words = words
        p.never_decode = NEVER_DECODE in options
        p.empty = options.get(EMPTY_RESPONSE, _NO_EMPTY)
        p.options = {k: v for k, v in options.items() if k not in _CLEAN}

    def _route(self, p: _Pending) -> None:
        if p.fut.done():
            return
        nodes = self.redis.nodes_manager
        if p.ask is not None:
            (host, port), p.ask = p.ask, None
            node = nodes.get_node(host=host, port=port)
            if node is None:  # a node the slot map does not know yet: redis-py follows it
                self._send_plain(p)
                return
            mux = self._mux(node)
            asking: asyncio.Future[Any] = p.fut.get_loop().create_future()
            asking.add_done_callback(_consumed)
            ask = _Pending.raw(("ASKING",), asking)
            ask.asking = True
            mux.submit(ask)  # right before the command, on the same connection
            mux.submit(p)
            return
        slot = self._slot(p)
        if slot is None:
            self._send_plain(p)
            return
        try:
            node = nodes.get_node_from_slot(slot)
        except rexc.SlotNotCoveredError:  # redis-py refreshes the map, or fails it
            self._send_plain(p)
            return
        self._mux(node).submit(p)

    def _mux(self, node: Any) -> _Mux:
        mux = self.muxes.get(node.name)
        if mux is None or mux.node is not node:
            if mux is not None:  # kept until it is done with what it holds
                self.retired = [m for m in self.retired if m.waiting() or m.conn is not None]
                self.retired.append(mux)
            mux = self.muxes[node.name] = _Mux(self.auto, _NodePool(node), self, node)
        return mux

    def _slot(self, p: _Pending) -> int | None:
        """The slot of ``p``'s keys as redis-py computes it, or None: no key, keys of
        several slots, or a command redis-py does not route by one slot."""
        assert p.words is not None and p.options is not None
        words = p.words
        cmd = words[0]
        if not isinstance(cmd, str) or "target_nodes" in p.options:
            return None
        kind = self._kinds.get(cmd)
        if kind is None:
            kind = self._kind_of(cmd)
        if kind == "one":  # its one key is its first argument (GET, HSET, XADD, ...)
            return self.redis.keyslot(words[1]) if len(words) > 1 else None
        if kind == "script":  # EVAL/EVALSHA: numkeys keys (none: any node, the plain way)
            try:
                keys = words[3 : 3 + int(words[2])]
            except (IndexError, ValueError, TypeError):
                return None
            return self._one_slot(keys)
        if kind == "streams":
            return self._streams_slot(words)
        if kind == "plain":
            return None
        # redis-py's routing coroutine, run to its end at once: with the checks of
        # _kind_of it only reads tables (a suspension would be a server call: not here).
        coro = self.redis._determine_slot(*words)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value if isinstance(done.value, int) else None
        except (rexc.RedisError, ValueError, IndexError, TypeError):
            return None  # no key, keys in several slots: the plain client's error
        coro.close()
        return None

    def _kind_of(self, cmd: str) -> str:
        """How the slot of command ``cmd`` is found (kept per command word): ``one``,
        ``script``, ``streams``, ``keys`` (redis-py's key table), or ``plain`` (not by
        one slot: sent by the plain client)."""
        r = self.redis
        commands = r.commands_parser.commands
        word = cmd.upper()
        kind = "keys"
        if word in r.command_flags or word in r.result_callbacks:
            kind = "plain"  # sent to chosen nodes, or its replies are merged
        elif self._has_policy(cmd):
            kind = "plain"  # a request policy of its own (redis-py >= 7)
        elif word in ("EVAL", "EVALSHA"):
            kind = "script"
        elif word in _STREAMS:
            kind = "streams"
        else:
            info = commands.get(cmd.lower().split()[0])
            if not isinstance(info, dict) or "movablekeys" in info.get("flags", ()):
                kind = "plain"  # redis-py would ask a node (COMMAND GETKEYS)
            elif " " not in cmd and info.get("first_key_pos") == 1 == info.get("last_key_pos"):
                kind = "one"
        if commands:  # the table is read (else ask again once it is)
            self._kinds[cmd] = kind
        return kind

    def _has_policy(self, cmd: str) -> bool:
        resolver = getattr(self.redis, "_policy_resolver", None)
        if resolver is None:
            return False
        coro = resolver.resolve(cmd.lower())
        try:
            coro.send(None)
        except StopIteration as done:
            return bool(done.value)
        except Exception:  # noqa: BLE001 - unknown to it: routed the plain way
            return True
        coro.close()  # it would wait on something: the plain way
        return True

    def _one_slot(self, keys: Any) -> int | None:
        slots = {self.redis.keyslot(k) for k in keys}
        return slots.pop() if len(slots) == 1 else None

    def _streams_slot(self, words: tuple[Any, ...]) -> int | None:
        for i, w in enumerate(words):
            if (
                isinstance(w, (str, bytes))
                and str(w if isinstance(w, str) else w.decode()).upper() == "STREAMS"
            ):
                rest = words[i + 1 :]
                return self._one_slot(rest[: len(rest) // 2])
        return None

    def _send_plain(self, p: _Pending) -> None:
        """Through the plain cluster client (redis-py's routing, redirections, retries)."""
        task = p.fut.get_loop().create_task(self._plain(p))
        self.plain.add(task)
        task.add_done_callback(self.plain.discard)

    async def _plain(self, p: _Pending) -> None:
        self.auto.commands += 1
        try:
            reply = await getattr(self.redis, p.method)(*p.args, **p.kwargs)
        except Exception as e:  # noqa: BLE001 - its caller's error
            reply = e
        _answer(p, reply)

    async def blocking(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A blocking ``XREAD``/``XREADGROUP`` by the plain client, on a connection of its
        own, sent straight to the node of its streams' slot. redis-py would first ask a
        node for the keys of this movable-keys command (``COMMAND GETKEYS``: one more round
        trip, on one more connection of that node, for every blocking read); anything that
        goes wrong that way is sent again the plain way (redis-py's retries, redirections)."""
        plain = getattr(self.redis, method)
        try:
            words, options = self._capture_raw(method, args, kwargs)
        except Exception:  # noqa: BLE001 - redis-py's own refusal, raised the plain way
            return await plain(*args, **kwargs)
        slot = self._streams_slot(words)
        if slot is None or self.redis._initialize:
            return await plain(*args, **kwargs)
        try:
            node = self.redis.nodes_manager.get_node_from_slot(slot)
        except rexc.SlotNotCoveredError:
            return await plain(*args, **kwargs)
        try:
            return await self.redis.execute_command(*words, target_nodes=node, **options)
        except (rexc.ConnectionError, rexc.TimeoutError, rexc.ClusterError, rexc.AskError):
            return await plain(*args, **kwargs)

    # -- redirections and failures --------------------------------------------------------------
    def redirected(self, p: _Pending, e: Exception) -> None:
        """A node answered ``p`` with MOVED, ASK, TRYAGAIN or CLUSTERDOWN: it did not run."""
        p.redirects += 1
        p.tries = 0  # another node: its script cache is its own
        self.followed[type(e).__name__] += 1
        if p.redirects > MAX_REDIRECTS:
            _answer(p, e)
            return
        if isinstance(e, rexc.MovedError):  # the slot moved: patch the map, then route
            self.moves.append(e)
        elif isinstance(e, rexc.AskError):  # the slot is moving: this once, to that node
            p.ask = (e.host, e.port)
            if self.task is None and not self.backlog:
                self._route(p)
                return
        elif isinstance(e, rexc.TryAgainError):  # keys of a slot being moved: soon again
            self.pause = max(self.pause, 0.05)
        else:  # CLUSTERDOWN: a failover under way
            self.refresh = True
            self.pause = max(self.pause, 0.25)
        self.backlog.append(p)
        self._start()

    def failed(self, mux: _Mux, again: list[_Pending], pause: float) -> None:
        """``mux``'s connection failed: ``again`` go (first) where the refreshed slot map
        says, after ``pause``; the node is asked last for the map (as redis-py does)."""
        self.refresh = True
        name = getattr(mux.node, "name", None)
        self.failed_node = name
        mover = getattr(self.redis.nodes_manager, "move_node_to_end_of_cached_nodes", None)
        if mover is not None and name is not None:
            mover(name)
        self.pause = max(self.pause, pause)
        for p in again:
            p.tries = 0  # maybe another node (a failover): its script cache is its own
        self.backlog.extendleft(reversed(again))
        self._start()

    def _start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        """Refresh the slot map as needed, then route the backlog; again while some wait."""
        try:
            while self.backlog and not self.closed:
                if self.pause > 0:
                    pause, self.pause = self.pause, 0.0
                    await asyncio.sleep(pause)
                err: Exception | None = None
                try:
                    await self._refresh()
                except Exception as e:  # noqa: BLE001 - no slot map: the backlog's failure
                    err = e
                waiting, self.backlog = self.backlog, collections.deque()
                for p in waiting:
                    if err is None:
                        self._route(p)
                    else:
                        self._no_map(p, err)
        finally:
            if self.task is asyncio.current_task():
                self.task = None
        if self.backlog and not self.closed:  # came while it ended
            self._start()

    async def _refresh(self) -> None:
        r = self.redis
        nodes = r.nodes_manager
        moves, self.moves = self.moves, []
        if r._initialize:  # closed by redis-py after an error (a plain command's)
            self.refresh = False
            await r.initialize()
            await self._tidy()
            return
        seen: set[tuple[Any, ...]] = set()
        for e in moves:  # as redis-py: patch the map, reload it every reinitialize_steps
            where = (e.slot_id, e.host, e.port)  # type: ignore[attr-defined]
            if where in seen:
                continue
            seen.add(where)
            r.reinitialize_counter += 1
            if r.reinitialize_steps and r.reinitialize_counter % r.reinitialize_steps == 0:
                r.reinitialize_counter = 0
                self.refresh = True
            else:
                moved = nodes.move_slot(e)
                if inspect.isawaitable(moved):  # a coroutine in redis-py >= 7
                    await moved
        if self.refresh:
            self.refresh = False
            failed, self.failed_node = self.failed_node, None
            kwargs: dict[str, Any] = {}
            if failed and "last_failed_node_name" in inspect.signature(nodes.initialize).parameters:
                kwargs["last_failed_node_name"] = failed
            await nodes.initialize(**kwargs)
            parser_follows_map(r)
            await self._tidy()

    def _no_map(self, p: _Pending, err: Exception) -> None:
        """The slot map could not be read: a failure of ``p``, retried per the policy."""
        if p.fut.done():
            return
        retry, retries, supported = _policy_of(self.redis.retry)
        p.failures += 1
        if isinstance(err, supported) and (retries < 0 or p.failures <= retries):
            self.backlog.append(p)
            self.pause = max(self.pause, _backoff(retry, p.failures))
        else:
            _answer(p, err)

    # -- waiting and closing ----------------------------------------------------------------
    def waiting(self) -> list[asyncio.Future[Any]]:
        futs: list[asyncio.Future[Any]] = [p.fut for p in self.backlog]
        for mux in (*self.muxes.values(), *self.retired):
            futs.extend(mux.waiting())
        futs.extend(self.plain)
        return futs

    async def aclose(self) -> None:
        self.closed = True
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for p in self.backlog:
            _answer(p, rexc.ConnectionError("the client is closed"))
        self.backlog.clear()
        for mux in (*self.muxes.values(), *self.retired):
            await mux.aclose()
        if self.plain:
            await asyncio.gather(*self.plain, return_exceptions=True)

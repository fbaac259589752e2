"""The batching core: :class:`AutoPipeline` (the client surface, the queue, and the
``multiplex=False`` path of redis-py pipelines) and :class:`BatchPipeline`. It hands each
command to the multiplexed connection (:mod:`.mux`) or the Cluster router
(:mod:`.cluster`) when it has one. See the package docstring for the design."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any, Self

from redis import exceptions as rexc

from ..connection import AnyRedis, is_cluster
from ..errors import ConfigError
from ..scripts._loader import is_noscript, load_all
from .cluster import _ClusterRouter
from .mux import _Mux
from .pending import (
    _BEFORE_WRITE,
    _BY_WORD,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_PIPELINES,
    _answer,
    _Pending,
)


def _batched(name: str) -> Callable[..., Awaitable[Any]]:
    """The method ``name`` of :class:`AutoPipeline`: redis-py's, sent in the current batch."""

    async def method(self: AutoPipeline, *args: Any, **kwargs: Any) -> Any:
        return await self._enqueue(name, args, kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` of redis-py, sent in the current batch."
    return method


class AutoPipeline:
    """An asyncio Redis client (see the module docstring) over ``redis``.

    Unless ``multiplex=False``: one multiplexed connection (standalone, Sentinel), one per
    node (Cluster), each with at most ``max_in_flight`` (8192) commands written and
    unanswered, in writes of at most ``max_batch`` (512). ``multiplex=False``:
    ``max_pipelines`` (default 4) batches in flight at most, each of at most ``max_batch``
    commands. The wrapped client stays usable on its own;
    closing this one (:meth:`aclose`) waits for the commands in flight and closes the
    wrapped client; :meth:`drain` only waits.
    """

    def __init__(
        self,
        redis: AnyRedis,
        *,
        max_pipelines: int = DEFAULT_MAX_PIPELINES,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        multiplex: bool = True,
    ) -> None:
        if max_pipelines < 1 or max_batch < 1 or max_in_flight < 1:
            raise ConfigError(
                "max_pipelines, max_batch and max_in_flight must be >= 1 (got "
                f"{max_pipelines}, {max_batch}, {max_in_flight})."
            )
        self.redis = redis
        self.max_pipelines = max_pipelines
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.cluster = is_cluster(redis)
        # One multiplexed connection where the client is one pool's (not a Cluster, not a
        # client pinned to one connection of its own).
        self._mux = (
            _Mux(self)
            if multiplex
            and not self.cluster
            and hasattr(redis, "connection_pool")
            and getattr(redis, "connection", None) is None
            else None
        )
        # Cluster: one multiplexed connection per node (redis-py's asyncio RedisCluster).
        self._router = (
            _ClusterRouter(self)
            if multiplex
            and self.cluster
            and hasattr(redis, "nodes_manager")
            and hasattr(redis, "commands_parser")
            else None
        )
        self._open: list[_Pending] = []  # the batch that gathers commands now
        self._full: collections.deque[list[_Pending]] = collections.deque()
        self._running = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Batches written so far (pipelines, or plain commands for a batch of one)."""
        self.commands = 0
        """Commands written so far (a NOSCRIPT resend counts again)."""

    # -- the queue ------------------------------------------------------------------------
    def _enqueue(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Queue ``method(*args, **kwargs)`` in the current batch; its reply's future."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._mux is not None:
            self._mux.submit(_Pending(method, args, kwargs, fut))
            return fut
        if self._router is not None:
            self._router.submit(_Pending(method, args, kwargs, fut))
            return fut
        self._open.append(_Pending(method, args, kwargs, fut))
        if len(self._open) >= self.max_batch:
            self._full.append(self._open)
            self._open = []
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        """Start batches while fewer than ``max_pipelines`` are in flight (the rest wait
        for one to finish: :meth:`_run` calls this again)."""
        self._scheduled = False
        while self._running < self.max_pipelines:
            if self._full:
                batch = self._full.popleft()
            elif self._open:
                batch, self._open = self._open, []
            else:
                return
            batch = [p for p in batch if not p.fut.done()]  # cancelled callers: not sent
            if not batch:
                continue
            self._running += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Pending]) -> None:
        try:
            await self._send(batch)
        except BaseException as e:  # the batch's fate, whatever it is, is each caller's
            for p in batch:
                if not p.fut.done():
                    p.fut.set_exception(
                        e
                        if isinstance(e, Exception)
                        else rexc.ConnectionError(f"the command was interrupted ({e!r})")
                    )
            if not isinstance(e, Exception):
                raise
        finally:
            self._running -= 1
            if self._full or self._open:
                self._flush()

    async def _send(self, batch: list[_Pending]) -> None:
        self.batches += 1
        self.commands += len(batch)
        if len(batch) == 1:
            replies = [await self._one(batch[0])]
        else:
            replies = await self._pipeline(batch)
        retry: list[_Pending] = []
        for p, x in zip(batch, replies, strict=True):
            if isinstance(x, Exception) and is_noscript(x) and p.tries == 0:
                retry.append(p)
            else:
                _answer(p, x)  # answered now: a failure of the resend below is not theirs
        if retry:
            # The scripts are not in the server's cache: load them and send just those
            # commands again (they did not run).
            await load_all(self.redis)
            for p in retry:
                p.tries += 1
            again = await self._pipeline(retry) if len(retry) > 1 else [await self._one(retry[0])]
            for p, x in zip(retry, again, strict=True):
                _answer(p, x)

    async def _one(self, p: _Pending) -> Any:
        """The plain command; its error (a reply or redis-py's refusal) as its reply."""
        try:
            return await getattr(self.redis, p.method)(*p.args, **p.kwargs)
        except (rexc.ResponseError, *_BEFORE_WRITE) as e:
            return e

    async def _pipeline(self, batch: list[_Pending]) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        queued: list[int] = []
        replies: list[Any] = [None] * len(batch)
        for i, p in enumerate(batch):
            try:
                word = _BY_WORD.get(p.method)
                if word is not None:  # redis-py's Cluster pipeline refuses the methods
                    pipe.execute_command(word, *p.args, **p.kwargs)
                else:
                    getattr(pipe, p.method)(*p.args, **p.kwargs)
            except Exception as e:  # noqa: BLE001 - refused as it was queued: its own error
                replies[i] = e
            else:
                queued.append(i)
        if not queued:
            return replies
        try:
            got = await pipe.execute(raise_on_error=False)
        except _BEFORE_WRITE:
            # Nothing was written: one command is bad for the whole pipeline (an argument
            # redis-py cannot encode, keys in different slots). Send each on its own, so
            # only that one fails.
            for i in queued:
                replies[i] = await self._one(batch[i])
            return replies
        for i, x in zip(queued, got, strict=True):
            replies[i] = x
        return replies

    @property
    def multiplexed(self) -> bool:
        """True when the commands go out on multiplexed connections (one, or one per node
        of a Cluster), not pipelines."""
        return self._mux is not None or self._router is not None

    async def drain(self) -> None:
        """Wait until every command queued so far has been answered."""
        mux = self._mux if self._mux is not None else self._router
        if mux is not None:
            while waiting := mux.waiting():
                await asyncio.wait(waiting)
            return
        while self._open or self._full or self._tasks:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            else:
                await asyncio.sleep(0)

    # -- the client surface: batched -------------------------------------------------------
    evalsha = _batched("evalsha")
    eval = _batched("eval")
    get = _batched("get")
    set = _batched("set")
    expire = _batched("expire")
    pexpire = _batched("pexpire")
    pttl = _batched("pttl")
    hdel = _batched("hdel")
    hget = _batched("hget")
    hgetall = _batched("hgetall")
    hincrby = _batched("hincrby")
    hmget = _batched("hmget")
    hset = _batched("hset")
    lrange = _batched("lrange")
    rpush = _batched("rpush")
    sadd = _batched("sadd")
    scard = _batched("scard")
    smembers = _batched("smembers")
    srem = _batched("srem")
    zadd = _batched("zadd")
    zcard = _batched("zcard")
    zrange = _batched("zrange")
    zrangebyscore = _batched("zrangebyscore")
    zrem = _batched("zrem")
    zscore = _batched("zscore")
    xack = _batched("xack")
    xadd = _batched("xadd")
    xdel = _batched("xdel")
    xgroup_create = _batched("xgroup_create")
    xinfo_groups = _batched("xinfo_groups")
    xinfo_stream = _batched("xinfo_stream")
    xlen = _batched("xlen")
    xpending = _batched("xpending")
    xpending_range = _batched("xpending_range")
    xrange = _batched("xrange")
    xrevrange = _batched("xrevrange")

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """A command by its words (``"XADD", key, ...``), sent in the current batch."""
        return await self._enqueue("execute_command", args, options)

    def submit(self, *args: Any) -> asyncio.Future[Any]:
        """A command by its words, queued in the current batch now, without waiting: the
        future of its reply (an error reply or a failure as its exception; NOSCRIPT is
        recovered as for any command). On the multiplexed connection the writer sends it
        at the next turn of the event loop, so the caller can prepare its next commands
        while Redis runs these (``send_many``'s chunks, :mod:`reach._sending.delivery`).
        Cancelling the future drops the command if it is not written yet."""
        return self._enqueue("execute_command", args, {})

    async def delete(self, *names: Any) -> Any:
        return await self._keyed("delete", names)

    async def exists(self, *names: Any) -> Any:
        return await self._keyed("exists", names)

    async def _keyed(self, method: str, names: tuple[Any, ...]) -> Any:
        if self.cluster and len(names) > 1:  # the Cluster client splits them by slot
            return await getattr(self.redis, method)(*names)
        return await self._enqueue(method, names, {})

    async def xread(self, *args: Any, **kwargs: Any) -> Any:
        """``XREAD``; with ``block`` it waits on the server, on a connection of its own."""
        if kwargs.get("block") is not None:
            if self._router is not None:
                return await self._router.blocking("xread", args, kwargs)
            return await self.redis.xread(*args, **kwargs)
        return await self._enqueue("xread", args, kwargs)

    async def xreadgroup(self, *args: Any, **kwargs: Any) -> Any:
        """``XREADGROUP``; with ``block`` it waits on the server, on a connection of its own."""
        if kwargs.get("block") is not None:
            if self._router is not None:
                return await self._router.blocking("xreadgroup", args, kwargs)
            return await self.redis.xreadgroup(*args, **kwargs)
        return await self._enqueue("xreadgroup", args, kwargs)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        """``transaction=False``: a pipeline whose commands join the current batch (see
        :class:`BatchPipeline`); a transaction (``MULTI``) is the wrapped client's own."""
        if transaction or shard_hint is not None:
            return self.redis.pipeline(transaction, shard_hint)
        return BatchPipeline(self)

    # -- the client surface: passed through ------------------------------------------------
    def info(self, *args: Any, **kwargs: Any) -> Any:
        return self.redis.info(*args, **kwargs)

    def ping(self, *args: Any, **kwargs: Any) -> Any:
        return self.redis.ping(*args, **kwargs)

    def script_load(self, *args: Any, **kwargs: Any) -> Any:
        return self.redis.script_load(*args, **kwargs)

    def scan_iter(self, *args: Any, **kwargs: Any) -> Any:
        return self.redis.scan_iter(*args, **kwargs)

    async def aclose(self, *args: Any, **kwargs: Any) -> Any:
        """Wait for the commands queued so far, then close the wrapped client."""
        await self.drain()
        if self._mux is not None:
            await self._mux.aclose()
        if self._router is not None:
            await self._router.aclose()
        return await self.redis.aclose(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Anything else redis-py offers: the wrapped client's own, not batched.
        return getattr(self.redis, name)


class BatchPipeline:
    """``AutoPipeline.pipeline(transaction=False)``: queue commands as on redis-py's
    pipeline, then ``await execute()`` sends them in the current batch of the auto-pipeline
    (with whatever other tasks issued in the same turn) and returns their replies in order.

    ``execute(raise_on_error=True)`` raises the first error (after every reply came, as
    redis-py does); ``raise_on_error=False`` returns every error in its command's place,
    a failed connection's too (the commands may be in different writes: some may have run
    when another failed, and each command's own outcome is what its caller needs).
    """

    def __init__(self, auto: AutoPipeline) -> None:
        self._auto = auto
        self._stack: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self._stack)

    def __getattr__(self, name: str) -> Callable[..., BatchPipeline]:
        if name.startswith("_"):
            raise AttributeError(name)

        def queue(*args: Any, **kwargs: Any) -> BatchPipeline:
            self._stack.append((name, args, kwargs))
            return self

        return queue

    def execute_command(self, *args: Any, **options: Any) -> BatchPipeline:
        self._stack.append(("execute_command", args, options))
        return self

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack, self._stack = self._stack, []
        if not stack:
            return []
        futs = [self._auto._enqueue(m, a, k) for m, a, k in stack]
        replies: list[Any] = []
        try:
            for fut in futs:
                try:
                    replies.append(await fut)
                except Exception as e:  # noqa: BLE001 - each command's error in its place
                    replies.append(e)
        except BaseException:
            for fut in futs:  # cancelled, or the connection failed: nobody reads the rest
                if not fut.done():
                    fut.cancel()
                elif not fut.cancelled():
                    fut.exception()  # retrieved: no "never retrieved" warning
            raise
        if raise_on_error:
            for x in replies:
                if isinstance(x, Exception):
                    raise x
        return replies

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stack = []

    def reset(self) -> None:
        self._stack = []

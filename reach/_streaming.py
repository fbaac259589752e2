"""Streamed results, the caller's side: :meth:`reach.Client.stream` and the
:class:`Stream` it returns (docs/concepts.md, *Streamed results*).

A stream is one message, sent as :meth:`~reach.Client.request` sends it, whose handler's
chunks are handed out as they arrive: ``async for chunk in client.stream(cap, payload)``.
It registers a :class:`~reach._chunks.ChunkSink` with the client's reply reader before the
message is sent, so no chunk can come before it is looked for; the reader fills the sink
and wakes it, and the final reply (read after every chunk: the worker writes them first)
ends the iteration, or raises its error after the chunks that came before it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self

import anyio
import msgspec

from . import metrics
from ._chunks import ChunkSink
from .callpath import CallGate
from .envelope import Envelope, now_ms
from .errors import DeadlineExceeded, NoAgentAvailable, StreamTooLarge
from .outcomes import RequestOutcome, Status, blames_agent

if TYPE_CHECKING:
    from .client import Client

_NOT_YET = object()


class Stream:
    """The chunks of one message's handler, then its final result.

    ``async for chunk in stream`` yields each chunk once, in the order the handler emitted
    them; the loop ends when the final reply comes, and :attr:`result` then holds the final
    result (an async-generator handler's ``ctx.result``, None unless it set one). A handler
    that failed raises its error (:class:`~reach.RemoteError`, :class:`~reach.Rejected`,
    :class:`~reach.DeadlineExceeded`...) from the loop after the chunks it sent. The
    message is sent at the first iteration. Leaving the loop early: use ``async with
    client.stream(...) as s`` (or call :meth:`aclose`), so the call is forgotten at once;
    otherwise it is when the stream is garbage-collected, or at the deadline.
    """

    def __init__(
        self,
        client: Client,
        env: Envelope,
        where: Mapping[str, Any] | None,
        *,
        max_bytes: int | None = None,
        gate: CallGate | None = None,
        timeout_for: bool = False,
    ) -> None:
        self._client = client
        self._gate = gate  # a handler's call (ctx.client.stream): reach.callpath
        # timeout_for: its caller named no deadline: the capability's advertised timeout
        # (else the client's default) is set when it is sent (Client.timeout_for).
        self._timeout_for = timeout_for
        self.envelope = env
        self._where = where
        # max_bytes: the chunks' encoded bytes this stream takes in all (None: no bound);
        # past them the iteration raises StreamTooLarge.
        self._sink = ChunkSink(max_bytes=max_bytes)
        self._started = False
        self._done = False
        self._agent_id = ""
        self._result: Any = _NOT_YET
        self._t0 = 0.0
        self._abandon: weakref.finalize[Any, Stream] | None = None
        self._fast = 0  # chunks handed out without waiting
        self.seq = 0
        """The number of the chunk last handed out (the first chunk is 1; 0 before it): a
        caller that stops here resumes with ``client.resume(msg_id, after=stream.seq)``."""

    @property
    def msg_id(self) -> str:
        return self.envelope.msg_id

    @property
    def result(self) -> Any:
        """The final result, once the iteration ended; :class:`LookupError` before."""
        if self._result is _NOT_YET:
            raise LookupError(
                f"the stream of msg {self.msg_id} has no final result yet: iterate it to the "
                "end first (async for chunk in stream: ...)."
            )
        return self._result

    @property
    def duplicates(self) -> int:
        """Chunks dropped because their number had been delivered already (a redelivered
        message's run sending its first chunks again)."""
        return self._sink.duplicates

    def __aiter__(self) -> Self:
        return self

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop waiting for this stream (the handler runs on; its later chunks and final
        reply are dropped when they come)."""
        if self._started and not self._done:
            self._end(ok=True)

    async def __anext__(self) -> Any:
        chunks = self._sink.chunks
        if chunks and self._started and not self._done:  # read already: no wait to set up
            self._fast += 1
            if self._fast % 256 == 0:  # a long run of read chunks still lets others run
                await anyio.lowlevel.checkpoint()
            self.seq += 1
            return chunks.popleft()
        if self._done:
            raise StopAsyncIteration
        try:
            if not self._started and await self._start():
                raise StopAsyncIteration
            return await self._next()
        except StopAsyncIteration:
            raise
        except BaseException as e:
            self._failed(e)
            raise

    async def start(self) -> None:
        """Send the message now rather than at the first iteration, so that what stops the
        send (:class:`~reach.NoAgentAvailable`, :class:`~reach.Overloaded`, Redis
        unreachable...) is raised here, before anything is waited for (the A2A gateway
        answers such a request with an error, and one it sent with a task). Nothing
        happens when it was sent already."""
        if self._started:
            return
        try:
            await self._start()
        except BaseException as e:
            self._failed(e)
            raise

    def _failed(self, e: BaseException) -> None:
        if not self._done:
            self._end(ok=not isinstance(e, DeadlineExceeded))
        if isinstance(e, Exception):
            metrics.client_reply(
                self.envelope.capability,
                metrics.client_outcome(e),
                time.perf_counter() - self._t0,
            )

    async def _start(self) -> bool:
        """Send the message; True when it is over already (a fallback answered)."""
        client, env = self._client, self.envelope
        self._started = True
        self._t0 = time.perf_counter()
        if self._timeout_for:
            timeout_ms = int(await client.timeout_for(env.capability) * 1000)
            # Sent now, not when it was built: its budget counts from here (one clock read
            # for both, so the budget is the timeout exactly).
            now = now_ms()
            env = self.envelope = msgspec.structs.replace(
                env, sent_ms=now, deadline_ms=now + timeout_ms
            )
        client._ensure_reader()
        reader = client._reader
        reader.streams[env.msg_id] = self._sink
        reader.expect(env.msg_id)  # the final reply is kept for this call, and wakes it
        try:
            self._agent_id = await client.deliver(
                env, where=self._where, track=True, gate=self._gate
            )
        except NoAgentAvailable as e:
            if not client._falls_back(e):
                raise
            try:
                self._result = await client._run_fallback(env)
            finally:
                self._end(ok=True)
            self._succeeded()
            return True
        # Abandoned without aclose() (a `break` out of a plain `async for`): the call is
        # forgotten when the stream is collected. Holds the client, never the stream.
        self._abandon = weakref.finalize(self, client._forget, env, self._agent_id, ok=True)
        return False

    async def _next(self) -> Any:
        env, sink, reader = self.envelope, self._sink, self._client._reader
        timeout = (env.deadline_ms - now_ms()) / 1000 if env.deadline_ms else None
        # A little grace past the deadline, so the worker's own deadline reply can arrive.
        with anyio.move_on_after(None if timeout is None else max(timeout, 0) + 0.5):
            while True:
                if sink.chunks:
                    self.seq += 1
                    return sink.chunks.popleft()
                if sink.overflowed:
                    raise StreamTooLarge(
                        f"The chunks of {env.capability!r} (msg {env.msg_id}) passed "
                        f"{sink.max_bytes} bytes, the bound set for this stream: nothing "
                        "more was kept."
                    )
                if env.msg_id in reader.replies:
                    reply = reader.take(env.msg_id)
                    self._end(ok=reply.status == Status.SUCCEEDED or not blames_agent(reply.reason))
                    self._result = self._client._outcome(env, reply)  # raises its error
                    self._succeeded()
                    raise StopAsyncIteration
                await sink.wait()
        raise DeadlineExceeded(
            f"No final result for {env.capability!r} (msg {env.msg_id}) before its deadline; "
            f"see `reach task {env.msg_id}` for where it is."
        )

    def _end(self, *, ok: bool) -> None:
        self._done = True
        if self._gate is not None:
            self._gate.release()
        if self._abandon is not None:
            self._abandon.detach()
        self._client._forget(self.envelope, self._agent_id, ok=ok)

    def _succeeded(self) -> None:
        metrics.client_reply(
            self.envelope.capability, RequestOutcome.SUCCEEDED, time.perf_counter() - self._t0
        )

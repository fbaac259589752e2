"""What a handler gets besides its payload: ``ctx``, a :class:`Context`.

The context tells the handler which message it is handling (ids, attempt, deadline,
headers, the fence token of this run) and gives it the worker's services: the session
store of the message's session, a client whose calls inherit the message's deadline,
session and trace (:class:`ChildClient`), and the worker's Redis connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ._defaults import child_deadline
from ._emitting import ChunkWriter, KeepBounds
from ._sessions.buffered import settle_session
from ._streaming import Stream
from .asking import Asker, Slots
from .callpath import CallGate, SelfSlots, child_path, hop_limit
from .client import Client
from .connection import AnyRedis
from .envelope import Envelope, now_ms
from .errors import ConfigError
from .keys import Keys
from .session import Session
from .signing import worker as worker_signing
from .steps import StepJournal, check_name
from .watch import report_progress

if TYPE_CHECKING:
    from ._sessions.store import SessionStore
    from .agent import Agent


class CancelState(Protocol):
    """What the worker gives a context of a message that may be cancelled
    (reach._worker.cancelling.Run, and the runtime that tracks it)."""

    requested: bool

    async def wait(self) -> None:
        """Return once the message is cancelled."""

    def child(self, msg_id: str) -> None:
        """The handler sent ``msg_id`` through ``ctx.client``."""


class GuardHook(Protocol):
    """The guards of a guarded handler's message (reach._worker.guarding.GuardRun):
    asked before a chunk is written and before an onward call is sent; each raises
    :class:`~reach.GuardRefused` to refuse."""

    async def chunk(self, value: Any) -> None: ...

    def onward(self, capability: str) -> None: ...


class Context:
    """What a handler knows about the message it is handling.

    ``session`` is the per-session store, ``client`` calls other capabilities with this
    message's deadline, session and trace propagated, ``fence`` is the idempotency fence
    token (pass it to external writes so a late duplicate can be refused).
    """

    def __init__(
        self,
        env: Envelope,
        fence: int,
        *,
        agent_id: str,
        redis: AnyRedis,
        keys: Keys,
        client: Client,
    ) -> None:
        self.envelope = env
        self.fence = fence
        self.agent_id = agent_id
        self._redis = redis
        self._keys = keys
        self._client = client
        self._sender: str | None | bool = False  # False: not looked at yet
        self.chunks: ChunkWriter | None = None  # made by the first emit()
        self.result: Any = None
        """The final result of an async-generator handler (it cannot return one): None
        unless the handler sets it (docs/concepts.md, *Streamed results*)."""

    _cancel: CancelState | None = None  # set by the worker (reach._worker.cancelling)
    _slots: SelfSlots | None = None  # set by the worker: its slots, for self-calls
    _record: str = ""  # set by the worker: the message's idempotency record, for steps
    _owner: str = ""  # set by the worker: who holds the claim, "<agent_id>/<instance_id>"
    _keep: KeepBounds | None = None  # set by the worker: what of a stream is kept to resume
    _journal: StepJournal | None = None  # made by the first step()
    _waiting: Slots | None = None  # set by the worker: where a waiting handler's slot goes
    _asker: Asker | None = None  # made by the first ask()
    _agent: Agent | None = None  # set by the worker: the agent handling the message
    _guards: GuardHook | None = None  # set by a guarded handler (reach._worker.guarding)
    _sessions: SessionStore | None = None  # set by the worker: the tier and Redis of sessions
    _session: Session | None = None  # made by the first ctx.session

    @property
    def agent(self) -> Agent:
        """The :class:`reach.Agent` handling this message: e.g.
        ``ctx.agent.set_ready(False)`` pauses routing new work to it."""
        if self._agent is None:
            raise ConfigError("This context was not made by a running agent: it has no agent.")
        return self._agent

    @property
    def cancelled(self) -> bool:
        """True once the message was cancelled (``client.cancel``): stop soon; after the
        agent's ``cancel_grace_s`` the handler is cancelled (its cancel scope) anyway."""
        c = self._cancel
        return c is not None and c.requested

    async def wait_cancelled(self) -> None:
        """Return when the message is cancelled (never, for a context without a worker):
        e.g. race it against the work in a task group."""
        if self._cancel is None:
            await anyio.sleep_forever()
        else:
            await self._cancel.wait()

    msg_id = property(lambda self: self.envelope.msg_id)
    session_id = property(lambda self: self.envelope.session_id)
    trace_id = property(lambda self: self.envelope.trace_id)
    attempt = property(lambda self: self.envelope.attempt)
    priority = property(lambda self: self.envelope.priority)
    deadline_ms = property(lambda self: self.envelope.deadline_ms)
    capability = property(lambda self: self.envelope.capability)
    headers = property(lambda self: self.envelope.headers)
    idempotency_key = property(lambda self: self.envelope.idempotency_key or self.envelope.msg_id)
    """The caller's idempotency key, or the msg_id when it chose none. (Its record is
    scoped to the capability and the signing identity: ``envelope.key`` names it.)"""

    @property
    def sender(self) -> str | None:
        """Who signed this message, verified with this agent's secret: the sender's
        ``source`` (its client id unless it chose another name), else the namespace. None
        when the message is unsigned, or this agent has no secret. Any holder of the shared
        secret may sign with any name: it proves a member of the team sent it, not which
        one (docs/security.md)."""
        if self._sender is False:
            w = worker_signing(self._keys.namespace, self.agent_id)
            env = self.envelope
            ok = w is not None and w.keys.check_envelope(env) is None
            self._sender = w.keys.sender(env) if ok and w is not None else None
        return self._sender if isinstance(self._sender, str) else None

    @property
    def remaining_s(self) -> float | None:
        """Seconds left before the deadline (None when the message has none)."""
        if not self.envelope.deadline_ms:
            return None
        return max(0.0, (self.envelope.deadline_ms - now_ms()) / 1000)

    @property
    def session(self) -> Session:
        """The store of this message's session (its calls raise ConfigError when the
        message has no session_id), of the tier the handler declares (``strong`` unless
        ``@app.handler(cap, session=...)`` says otherwise: docs/concepts.md, *Session tiers*).
        One object per run: a tier that writes behind holds the run's writes in it."""
        s = self._session
        if s is None:
            store = self._sessions
            s = self._session = (
                store.open_session(self.envelope)
                if store is not None
                else Session(self._redis, self._keys, self.envelope.session_id)
            )
        return s

    async def _flush_session(self) -> None:
        if self._session is not None:
            await self._session.flush()

    async def _finish_run(self, err: BaseException | None) -> BaseException | None:
        """Before a run's outcome is written: its stream's last chunks (a streaming
        handler), then the session writes its tier held back. The run's error, else the
        error that kept them from Redis (the run then fails, and is retried)."""
        if self.chunks is not None:
            err = await self.chunks.finish(err)
        if self._session is not None:
            err = await settle_session(self._session, err)
        return err

    @property
    def client(self) -> ChildClient:
        """A client whose calls inherit this message's deadline, session and trace, and
        carry its call path (docs/concepts.md, *Call graphs*)."""
        child = ChildClient(
            self._client,
            self.envelope,
            self._cancel,
            agent_id=self.agent_id,
            slots=self._slots,
            guards=self._guards,
        )
        child._before = self._flush_session  # held writes go before a call (the callee may read)
        return child

    async def emit(self, chunk: Any) -> None:
        """Stream ``chunk`` to the caller now, before the final result: chunks reach a
        :meth:`reach.Client.stream` caller in the order emitted (a ``request()`` caller
        gets only the final result). ``chunk`` is any value a payload may be. See
        :meth:`reach._emitting.ChunkWriter.emit` for what it raises, and
        :class:`~reach.GuardRefused` when a guard of the handler refuses it."""
        if self._guards is not None:
            await self._guards.chunk(chunk)
        if self.chunks is None:
            self.chunks = ChunkWriter(
                self._redis,
                self._keys,
                self.envelope,
                self.agent_id,
                record=self._record,
                keep=self._keep,
            )
        await self.chunks.emit(chunk)

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the durable step ``name``, once per idempotency key:

            receipt = await ctx.step("charge", payments.charge, order_id, cents)

        Its result is journaled in the message's record before it is returned, and any
        later run of the message (taken over after a crash, retried, redelivered) gets the
        journaled result back without calling ``fn``. ``fn`` may be async, or a plain
        function (run in a worker thread). The result is any value a handler may return,
        at most 64 KiB encoded, and comes back decoded from the journal on every run (a
        tuple as a list, a Struct as a dict). At most 100 steps per message; a name is a
        non-empty string of at most 200 bytes; calling a name again in the same run
        returns its first result. A ``fn`` that raises journals nothing: the exception is
        the handler's, and the next run calls ``fn`` again.

        Raises :class:`~reach.StepTooLarge`, :class:`~reach.TooManySteps` or
        :class:`~reach.StepRefused` (a result that cannot be encoded; raised out of the
        handler, each dead-letters the message at once, no retry),
        :class:`~reach.StaleRun` (this run lost its claim: stop), and
        :class:`~reach.ConfigError` for a bad name. docs/concepts.md, *Durable steps*."""
        if self._journal is None:
            if not self._record or not self._owner:
                check_name(name)
                raise ConfigError(
                    "ctx.step needs a message claimed by a reach worker: this context has "
                    "no idempotency record to journal in."
                )
            self._journal = StepJournal(
                self._redis, record=self._record, owner=self._owner, fence=self.fence
            )
        return await self._journal.run(name, fn, args, kwargs)

    async def ask(self, question: str, *, timeout_s: float | None = None) -> Any:
        """Ask a person (or any process) ``question`` and return the answer:

            ok = await ctx.ask("Refund order 1234 for 310 EUR?", timeout_s=3600)

        The task's status becomes ``input_required`` with the question (``reach task``,
        ``client.watch``, the console, the A2A gateway's ``input-required``) until
        ``client.answer(msg_id, value)`` (``reach task answer``, the console, an A2A
        ``message/send`` on the task) stores the answer, any JSON value, in the message's
        record; then the task is ``running`` again and the value is returned. Any later run
        of the message (taken over after a crash, retried) gets the stored answer back at
        once: the question is not put again. A handler's asks are numbered in the order it
        makes them, which is how a re-run matches them: make them in the same order on
        every run, one at a time. ``question`` is non-empty text of at most 4096 bytes;
        at most 100 asks per message.

        While it waits the handler gives its slot back (up to the worker's
        ``max_waiting_handlers``; beyond it, it waits in its slot) and takes one again once
        answered. The message's deadline still applies: send a message that may wait for
        a person with a ``timeout_s`` long enough.

        Raises :class:`~reach.AskTimeout` when no answer came within ``timeout_s`` (None:
        no bound but the message's deadline), :class:`~reach.TooManyAsks`,
        :class:`~reach.StaleRun` (this run lost its claim: stop), and
        :class:`~reach.ConfigError` for a bad question or timeout. docs/concepts.md,
        *Human input*."""
        if self._asker is None:
            if not self._record or not self._owner:
                raise ConfigError(
                    "ctx.ask needs a message claimed by a reach worker: this context has "
                    "no task record to put the question in."
                )
            self._asker = Asker(
                self._redis,
                self._client.commands.redis,
                self._keys,
                key=self.envelope.key,
                owner=self._owner,
                fence=self.fence,
                slots=self._waiting,
            )
        return await self._asker.ask(question, timeout_s)

    def step_key(self, name: str) -> str:
        """A key for step ``name`` of this message that is the same in every run of it:
        pass it to an outside service that takes idempotency keys (a payment API), so
        that the one case a journal cannot cover - a run that stops after ``fn`` and
        before its result is journaled - is not charged twice either."""
        return f"{self.envelope.key}/{check_name(name)}"

    async def progress(self, fraction: float, note: str = "") -> None:
        """Report how far the handler has got: ``fraction`` done, 0..1 (ConfigError
        otherwise), with an optional ``note`` (cut to 512 UTF-8 bytes). The task record
        keeps the latest (``client.task(msg_id)``) and every watcher of the task gets it
        (``client.watch``, ``reach task MSG_ID --follow``). A report of a run that no
        longer holds the message (cancelled, or taken over) is dropped. One write per
        call: report steps, not every token."""
        await report_progress(
            self._redis,
            self._keys.idem(self.envelope.key),
            fence=self.fence,
            fraction=fraction,
            note=note,
        )

    @property
    def redis(self) -> AnyRedis:
        """The runtime's Redis connection (for handlers that keep state next to reach's)."""
        return self._redis

    @property
    def keys(self) -> Keys:
        """The key builder of this agent's namespace."""
        return self._keys


class ChildClient:
    """``ctx.client``: calls made inside a handler inherit its deadline, session and trace,
    and carry the call path (:mod:`reach.callpath`): one past the client's ``max_hops``
    raises :class:`~reach.HopLimitExceeded`, one closing a loop
    :class:`~reach.LoopDetected`, one to the handler's own agent with no free slot
    :class:`~reach.WouldDeadlock` (each before anything is sent).

    A child call ends before its parent: at the earliest of its own deadline and the
    parent's less :data:`reach._defaults.CHILD_MARGIN_SHARE` of the time the parent has
    left (at most :data:`reach._defaults.CHILD_MARGIN_MAX_MS`), so the parent still hears
    its outcome in time to answer its own caller (docs/concepts.md, *Call graphs*)."""

    def __init__(
        self,
        client: Client,
        parent: Envelope,
        cancel: CancelState | None = None,
        *,
        agent_id: str = "",
        slots: SelfSlots | None = None,
        guards: GuardHook | None = None,
    ) -> None:
        self._client = client
        self._guards = guards  # the handler's guards: its allow-list of onward calls
        self._parent = parent
        self._cancel = cancel  # the parent's: its children are cancelled with it
        self._agent_id = agent_id  # the agent the parent runs on ('' : no call path kept)
        self._slots = slots

    _before: Callable[[], Awaitable[None]] | None = None  # the parent's _flush_session

    async def _flush(self) -> None:
        """The parent's held session writes, sent before a call whose handler may read
        them (a tier that writes behind: docs/concepts.md, *Session tiers*)."""
        if self._before is not None:
            await self._before()

    def _child(
        self, capability: str, payload: Any, kw: dict[str, Any], *, waits: bool
    ) -> tuple[Envelope, CallGate | None]:
        """Build the call's envelope with its call path, and the gate its routing asks;
        :class:`~reach.HopLimitExceeded` when it would be too deep."""
        env = self._client.build(capability, payload, reply=waits, **kw)
        if self._guards is not None:  # an allow-list refuses it before anything is sent
            self._guards.onward(env.capability)
        if not self._agent_id:
            return env, None
        env.hops, env.path = child_path(self._parent, self._agent_id, waits=waits)
        too_deep = hop_limit(env, self._client.max_hops)
        if too_deep is not None:
            raise too_deep
        return env, CallGate(env, self._agent_id, self._slots if waits else None)

    def _inherit(self, kw: dict[str, Any], advertised_s: float | None = None) -> dict[str, Any]:
        """``kw`` with the parent's session and trace, and a deadline: the earliest of the
        call's own (its ``timeout_s``/``deadline_ms``, else ``advertised_s``, its
        capability's advertised timeout) and the parent's less the margin for the parent's
        reply (:func:`reach._defaults.child_deadline`)."""
        p = self._parent
        kw.setdefault("session_id", p.session_id or None)
        kw.setdefault("trace_id", p.trace_id)
        own = kw.pop("deadline_ms", None)
        timeout_s = kw.pop("timeout_s", None)
        now = now_ms()
        if timeout_s is None and not own:
            timeout_s = advertised_s
        if timeout_s is not None:
            t = now + int(timeout_s * 1000)
            own = min(own, t) if own else t
        parent = child_deadline(p.deadline_ms, now) if p.deadline_ms else 0
        deadlines = [d for d in (own, parent) if d]
        if deadlines:
            kw["deadline_ms"] = min(deadlines)
        return kw

    async def request(self, capability: str, payload: Any, **kw: Any) -> Any:
        """``Client.request`` with the parent message's deadline (less a margin for the
        parent's reply), session, trace and call path (and cancelled with the parent)."""
        if kw.get("timeout_s") is None and kw.get("deadline_ms") is None:
            kw = self._inherit(kw, await self._client.advertised_timeout(capability))
        else:
            kw = self._inherit(kw)
        where = kw.pop("where", None)
        on_rate_limit = kw.pop("on_rate_limit", "wait")
        if kw.get("timeout_s") is None and kw.get("deadline_ms") is None:
            kw["timeout_s"] = await self._client.timeout_for(capability)
        await self._flush()
        env, gate = self._child(capability, payload, kw, waits=True)
        await self._client._check_rate_limit(env.capability, on_rate_limit)
        if self._cancel is not None:
            self._cancel.child(env.msg_id)
        try:
            return await self._client.call(env, where=where, gate=gate)
        finally:
            if gate is not None:
                gate.release()

    async def send(self, capability: str, payload: Any, **kw: Any) -> str:
        """``Client.send`` with the parent message's deadline (else the client's
        ``default_send_timeout_s``), session, trace and call path (and cancelled with the
        parent)."""
        kw = self._inherit(kw)
        where = kw.pop("where", None)
        on_rate_limit = kw.pop("on_rate_limit", "wait")
        self._client._send_deadline(kw)
        await self._flush()
        env, gate = self._child(capability, payload, kw, waits=False)
        if on_rate_limit != "wait":
            await self._client._check_rate_limit(env.capability, on_rate_limit)
        await self._client._deliver_or_hold(env, where, track=False, gate=gate)
        if self._cancel is not None:
            self._cancel.child(env.msg_id)
        return env.msg_id

    def stream(self, capability: str, payload: Any, **kw: Any) -> Stream:
        """``Client.stream`` with the parent message's deadline, session, trace and call
        path (with neither deadline, the capability's advertised timeout at the send)."""
        kw = self._inherit(kw)
        where = kw.pop("where", None)
        max_bytes = kw.pop("max_bytes", None)
        told = kw.get("timeout_s") is not None or kw.get("deadline_ms") is not None
        env, gate = self._child(capability, payload, kw, waits=True)
        return Stream(
            self._client, env, where, max_bytes=max_bytes, gate=gate, timeout_for=not told
        )

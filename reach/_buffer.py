"""A Client's local buffer for a Redis outage: sends held in order, flushed when Redis is back.

A :class:`~reach.client.Client` owns one :class:`SendBuffer`. When a ``send()`` or a
``request()`` cannot reach Redis (:class:`~reach.errors.RedisUnavailable`), the client
holds the message here instead of raising, and one background task (:meth:`SendBuffer.run`)
delivers the held messages, oldest first, as soon as Redis answers again. While anything is
held, later messages of the client join the end of the buffer even if Redis is back, so
they are added to the inboxes in the order they were made.

Bounds: at most ``max_messages`` messages and ``max_bytes`` bytes of payload are held (a
message over either bound raises :class:`~reach.errors.RedisUnavailable` at once), and none
is held past its own deadline or past ``max_age_s`` seconds: such a message is dropped,
counted (``reach_client_buffer_dropped_total``) and logged, and a request's caller gets
:class:`~reach.errors.DeadlineExceeded` (its deadline) or
:class:`~reach.errors.RedisUnavailable` (the age bound).

Right after an outage the agents' records may read as lease-missed until their first
heartbeat: for :data:`SETTLE_S` seconds after Redis last failed, a held message no agent
can take (:class:`~reach.errors.NoAgentAvailable`, not :class:`~reach.errors.Overloaded`)
stays held and is tried again, within its expiry; after that the error ends it (a request's
caller gets it; a send is dropped, counted and logged).

No duplicates: a held message keeps its envelope, so a message whose first write may have
reached Redis before the connection dropped is written again with the same msg_id and
idempotency key; the worker runs a key once (``lua/claim.lua``: a copy of a done or claimed
key is not run again).

The buffer knows nothing of the client: it is given the function that delivers a batch of
envelopes, and it is called, never calls back.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from . import logs, metrics
from .envelope import Envelope, now_ms
from .errors import (
    ConfigError,
    DeadlineExceeded,
    NoAgentAvailable,
    Overloaded,
    RedisFull,
    RedisUnavailable,
)

# The client's logger: the buffer's lines are the client's (operators filter on it).
log = logging.getLogger("reach.client")

DEFAULT_MAX_MESSAGES = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_AGE_S = 30.0
DEFAULT_CLOSE_WAIT_S = 5.0

_RETRY_MIN_S, _RETRY_MAX_S = 0.05, 0.25  # the flusher's pause after Redis failed again
_BATCH = 256  # held messages delivered in one pipeline at most
# For this long after Redis last failed, a held message no agent can take stays held: the
# agents' records may read as lease-missed until their first heartbeat after the outage.
SETTLE_S = 5.0

DeliverMany = Callable[[list[Envelope], Mapping[str, Any] | None], Awaitable[list[str | Exception]]]

_HELD, _FLUSHING, _GONE = "held", "flushing", "gone"


@dataclass(frozen=True, slots=True)
class PendingLocal:
    """A message a :class:`~reach.client.Client` holds locally while Redis is unreachable
    (what :meth:`~reach.client.Client.pending_local` lists)."""

    msg_id: str
    capability: str
    queued_ms: int
    """When it was buffered (Unix ms)."""
    deadline_ms: int
    """The message's own deadline (Unix ms; 0: none)."""
    expires_ms: int
    """When it is dropped if Redis is still away: its deadline, or ``queued_ms`` plus the
    client's ``buffer_max_age_s``, whichever comes first (Unix ms)."""
    reply: bool
    """A request: its caller waits for it."""


class Held:
    """One message in the buffer (and, for a request, what its caller waits on)."""

    __slots__ = (
        "agent_id",
        "done",
        "env",
        "error",
        "expires_ms",
        "queued_ms",
        "reply",
        "size",
        "state",
        "where",
    )

    def __init__(
        self, env: Envelope, where: Mapping[str, Any] | None, *, reply: bool, max_age_s: float
    ) -> None:
        self.env = env
        self.where = where
        self.reply = reply
        self.queued_ms = now_ms()
        age_end = self.queued_ms + int(max_age_s * 1000)
        self.expires_ms = min(env.deadline_ms, age_end) if env.deadline_ms else age_end
        self.size = len(env.payload)
        self.state = _HELD
        self.done = anyio.Event()
        self.agent_id = ""
        self.error: Exception | None = None

    @property
    def by_deadline(self) -> bool:
        """It expires at its own deadline (not the buffer's age bound)."""
        return bool(self.env.deadline_ms) and self.expires_ms == self.env.deadline_ms

    def record(self) -> PendingLocal:
        env = self.env
        return PendingLocal(
            msg_id=env.msg_id,
            capability=env.capability,
            queued_ms=self.queued_ms,
            deadline_ms=env.deadline_ms,
            expires_ms=self.expires_ms,
            reply=self.reply,
        )


class SendBuffer:
    """Hold messages while Redis is unreachable and deliver them in order when it is back.

    ``deliver_many(envs, where)`` adds a batch of envelopes (one capability, one ``where``)
    to inboxes and returns, per envelope, the agent id or the error that stopped it (as
    ``Delivery.deliver_many`` does). ``max_messages`` 0 turns the buffer off: nothing is
    held (:attr:`enabled`). ``name`` starts the log lines (e.g. ``"client c-42"``);
    ``redis_url`` (redacted) is named in the errors.
    """

    def __init__(
        self,
        deliver_many: DeliverMany,
        *,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        name: str = "client",
        redis_url: str = "",
        settle_s: float = SETTLE_S,
    ) -> None:
        if max_messages < 0 or max_bytes < 0:
            raise ConfigError(
                f"buffer_max_messages and buffer_max_bytes must be >= 0 (got {max_messages}, "
                f"{max_bytes}); 0 messages turns the outage buffer off."
            )
        if not max_age_s > 0:  # refuses nan
            raise ConfigError(f"buffer_max_age_s must be > 0 seconds (got {max_age_s}).")
        self.deliver_many = deliver_many
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.name = name
        self.redis_url = redis_url
        self.settle_s = settle_s
        self._held: collections.deque[Held] = collections.deque()
        self._count = 0  # messages held (gone ones excluded)
        self._bytes = 0
        self._running = False
        self._cause = ""  # the last error that made a message wait, quoted in errors
        self.outage = logs.OutageLog(log, f"{name}: sending (messages held locally)")
        self.last_failed_at = -1e18  # time.monotonic() of the last failed delivery
        self.dropped = 0  # messages dropped unsent (deadline, age, error, closed)
        self.flushed = 0  # messages delivered from the buffer

    # -- state --------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.max_messages > 0

    @property
    def active(self) -> bool:
        """Something is held: a new message must join the end of the buffer."""
        return self._count > 0

    def pending(self) -> list[PendingLocal]:
        """The messages held, oldest first (expired ones are dropped first)."""
        self._expire(now_ms())
        return [h.record() for h in self._held if h.state != _GONE]

    def failed_since(self, t: float) -> bool:
        """A delivery failed for an unreachable Redis at or after ``time.monotonic()`` ``t``."""
        return self.last_failed_at >= t

    # -- holding ------------------------------------------------------------------------
    def hold(
        self,
        env: Envelope,
        where: Mapping[str, Any] | None,
        *,
        reply: bool,
        tg: anyio.abc.TaskGroup,
        cause: BaseException | None = None,
    ) -> Held:
        """Hold ``env`` (``reply``: a request whose caller will :meth:`wait`) at the end of
        the buffer, and start the flusher in ``tg`` if it does not run. ``cause``: the
        error of the attempt that found Redis unreachable (None: the message joins a
        non-empty buffer). Raises :class:`RedisUnavailable` when a bound is reached."""
        if cause is not None:
            self._note_failed(cause)
        size = len(env.payload)
        if self._count >= self.max_messages or self._bytes + size > self.max_bytes:
            raise RedisUnavailable(
                f"{env.capability!r} (msg {env.msg_id}) was not sent: Redis at {self.redis_url} "
                f"is unreachable ({self._cause}) and the client's local buffer is full "
                f"({self._count} messages, {self._bytes} bytes held; buffer_max_messages="
                f"{self.max_messages}, buffer_max_bytes={self.max_bytes}). Wait for Redis "
                "to come back (client.pending_local() lists what waits), raise the bounds, "
                "or send it again later."
            )
        h = Held(env, where, reply=reply, max_age_s=self.max_age_s)
        if not self._count:
            log.warning(
                "%s: Redis unreachable (%s): holding sends locally, in order, until it is "
                "back (at most %d messages, %.0f s each; client.pending_local() lists them)",
                self.name,
                self._cause,
                self.max_messages,
                self.max_age_s,
            )
        self._held.append(h)
        self._count += 1
        self._bytes += size
        metrics.buffer_held(env.capability)
        if not self._running:
            self._running = True
            tg.start_soon(self.run)
        return h

    async def wait(self, h: Held) -> str:
        """The agent id a held request was delivered to. Raises the error that stopped it:
        :class:`DeadlineExceeded` at its deadline, :class:`RedisUnavailable` at the age
        bound, or what the delivery raised (:class:`~reach.errors.NoAgentAvailable`, ...).
        Cancelled, or past its expiry, it is taken out of the buffer (never sent)."""
        try:
            with anyio.move_on_after(max(0.0, (h.expires_ms - now_ms()) / 1000)):
                await h.done.wait()
        except BaseException:
            self._give_up(h, "cancelled")
            raise
        if not h.done.is_set():
            self._give_up(h, "deadline" if h.by_deadline else "age")
            raise self._expiry_error(h)
        if h.error is not None:
            raise h.error
        return h.agent_id

    def _give_up(self, h: Held, reason: str) -> None:
        """The caller of ``h`` stopped waiting (``reason``): not sent if it is still held."""
        if h.done.is_set():
            return
        if h.state == _HELD:
            self._forget(h)
            metrics.buffer_dropped(h.env.capability, reason)
            self.dropped += 1
        h.reply = False  # a delivery in flight now ends unwaited for
        h.done.set()

    def _forget(self, h: Held) -> None:
        if h.state == _GONE:
            return
        h.state = _GONE
        self._count -= 1
        self._bytes -= h.size
        metrics.buffer_released()

    def _expiry_error(self, h: Held) -> Exception:
        env, waited = h.env, (now_ms() - h.queued_ms) / 1000
        if h.by_deadline:
            return DeadlineExceeded(
                f"{env.capability!r} (msg {env.msg_id}) was never sent: Redis at "
                f"{self.redis_url} stayed unreachable until its deadline ({waited:.1f} s in "
                "the client's local buffer). Check that Redis runs (`reach doctor`), or "
                "give the message a longer timeout_s."
            )
        return RedisUnavailable(
            f"{env.capability!r} (msg {env.msg_id}) was never sent: Redis at {self.redis_url} "
            f"stayed unreachable for {waited:.1f} s, the longest the client holds a message "
            f"(buffer_max_age_s={self.max_age_s:g}). Check that Redis runs (`reach doctor`), "
            "or raise buffer_max_age_s."
        )

    def _note_failed(self, e: BaseException) -> None:
        c = e.__cause__ or e  # the redis-py error under the RedisUnavailable, when there is one
        self._cause = f"{type(c).__name__}: {c}"[:200]
        self.last_failed_at = time.monotonic()

    # -- the flusher --------------------------------------------------------------------
    async def run(self) -> None:
        """Deliver the held messages in order until none is left, retrying while Redis is
        unreachable; never stops on an error (each message's error ends that message)."""
        delay = _RETRY_MIN_S
        try:
            while self._held:
                self._expire(now_ms())
                batch = self._batch()
                if not batch:
                    continue
                if await self._flush(batch):
                    delay = _RETRY_MIN_S
                    continue
                await anyio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)
        finally:
            self._running = False

    def _batch(self) -> list[Held]:
        """The leading held messages that can go in one ``deliver_many`` call: one
        capability and ``where``, and the same policy inputs (policy, target, session)."""
        held = self._held
        while held and held[0].state == _GONE:
            held.popleft()
        if not held:
            return []
        first = held[0]
        key = _batch_key(first.env)
        batch: list[Held] = []
        for h in held:
            if h.state == _GONE:
                continue
            if len(batch) >= _BATCH or _batch_key(h.env) != key:
                break
            if h.where is not first.where and h.where != first.where:
                break
            batch.append(h)
        return batch

    async def _flush(self, batch: Sequence[Held]) -> bool:
        """Deliver ``batch``; False when Redis was unreachable before any was delivered."""
        for h in batch:
            h.state = _FLUSHING
        try:
            out = await self.deliver_many([h.env for h in batch], batch[0].where)
        except Exception as e:  # noqa: BLE001 - deliver_many reports in place; a bug: each fails
            out = [e] * len(batch)
        done = 0
        failures: list[tuple[Held, Exception]] = []
        settling = time.monotonic() - self.last_failed_at < self.settle_s
        for h, res in zip(batch, out, strict=True):
            if isinstance(res, (RedisUnavailable, RedisFull)):  # accepted: held until sent
                self._note_failed(res)
                h.state = _HELD  # held still, in its place: tried again
                continue
            if settling and isinstance(res, NoAgentAvailable) and not isinstance(res, Overloaded):
                h.state = _HELD  # the registry may not have caught up with the outage yet
                continue
            done += 1
            self._forget(h)
            if isinstance(res, str):
                h.agent_id = res
                self.flushed += 1
            elif h.reply:
                h.error = res
            else:
                failures.append((h, res))
            h.done.set()
        while self._held and self._held[0].state == _GONE:
            self._held.popleft()
        self._dropped_sends(
            [
                (h, "deadline" if isinstance(err, DeadlineExceeded) else "error", err)
                for h, err in failures
            ]
        )
        if done:
            self.outage.ok()
            if not self._count:
                log.warning(
                    "%s: Redis is back: every message held locally was sent or dropped (%d "
                    "sent, %d dropped so far)",
                    self.name,
                    self.flushed,
                    self.dropped,
                )
            return True
        self.outage.failed(self._cause)
        return False

    def _expire(self, now: int) -> None:
        """Drop the held messages (not in flight) whose expiry passed."""
        if not any(h.state == _HELD and h.expires_ms <= now for h in self._held):
            return
        keep: collections.deque[Held] = collections.deque()
        sends: list[tuple[Held, str, Exception]] = []
        for h in self._held:
            if h.state == _HELD and h.expires_ms <= now:
                self._forget(h)
                reason = "deadline" if h.by_deadline else "age"
                if h.reply:  # its caller is told (wait() raises it)
                    h.error = self._expiry_error(h)
                    h.done.set()
                    metrics.buffer_dropped(h.env.capability, reason)
                    self.dropped += 1
                else:
                    sends.append((h, reason, self._expiry_error(h)))
            elif h.state != _GONE:
                keep.append(h)
        self._held = keep
        self._dropped_sends(sends)

    def _dropped_sends(self, drops: Sequence[tuple[Held, str, Exception]]) -> None:
        """Sends (their callers long gone) that will never be sent: each counted, and one
        log line for them all (an outage that outlasts many deadlines is not a flood)."""
        if not drops:
            return
        for h, reason, _ in drops:
            self.dropped += 1
            metrics.buffer_dropped(h.env.capability, reason)
            h.done.set()
        reasons = collections.Counter(reason for _, reason, _ in drops)
        log.warning(
            "%s: dropped %d sends held locally, never sent (%s); the first: %s",
            self.name,
            len(drops),
            ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())),
            drops[0][2],
        )

    async def close(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` seconds for the held messages to be sent, then drop the
        rest (counted, logged; a waiting request's caller gets :class:`RedisUnavailable`)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(wait_s):
            while self._count and self._running:
                await anyio.sleep(0.02)
        left = [h for h in self._held if h.state != _GONE]
        self._held.clear()
        if not left:
            return
        for h in left:
            self._forget(h)
            self.dropped += 1
            metrics.buffer_dropped(h.env.capability, "closed")
            if h.reply:
                h.error = RedisUnavailable(
                    f"{h.env.capability!r} (msg {h.env.msg_id}) was never sent: the client "
                    f"closed while Redis at {self.redis_url} was unreachable."
                )
            h.done.set()
        log.error(
            "%s: closed with %d messages held locally and never sent (Redis at %s "
            "unreachable; first: msg %s of %r): send them again once Redis is back",
            self.name,
            len(left),
            self.redis_url,
            left[0].env.msg_id,
            left[0].env.capability,
        )


def _batch_key(env: Envelope) -> tuple[str, str, str, bool, bool]:
    # What deliver_many takes from the batch's first envelope for all (the capability and
    # the policy: policy_for reads policy, target and whether there is a session), and
    # whether the message wants a reply (requests wait on the result of their own).
    return (env.capability, env.policy, env.target, bool(env.session_id), bool(env.reply_to))

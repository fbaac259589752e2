"""What a :class:`~reach.Client` call gets when its caller does not say: a deadline and,
when it fails, a local answer (docs/concepts.md, *Call graphs*).

Deadlines
    A request without ``timeout_s``/``deadline_ms`` gets its capability's advertised timeout
    (``@app.handler(cap, timeout_s=15)``: the longest any of its agents advertises, read from
    the client's registry view, :class:`AdvertisedTimeouts`), else the client's
    ``default_timeout_s``. A send gets the client's ``default_send_timeout_s``
    (:data:`DEFAULT_SEND_TIMEOUT_S`). A call made inside a handler (``ctx.client``) is given
    its parent's deadline less a margin for the parent's own reply (:func:`child_deadline`).

Fallbacks
    ``Client(fallback=fn, fallback_on=...)``: which failures of a call the local default
    agent answers instead of raising, by kind (:data:`FALLBACK_KINDS`): ``no_agent``
    (:class:`~reach.NoAgentAvailable` and :class:`~reach.Overloaded`, the default),
    ``deadline`` (:class:`~reach.DeadlineExceeded`), ``remote_error``
    (:class:`~reach.RemoteError`).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from . import metrics
from .envelope import Envelope, decode_payload
from .errors import ConfigError, DeadlineExceeded, NoAgentAvailable, RedisUnavailable, RemoteError
from .registry import AgentInfo, advertised_timeout, normalize_capability

if TYPE_CHECKING:
    from ._buffer import SendBuffer
    from .callpath import Gate
    from .view import RegistryView

__all__ = [
    "CHILD_MARGIN_MAX_MS",
    "CHILD_MARGIN_SHARE",
    "DEFAULT_FALLBACK_ON",
    "DEFAULT_SEND_TIMEOUT_S",
    "FALLBACK_KINDS",
    "AdvertisedTimeouts",
    "CallDefaults",
    "check_send_timeout",
    "child_deadline",
    "fallback_kind",
    "fallback_kinds",
    "run_fallback",
]

log = logging.getLogger("reach.client")

DEFAULT_SEND_TIMEOUT_S: Final = 3600.0
"""The deadline of a :meth:`~reach.Client.send` that names none: an hour. Long enough for a
backlog built by a burst or a deploy to drain; short enough that work nobody waits for any
more does not start hours later, and well inside the 24 h a task record lives, so the
message's ``expired`` status is still there to read."""

CHILD_MARGIN_SHARE: Final = 0.1
CHILD_MARGIN_MAX_MS: Final = 1000
"""A child call (``ctx.client``) ends this much before its parent: a tenth of the time the
parent has left, at most a second. The parent then still has time to hear the child's
outcome (a result or a ``DeadlineExceeded``) and answer its own caller; a proportional
margin keeps short deadlines usable (a parent with 300 ms left gives its child 270 ms)."""

FALLBACK_KINDS: Final[tuple[str, ...]] = ("no_agent", "deadline", "remote_error")
DEFAULT_FALLBACK_ON: Final = frozenset({"no_agent"})


def check_send_timeout(value: float | None) -> float | None:
    """``default_send_timeout_s`` as given, or :class:`ConfigError` when it is no number of
    seconds above 0 (None: sends without a deadline never expire)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(
            f"default_send_timeout_s={value!r}: give a number of seconds above 0 (default "
            f"{DEFAULT_SEND_TIMEOUT_S:g}), or None for sends that never expire."
        )
    return float(value)


def child_deadline(parent_ms: int, now_ms: int) -> int:
    """The latest deadline a call made inside a handler whose message ends at ``parent_ms``
    may have: the parent's less :data:`CHILD_MARGIN_SHARE` of its remaining time, at most
    :data:`CHILD_MARGIN_MAX_MS` (the parent's own deadline once it has passed: nothing to
    keep)."""
    left = parent_ms - now_ms
    if left <= 0:
        return parent_ms
    return parent_ms - min(CHILD_MARGIN_MAX_MS, int(left * CHILD_MARGIN_SHARE))


class AdvertisedTimeouts:
    """The advertised timeout of each capability a client called, kept per registry view
    version (the view's version moves when an agent's metadata changes), so a request reads
    its agents' advertisements only after a change."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, float | None]] = {}

    def get(self, capability: str, agents: Sequence[AgentInfo], version: int) -> float | None:
        """The longest timeout ``agents`` advertise for ``capability`` (None: none does)."""
        seen = self._seen.get(capability)
        if seen is not None and seen[0] == version:
            return seen[1]
        value = advertised_timeout(agents, capability)
        if len(self._seen) >= 4096:  # capabilities come and go: keep a bounded few
            self._seen.clear()
        self._seen[capability] = (version, value)
        return value

    def last(self, capability: str) -> float | None:
        """What :meth:`get` last found for ``capability`` (None: nothing yet)."""
        seen = self._seen.get(capability)
        return seen[1] if seen is not None else None


def fallback_kinds(value: Iterable[str] | str) -> frozenset[str]:
    """``fallback_on`` as a set of kinds, or :class:`ConfigError` naming the valid ones."""
    kinds = frozenset((value,) if isinstance(value, str) else value)
    unknown = sorted(kinds - set(FALLBACK_KINDS))
    if unknown:
        raise ConfigError(
            f"fallback_on: unknown kind(s) {', '.join(map(repr, unknown))}; use any of "
            f"{', '.join(map(repr, FALLBACK_KINDS))} (default {{'no_agent'}})."
        )
    return kinds


def fallback_kind(e: BaseException) -> str | None:
    """The kind of failure ``e`` is, as ``fallback_on`` names it (None: no fallback kind)."""
    if isinstance(e, NoAgentAvailable):
        return "no_agent"
    if isinstance(e, DeadlineExceeded):
        return "deadline"
    if isinstance(e, RemoteError):
        return "remote_error"
    return None


async def run_fallback(fallback: Callable[[str, Any], Any], env: Envelope) -> Any:
    """The fallback's answer to ``env`` (its capability and decoded payload); awaited when
    the fallback is a coroutine function."""
    res = fallback(env.capability, decode_payload(env.payload))
    if inspect.isawaitable(res):
        res = await res
    return res


class CallDefaults:
    """What :class:`~reach.Client` gives a call whose caller left something out: a deadline
    and, on failure, the fallback (a base class of the client: the attributes below are the
    client's)."""

    default_timeout_s: float
    default_send_timeout_s: float | None
    fallback: Callable[[str, Any], Any] | None
    fallback_on: frozenset[str]
    _timeouts: AdvertisedTimeouts
    _buffer: SendBuffer

    @property
    def view(self) -> RegistryView:
        raise NotImplementedError

    def _on_breaker_change(self, change: Any) -> None:
        """A breaker of this client changed state: counted and logged."""
        metrics.breaker_transition(change.agent_id, change.old, change.new)
        log.warning(
            "circuit breaker for %s: %s -> %s (%d of %d failed)",
            change.agent_id,
            change.old,
            change.new,
            change.failures,
            change.requests,
        )

    def _send_deadline(self, opts: Any) -> None:
        """A send's options without a deadline get ``default_send_timeout_s``."""
        if opts.get("timeout_s") is None and opts.get("deadline_ms") is None:
            opts["timeout_s"] = self.default_send_timeout_s

    async def timeout_for(self, capability: str) -> float:
        """The timeout a request of ``capability`` gets when its caller names none: the
        longest its agents advertise (``@app.handler(cap, timeout_s=...)``), else
        ``default_timeout_s``. Read from the registry view (memory, once loaded); with Redis
        away, what was last read, else ``default_timeout_s``."""
        adv = await self.advertised_timeout(capability)
        return adv if adv is not None else self.default_timeout_s

    async def advertised_timeout(self, capability: str) -> float | None:
        """The longest timeout the agents of ``capability`` advertise (None: none does)."""
        cap = normalize_capability(capability)
        if self._buffer.active:  # Redis is away: do not wait for it here
            return self._timeouts.last(cap)
        try:
            candidates, version = await self.view.candidates(cap)
        except RedisUnavailable:
            return self._timeouts.last(cap)
        return self._timeouts.get(cap, candidates, version)

    async def _call(self, env: Envelope, where: Mapping[str, Any] | None, gate: Gate | None) -> Any:
        raise NotImplementedError

    async def _call_with_fallback(
        self, env: Envelope, where: Mapping[str, Any] | None, gate: Gate | None = None
    ) -> Any:
        """The client's call of ``env``; a deadline or handler failure that ``fallback_on``
        names is answered by the fallback (a ``no_agent`` one is answered inside the call,
        before anything waits)."""
        try:
            return await self._call(env, where, gate)
        except (DeadlineExceeded, RemoteError) as e:
            if not self._falls_back(e):
                raise
            log.info("%s of %s: the fallback answers", type(e).__name__, env.capability)
            return await self._run_fallback(env)

    def _falls_back(self, e: BaseException) -> bool:
        """Does the fallback answer a call that failed with ``e``?"""
        return self._falls_back_on(fallback_kind(e))

    def _falls_back_on(self, kind: str | None) -> bool:
        """Does the fallback answer a call that failed in this ``kind`` of way?"""
        return self.fallback is not None and kind in self.fallback_on

    async def _run_fallback(self, env: Envelope) -> Any:
        assert self.fallback is not None
        return await run_fallback(self.fallback, env)

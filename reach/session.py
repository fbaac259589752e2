"""The session store: per-``session_id`` state kept in Redis, not in envelopes.

A handler reads and writes it through ``ctx.session``; a multi-turn conversation keeps
its history here (``append`` / ``history``) while every message carries only the id.

:class:`Session` is the ``strong`` tier (every read and write a round trip to Redis, seen
by every agent at once); ``@app.handler(cap, session="cached")`` or ``"best_effort"``
gives a handler's runs a session of another tier (:mod:`reach._sessions`,
docs/concepts.md *Session tiers*). Every write, whatever its tier, goes through
``lua/session_write.lua``: it raises the session's version and announces it, so agents
caching the session drop their copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .connection import AnyRedis, as_text
from .envelope import decode_payload, encode
from .errors import ConfigError
from .keys import Keys
from .scripts._call import Arg
from .scripts.sessions import APPEND, CLEAR, DELETE, SET, write_call

DEFAULT_TTL_S = 24 * 3600.0


class Session:
    """Key/value state and an append-only history for one session, with a TTL.

    Every write renews the TTL (``ttl_s``) of both the values and the history. This class
    is the ``strong`` tier: each call is one awaited round trip, and what it wrote is seen
    by every agent as soon as it returns.
    """

    consistency = "strong"
    """The tier: ``strong``, ``cached`` or ``best_effort`` (docs/concepts.md, *Session tiers*)."""

    def __init__(
        self, redis: AnyRedis, keys: Keys, session_id: str, *, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        self.redis = redis
        self.session_id = session_id
        self._keys = keys
        self._values = keys.session(session_id)
        self._history = keys.session_history(session_id)
        self._ttl_ms = int(ttl_s * 1000)

    @property
    def degraded(self) -> bool:
        """True once a ``best_effort`` session met a Redis error in this run: it reads as
        empty and its writes are let go (never True for the other tiers)."""
        return False

    def _check(self) -> None:
        if not self.session_id:
            raise ConfigError(
                "This message has no session_id, so it has no session store: send it with "
                "session_id=... to keep state across messages."
            )

    async def _write(self, ops: Sequence[Arg]) -> tuple[int, int]:
        """Apply ``ops`` (session_write.lua's) now: the new version, the history's length."""
        return await write_call(self._keys, self.session_id, ops, ttl_ms=self._ttl_ms).run(
            self.redis
        )

    async def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key``, or ``default``."""
        self._check()
        raw = await self.redis.hget(self._values, key)
        return default if raw is None else decode_payload(raw)

    async def set(self, key: str, value: Any) -> None:
        """Store ``value`` (any msgpack-able value) under ``key``."""
        self._check()
        await self._write((SET, key, encode(value)))

    async def delete(self, key: str) -> None:
        self._check()
        await self._write((DELETE, key))

    async def all(self) -> dict[str, Any]:
        """Every stored value."""
        self._check()
        raw = await self.redis.hgetall(self._values)
        return {as_text(k): decode_payload(v) for k, v in raw.items()}

    async def append(self, item: Any, *, max_len: int = 0) -> int:
        """Append ``item`` to the history; keep the last ``max_len`` (0 = all). Returns length."""
        self._check()
        _, length = await self._write((APPEND, encode(item), max(0, int(max_len))))
        return length

    async def history(self, *, last: int = 0) -> list[Any]:
        """The history, oldest first (only the ``last`` items when given)."""
        self._check()
        start = -last if last > 0 else 0
        return [decode_payload(x) for x in await self.redis.lrange(self._history, start, -1)]

    async def clear(self) -> None:
        """Delete the values and the history."""
        self._check()
        await self._write((CLEAR,))

    async def flush(self) -> None:
        """Send the writes held back so far (the ``cached`` and ``best_effort`` tiers write
        behind: their run's writes go in one round trip when the handler returns, or
        before a ``ctx.client.request`` / ``send``). Call it before something else must
        see them, e.g. a ``ctx.client.stream`` whose handler reads the session. Nothing to
        do for this tier: each write was sent when made."""

"""The session store: per-``session_id`` state kept in Redis, not in envelopes.

A handler reads and writes it through ``ctx.session``; a multi-turn conversation keeps
its history here (``append`` / ``history``) while every message carries only the id.
"""

from __future__ import annotations

from typing import Any

from .connection import AnyRedis, as_text
from .envelope import decode_payload, encode
from .errors import ConfigError
from .keys import Keys

DEFAULT_TTL_S = 24 * 3600.0


class Session:
    """Key/value state and an append-only history for one session, with a TTL.

    Every write renews the TTL (``ttl_s``) of both the values and the history.
    """

    def __init__(
        self, redis: AnyRedis, keys: Keys, session_id: str, *, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        self.redis = redis
        self.session_id = session_id
        self._values = keys.session(session_id)
        self._history = keys.session_history(session_id)
        self._ttl_ms = int(ttl_s * 1000)

    def _check(self) -> None:
        if not self.session_id:
            raise ConfigError(
                "This message has no session_id, so it has no session store: send it with "
                "session_id=... to keep state across messages."
            )

    async def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key``, or ``default``."""
        self._check()
        raw = await self.redis.hget(self._values, key)
        return default if raw is None else decode_payload(raw)

    async def set(self, key: str, value: Any) -> None:
        """Store ``value`` (any msgpack-able value) under ``key``."""
        self._check()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self._values, key, encode(value))
        pipe.pexpire(self._values, self._ttl_ms)
        await pipe.execute()

    async def delete(self, key: str) -> None:
        self._check()
        await self.redis.hdel(self._values, key)

    async def all(self) -> dict[str, Any]:
        """Every stored value."""
        self._check()
        raw = await self.redis.hgetall(self._values)
        return {as_text(k): decode_payload(v) for k, v in raw.items()}

    async def append(self, item: Any, *, max_len: int = 0) -> int:
        """Append ``item`` to the history; keep the last ``max_len`` (0 = all). Returns length."""
        self._check()
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(self._history, encode(item))
        if max_len > 0:
            pipe.ltrim(self._history, -max_len, -1)
        pipe.pexpire(self._history, self._ttl_ms)
        res = await pipe.execute()
        return min(int(res[0]), max_len) if max_len > 0 else int(res[0])

    async def history(self, *, last: int = 0) -> list[Any]:
        """The history, oldest first (only the ``last`` items when given)."""
        self._check()
        start = -last if last > 0 else 0
        return [decode_payload(x) for x in await self.redis.lrange(self._history, start, -1)]

    async def clear(self) -> None:
        """Delete the values and the history."""
        self._check()
        await self.redis.delete(self._values)
        await self.redis.delete(self._history)

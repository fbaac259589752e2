"""The write-behind session of the ``cached`` and ``best_effort`` tiers.

A run's writes are held in order and sent in one ``lua/session_write.lua`` call when the
handler returns (:meth:`BufferedSession.flush`, called by the worker before the outcome is
written, so a caller that got the reply and sends the next turn finds them): one round
trip for a run's writes however many it makes, applied together. Reads see the run's own
writes (held writes laid over what was read).

``cached`` reads through the process's copies (:mod:`reach._sessions.cache`).
``best_effort`` reads Redis; the first Redis error, or a call slower than the tier's
``timeout_s``, makes the run degraded: its session reads as empty from then on, its writes
are let go (they were made from an empty session, and would overwrite the real one), the
handler goes on, and ``reach_session_degraded_total`` counts it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from redis import exceptions as rexc

from .. import metrics
from ..connection import AnyRedis, as_text
from ..envelope import decode_payload, encode
from ..keys import Keys
from ..scripts._call import Arg
from ..scripts.sessions import APPEND, CLEAR, DELETE, SET, write_call
from ..session import DEFAULT_TTL_S, Session
from .cache import SessionCache
from .tiers import BEST_EFFORT, CACHED, SessionTier

log = logging.getLogger("reach.session")

T = TypeVar("T")

REDIS_ERRORS = (rexc.RedisError, OSError, TimeoutError)
"""What a best-effort session takes as its Redis failing (TimeoutError: no answer within
the tier's ``timeout_s``)."""


def items_empty() -> list[bytes]:
    return []


class BufferedSession(Session):
    """``ctx.session`` of a handler declared ``session="cached"`` or ``"best_effort"``."""

    def __init__(
        self,
        redis: AnyRedis,
        keys: Keys,
        session_id: str,
        *,
        tier: SessionTier,
        capability: str = "",
        cache: SessionCache | None = None,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        super().__init__(redis, keys, session_id, ttl_s=ttl_s)
        self.tier = tier
        self.consistency = tier.consistency
        self._capability = capability
        self._cache = cache if tier.consistency == CACHED else None
        self._lenient = tier.consistency == BEST_EFFORT
        self._degraded = False
        self._ops: list[Arg] = []  # held writes, session_write.lua's ops, in order
        # what the held writes change, laid over what is read
        self._cleared = False
        self._set: dict[str, bytes | None] = {}  # None: deleted
        self._appends: list[tuple[bytes, int]] = []
        self._base_len: int | None = None  # the history's length before the held appends

    @property
    def degraded(self) -> bool:
        return self._degraded

    @property
    def pending(self) -> int:
        """How many writes are held, to be sent by :meth:`flush`."""
        return sum(1 for x in self._ops if x in (SET, DELETE, APPEND, CLEAR))

    def _degrade(self, op: str, exc: BaseException) -> None:
        if not self._degraded:
            log.warning(
                "session %s of %s: Redis failed (%s: %s); best effort: the run goes on "
                "with an empty session, its writes let go",
                self.session_id,
                self._capability,
                type(exc).__name__,
                exc,
            )
            metrics.session_degraded(self._capability, op)
        self._degraded = True

    async def _read(self, fn: Callable[[], Awaitable[T]], empty: T) -> T:
        if self._degraded:
            return empty
        if not self._lenient:
            return await fn()
        try:
            with anyio.fail_after(self.tier.timeout_s):
                return await fn()
        except REDIS_ERRORS as e:
            self._degrade("read", e)
            return empty

    # -- what Redis (or the copy) holds ------------------------------------------------
    async def _base_values(self) -> dict[str, bytes]:
        if self._cache is not None:
            return await self._cache.values(self.session_id, self.tier.cache_ttl_s)
        raw = await self.redis.hgetall(self._values)
        return {as_text(k): v for k, v in raw.items()}

    async def _base_get(self, key: str) -> bytes | None:
        if self._cache is not None:
            return (await self._base_values()).get(key)
        raw = await self.redis.hget(self._values, key)
        return None if raw is None else bytes(raw)

    async def _base_history(self, last: int = 0) -> list[bytes]:
        if self._cache is not None:
            items = await self._cache.history(self.session_id, self.tier.cache_ttl_s)
            return items[-last:] if last > 0 else items
        return [bytes(x) for x in await self.redis.lrange(self._history, -last if last else 0, -1)]

    async def _base_llen(self) -> int:
        if self._cache is not None:
            return len(await self._base_history())
        return int(await self.redis.execute_command("LLEN", self._history))

    # -- reads --------------------------------------------------------------------------
    async def get(self, key: str, default: Any = None) -> Any:
        self._check()
        if key in self._set:
            held = self._set[key]
            return default if held is None else decode_payload(held)
        if self._cleared:
            return default
        raw = await self._read(lambda: self._base_get(key), None)
        return default if raw is None else decode_payload(raw)

    async def all(self) -> dict[str, Any]:
        self._check()
        empty: dict[str, bytes] = {}
        base = empty if self._cleared else dict(await self._read(self._base_values, empty))
        for k, v in self._set.items():
            if v is None:
                base.pop(k, None)
            else:
                base[k] = v
        return {k: decode_payload(v) for k, v in base.items()}

    async def history(self, *, last: int = 0) -> list[Any]:
        self._check()
        if self._cleared:
            items: list[bytes] = []
        elif self._appends:
            items = list(await self._read(self._base_history, items_empty()))
            if self._base_len is None and not self._degraded:
                self._base_len = len(items)
        else:
            items = await self._read(lambda: self._base_history(last), items_empty())
        for data, m in self._appends:
            items.append(data)
            if m > 0 and len(items) > m:
                del items[: len(items) - m]
        if last > 0:
            items = items[-last:]
        return [decode_payload(x) for x in items]

    # -- writes: held until flush() -----------------------------------------------------
    async def set(self, key: str, value: Any) -> None:
        self._check()
        data = encode(value)
        self._ops += (SET, key, data)
        self._set[key] = data

    async def delete(self, key: str) -> None:
        self._check()
        self._ops += (DELETE, key)
        self._set[key] = None

    async def append(self, item: Any, *, max_len: int = 0) -> int:
        """Append ``item`` (sent with the run's other writes); the history's length with
        it, read once per run (from the copy, or one ``LLEN``) when not known yet."""
        self._check()
        if self._base_len is None:
            self._base_len = 0 if self._cleared else await self._read(self._base_llen, 0)
        data, m = encode(item), max(0, int(max_len))
        self._ops += (APPEND, data, m)
        self._appends.append((data, m))
        n = self._base_len
        for _, lim in self._appends:
            n = min(n + 1, lim) if lim > 0 else n + 1
        return n

    async def clear(self) -> None:
        self._check()
        self._ops.append(CLEAR)
        self._cleared = True
        self._set.clear()
        self._appends.clear()
        self._base_len = 0

    async def flush(self) -> None:
        """Send the held writes in one round trip (the worker calls it when the handler
        returns). ``cached``: a Redis error is raised (the message is retried);
        ``best_effort``: it is counted and the writes are let go, as are a degraded run's."""
        if not self._ops:
            return
        ops, self._ops = self._ops, []
        if self._degraded:
            metrics.session_degraded(self._capability, "write")
            return
        call = write_call(self._keys, self.session_id, ops, ttl_ms=self._ttl_ms)
        cache = self._cache
        if cache is not None:
            cache.writing(self.session_id)
        version: int | None = None
        try:
            if self._lenient:
                with anyio.fail_after(self.tier.timeout_s):
                    version, length = await call.run(self.redis)
            else:
                version, length = await call.run(self.redis)
        except REDIS_ERRORS as e:
            if not self._lenient:
                raise
            self._degrade("write", e)
            return
        finally:
            if cache is not None:
                cache.wrote(self.session_id, version, ops)
        self._cleared, self._base_len = False, length
        self._set.clear()
        self._appends.clear()


async def settle_session(session: Session, err: BaseException | None) -> BaseException | None:
    """Send the writes a run held back (the worker calls it when the handler returned,
    before its outcome): the run's error, else the flush's (a failed flush fails the run:
    it is retried)."""
    try:
        await session.flush()
    except Exception as e:  # noqa: BLE001 - the run's outcome carries it
        log.warning("session %s: its writes were not sent: %s", session.session_id, e)
        return err or e
    return err

"""Version canaries: a capability's split between application versions, kept in Redis.

An operator splits a capability (``reach caps split text.summarize 1.4=90 1.5=10``, or
:func:`set_split`); the splits are kept in the namespace's ``splits`` hash
(:attr:`reach.keys.Keys.splits`, capability -> ``"1.4=90 1.5=10"``) and every
:class:`reach.Client` re-reads them every :data:`SPLITS_REFRESH_S` (a change applies
within it), beside the quotas. What a split means for a message is
:mod:`reach.routing.split` (the choice) and docs/routing.md, *Version canaries*.

Sessions are sticky: the first message of a session to a split capability pins the
version chosen for it in the session's ``versions`` hash (:meth:`Keys.version_pins`,
``lua/pin_version.lua``), and every later message of the session, from any process, goes
to that version while it keeps a share above 0, whatever the split becomes meanwhile. The
pins live :data:`PIN_TTL_S` after the session's last message to a split capability.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from . import audit
from .connection import AnyRedis, as_text
from .errors import ConfigError
from .keys import Keys
from .registry import normalize_capability
from .routing.split import Split
from .scripts._call import Call

__all__ = [
    "PIN_TTL_S",
    "SPLITS_REFRESH_S",
    "Split",
    "SplitCache",
    "get_split",
    "get_splits",
    "parse_splits",
    "pin_call",
    "set_split",
]

SPLITS_REFRESH_S = 1.0
"""How often a client re-reads its namespace's splits (a change takes effect within it)."""

PIN_TTL_S = 24 * 3600.0
"""How long a session's version pins outlive its last message to a split capability (as
long as the session store's values, :data:`reach.session.DEFAULT_TTL_S`)."""

NO_SPLITS: Mapping[str, Split] = {}


async def set_split(redis: AnyRedis, keys: Keys, capability: str, split: Split | None) -> None:
    """Split ``capability``'s new sessions and messages between versions (None: remove
    its split, every agent takes its messages again). Clients apply it within
    :data:`SPLITS_REFRESH_S`. The one write of a split (CLI and library alike)."""
    cap = normalize_capability(capability)
    detail = {"split": None if split is None else str(split)}
    # recorded in the audit trail (reach audit), ok or with the error that stopped it
    async with audit.operator_action(redis, keys, "caps.split", target=cap, detail=detail):
        if split is None:
            await redis.hdel(keys.splits, cap)
        else:
            await redis.hset(keys.splits, cap, str(split))


def parse_splits(raw: Any) -> dict[str, Split]:
    """The splits in an HGETALL reply of the splits hash. A field that does not parse
    (written behind reach's back) counts as no split: garbage must not stop a sender."""
    out: dict[str, Split] = {}
    if not isinstance(raw, dict):
        return out
    for k, v in raw.items():
        with contextlib.suppress(UnicodeDecodeError, TypeError, ValueError, ConfigError):
            out[as_text(k)] = Split.parse(as_text(v))
    return out


async def get_splits(redis: AnyRedis, keys: Keys) -> dict[str, Split]:
    """Every split of the namespace, by capability."""
    return parse_splits(await redis.hgetall(keys.splits))


async def get_split(redis: AnyRedis, keys: Keys, capability: str) -> Split | None:
    """``capability``'s split, or None."""
    return (await get_splits(redis, keys)).get(normalize_capability(capability))


def pin_call(
    keys: Keys,
    session_id: str,
    capability: str,
    *,
    chosen: str,
    split: Split,
    ttl_s: float = PIN_TTL_S,
) -> Call[str]:
    """One ``pin_version.lua`` call: the version ``session_id``'s messages of
    ``capability`` go to (the one pinned, while it has a share in ``split``, else
    ``chosen``, pinned then)."""
    return Call(
        "pin_version",
        (keys.version_pins(session_id),),
        (capability, chosen, max(1, int(ttl_s * 1000)), *split.live),
        as_text,
    )


class SplitCache:
    """A client's copy of its namespace's splits, read again when older than
    ``refresh_s``; only the first read is waited for (then a stale copy is used while one
    background read refreshes it). A read that fails keeps the last copy."""

    def __init__(self, keys: Keys, *, refresh_s: float = SPLITS_REFRESH_S) -> None:
        self.keys = keys
        self.refresh_s = refresh_s
        self._value: Mapping[str, Split] | None = None
        self._read_at = 0.0
        self._reading: asyncio.Task[Mapping[str, Split]] | None = None

    def invalidate(self) -> None:
        """Make the next send read the splits again (and wait for them)."""
        self._value = None

    async def get(self, redis: AnyRedis) -> Mapping[str, Split]:
        task = self.prefetch(redis)
        if self._value is not None:
            return self._value  # fresh, or stale and refreshed in the background
        assert task is not None
        return await asyncio.shield(task)

    def fresh(self) -> Mapping[str, Split] | None:
        """The splits when the copy is fresh (nothing to read first), else None."""
        if self._value is not None and time.monotonic() - self._read_at < self.refresh_s:
            return self._value
        return None

    def prefetch(self, redis: AnyRedis) -> asyncio.Task[Mapping[str, Split]] | None:
        """Start a read when the copy is stale (none running yet): a caller about to read
        the quotas starts it first, so both reads go to Redis together. The read, or None
        when the copy is fresh."""
        if self._value is not None and time.monotonic() - self._read_at < self.refresh_s:
            return None
        task = self._reading
        if task is None or task.done():
            task = self._reading = asyncio.ensure_future(self._read(redis))
            task.add_done_callback(_retrieved)  # a read nobody awaited fails quietly
        return task

    async def _read(self, redis: AnyRedis) -> Mapping[str, Split]:
        try:
            value = await get_splits(redis, self.keys)
        except Exception:
            if self._value is not None:  # a background refresh reports to nobody
                return self._value
            raise
        self._value, self._read_at = value, time.monotonic()
        return value


def _retrieved(task: asyncio.Task[Mapping[str, Split]]) -> None:
    if not task.cancelled():
        task.exception()  # the caller waiting for it (if any) gets it; nobody else must

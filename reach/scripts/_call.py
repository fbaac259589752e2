"""One encoded script call: its KEYS and ARGV, and how its reply is read.

Every typed wrapper of the script layer (:mod:`reach.scripts.agents`,
:mod:`reach.scripts.delivery`, :mod:`reach.scripts.inbox`) builds a :class:`Call`. The
same call then runs on its own (:meth:`Call.run`, :meth:`Call.run_sync`) or in a pipeline
(:meth:`Call.op`, or :func:`run_calls` for several), and its reply is decoded into the
wrapper's typed result either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Generic, TypeVar

from ..connection import AnyRedis
from ..untrusted import safe_text
from ._loader import Op, call, call_sync, op, run_pipeline

T = TypeVar("T")
E = TypeVar("E", bound=IntEnum)

Arg = str | bytes | int | float
"""One ARGV value as redis-py sends it (numbers as their decimal text)."""


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """A call of script ``script`` with ``keys`` and ``args``; ``decode`` reads its reply."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    decode: Callable[[Any], T]

    async def run(self, r: AnyRedis) -> T:
        """Run it (reloading the script on NOSCRIPT) and return the decoded reply. A refusal
        (``reach: bad ...``) or any other error reply raises ``redis.ResponseError``."""
        return self.decode(await call(r, self.script, self.keys, self.args))

    def run_sync(self, r: Any) -> T:
        """:meth:`run` on a synchronous client (the heartbeat thread)."""
        return self.decode(call_sync(r, self.script, self.keys, self.args))

    def op(self) -> Op:
        """The pipelined form (``EVALSHA ...``) for :func:`~reach.scripts.run_pipeline`;
        read its reply with :attr:`decode`."""
        return op(self.script, self.keys, self.args)


async def run_calls(r: AnyRedis, calls: Sequence[Call[T]]) -> list[T | Exception]:
    """Run ``calls`` in one pipeline: each one's decoded reply, or its error in its place
    (nothing is raised for one call's error; NOSCRIPT is recovered)."""
    replies = await run_pipeline(r, [c.op() for c in calls])
    return [
        x if isinstance(x, Exception) else c.decode(x) for c, x in zip(calls, replies, strict=True)
    ]


def code_of(enum: type[E]) -> Callable[[Any], E]:
    """The decoder of a reply that is one code of ``enum`` (ValueError for another)."""

    def decode(reply: Any) -> E:
        return enum(as_int(reply))

    return decode


def as_int(value: Any) -> int:
    """An integer reply (redis-py gives ints; bytes or text of digits are taken too)."""
    return value if isinstance(value, int) else int(value)


def as_bytes(value: Any) -> bytes:
    """A bulk reply as bytes (Lua's false, a missing value, as b'')."""
    if isinstance(value, bytes):
        return value
    if value is None or value is False:
        return b""
    return str(value).encode()


def as_text(value: Any) -> str:
    """A bulk reply as text, bytes that are not UTF-8 with replacement characters (a
    record anyone may have written)."""
    return "" if value is None or value is False else safe_text(value)

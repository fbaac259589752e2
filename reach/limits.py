"""Rate limits per capability: how often the handlers of a capability may start, over every
agent and process of the namespace at once.

An operator sets a limit (``reach caps limit text.summarize 50/s``, or
:func:`set_limit`); it is kept in the namespace's ``limits`` hash
(:attr:`reach.keys.Keys.limits`) and enforced by the workers: before a batch starts, a
worker takes its starts from the limit in Redis (``lua/rate_limit.lua``, GCRA: exact under
any number of concurrent workers and callers), and a message over the limit waits in the
delayed set until the limit lets it start (its attempt is not counted, its caller keeps
waiting up to its deadline). Workers re-read the limits every
:data:`LIMITS_REFRESH_S`; a capability without a limit costs nothing.

A limit is ``<starts>/<period>`` with the period ``s``, ``m``, ``h`` or a number of
seconds (``50/s``, ``600/m``, ``3/10s``), and a burst: how many may start at once after a
quiet spell (default 1: evenly spaced).
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from redis import exceptions as rexc

from . import audit
from .connection import AnyRedis, as_text
from .errors import ConfigError, RateLimited, RedisUnavailable
from .keys import Keys
from .registry import normalize_capability
from .scripts._call import Call, as_int

log = logging.getLogger("reach.limits")

LIMITS_REFRESH_S = 1.0
"""How often a worker re-reads the namespace's limits (a change takes effect within it)."""

MAX_BURST = 1_000_000
_SPEC = re.compile(r"\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|m|min|h|hour)?\s*\Z")
_UNIT_S = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``starts`` handler starts per ``period_s`` seconds, ``burst`` at once."""

    starts: float
    period_s: float
    burst: int = 1

    @property
    def interval_us(self) -> int:
        """µs per start (what ``rate_limit.lua`` takes), at least 1."""
        return max(1, round(self.period_s * 1e6 / self.starts))

    @property
    def per_second(self) -> float:
        return self.starts / self.period_s

    def __str__(self) -> str:
        units = {1.0: "s", 60.0: "m", 3600.0: "h"}
        period = units.get(self.period_s) or f"{_num(self.period_s)}s"
        return f"{_num(self.starts)}/{period}" + (
            f" (burst {self.burst})" if self.burst > 1 else ""
        )

    def stored(self) -> str:
        """The text kept in the limits hash."""
        return f"{_num(self.starts)}/{_num(self.period_s)}s,{self.burst}"


def _num(x: float) -> str:
    """``x`` in plain decimal digits, as :func:`parse_limit` reads it back exactly (never
    an exponent: ``:g`` wrote 1000000 as ``1e+06``, which did not parse, so a limit of a
    million a second was stored as no limit at all)."""
    text = format(Decimal(repr(x)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def parse_limit(text: str, *, burst: int | None = None) -> RateLimit:
    """``"50/s"``, ``"600/m"``, ``"3/10s"`` (and what :meth:`RateLimit.stored` writes,
    ``"<starts>/<seconds>s,<burst>"``) as a :class:`RateLimit`; ``burst`` overrides the
    text's. Raises :class:`ConfigError` saying what is wrong."""
    spec, _, stored_burst = text.partition(",")
    m = _SPEC.fullmatch(spec)
    if m is None:
        raise ConfigError(
            f"Invalid rate limit {text!r}: write <starts>/<period>, e.g. 50/s, 600/m or 3/10s."
        )
    starts, count, unit = float(m.group(1)), m.group(2), m.group(3)
    period = float(count or 1) * _UNIT_S[unit]
    if not (starts > 0 and period > 0 and math.isfinite(starts / period)):
        raise ConfigError(f"Invalid rate limit {text!r}: starts and period must be above 0.")
    if burst is None:
        burst = int(stored_burst) if stored_burst.strip().isdigit() else 1
    if not 1 <= burst <= MAX_BURST:
        raise ConfigError(f"Invalid burst {burst}: want 1..{MAX_BURST}.")
    limit = RateLimit(starts, period, burst)
    if limit.period_s * 1e6 / limit.starts > 86_400_000_000:
        raise ConfigError(f"Invalid rate limit {text!r}: slower than one start a day.")
    return limit


async def set_limit(redis: AnyRedis, keys: Keys, capability: str, limit: RateLimit | None) -> None:
    """Set (or with None, remove) ``capability``'s rate limit; workers apply it within
    :data:`LIMITS_REFRESH_S`."""
    cap = normalize_capability(capability)
    action = "caps.limit.clear" if limit is None else "caps.limit"
    detail = {} if limit is None else {"limit": str(limit)}
    async with audit.operator_action(redis, keys, action, target=cap, detail=detail):
        if limit is None:
            await redis.hdel(keys.limits, cap)
            await redis.delete(keys.rate_state(cap))
        else:
            await redis.hset(keys.limits, cap, limit.stored())


async def get_limits(redis: AnyRedis, keys: Keys) -> dict[str, RateLimit]:
    """The namespace's rate limits by capability. An entry that does not parse (written
    behind reach's back) is left out: a bad limit must not stop a worker."""
    out: dict[str, RateLimit] = {}
    for cap, text in (await redis.hgetall(keys.limits)).items():
        try:
            out[as_text(cap)] = parse_limit(as_text(text))
        except (ConfigError, ValueError, UnicodeDecodeError):
            continue
    return out


class LimitsCache:
    """The namespace's rate limits as one process knows them: re-read from Redis at most
    every :data:`LIMITS_REFRESH_S`, and only when asked (an idle process reads nothing).
    A failed read keeps the last known limits."""

    def __init__(self) -> None:
        self._limits: dict[str, RateLimit] = {}
        self._read_at = -LIMITS_REFRESH_S

    async def current(self, redis: Any, keys: Keys) -> dict[str, RateLimit]:
        now = time.monotonic()
        if now - self._read_at >= LIMITS_REFRESH_S:
            self._read_at = now
            try:
                self._limits = await get_limits(redis, keys)
            except (rexc.RedisError, OSError) as e:
                log.warning("reading the rate limits failed (%s); the last known apply", e)
        return self._limits


@dataclass(frozen=True, slots=True)
class Taken:
    """What ``rate_limit.lua`` answered: ``granted`` starts, and the µs until the next."""

    granted: int
    wait_us: int


def _taken(reply: Any) -> Taken:
    return Taken(as_int(reply[0]), as_int(reply[1]))


def take_call(
    keys: Keys, capability: str, limit: RateLimit, n: int, *, state: str | None = None
) -> Call[Taken]:
    """One ``rate_limit.lua`` call: take up to ``n`` starts of ``capability``'s limit
    (``state``: the GCRA state's key, else the capability's own, shared by every agent);
    ``n = 0`` takes nothing and answers how long until a start is allowed."""
    return Call(
        "rate_limit",
        (state or keys.rate_state(capability),),
        (max(0, min(n, 100_000)), limit.interval_us, limit.burst),
        _taken,
    )


RATE_LIMIT_CHOICES = ("wait", "raise")
"""What a caller may do about a capability over its rate limit (``on_rate_limit=``)."""


async def check_rate_limit(
    cache: LimitsCache, commands: AnyRedis, keys: Keys, capability: str, on_rate_limit: str
) -> None:
    """``Client``'s check before a send: with ``on_rate_limit="raise"``, raise
    :class:`~reach.errors.RateLimited` when ``capability``'s rate limit allows no start now
    (``reach caps limit``). It only looks (a peek at the limit's state through ``cache``,
    taking nothing): the workers take the starts, so the limit holds exactly whatever
    callers choose; a message sent after the look may still wait. ``commands``: the
    control plane's (reach.planes)."""
    if on_rate_limit not in RATE_LIMIT_CHOICES:
        raise ConfigError(
            f"on_rate_limit={on_rate_limit!r}: use 'wait' (the message waits for its "
            "turn, up to its deadline) or 'raise' (RateLimited when over the limit now)."
        )
    if on_rate_limit == "wait":
        return
    limit = (await cache.current(commands, keys)).get(capability)
    if limit is None:
        return
    try:
        taken = await take_call(keys, capability, limit, 0).run(commands)
    except (RedisUnavailable, rexc.ConnectionError, rexc.TimeoutError, OSError):
        return  # Redis away: no look now; the message goes (or is held) as with "wait"
    if taken.wait_us > 0:
        wait_s = taken.wait_us / 1e6
        raise RateLimited(
            f"{capability!r} is over its rate limit of {limit}: the next start is "
            f"allowed in {wait_s:.3f} s. Retry after that, or send with "
            "on_rate_limit='wait' (the default) to let the message wait for its turn.",
            retry_after_s=wait_s,
        )

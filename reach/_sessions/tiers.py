"""How consistent a handler's ``ctx.session`` is: ``@app.handler(cap, session=...)``.

``strong`` (the default): every read and write is a round trip to Redis; a write is seen
by every agent as soon as it returns. ``cached``: reads come from a copy in the agent's
process, kept at most ``cache_ttl_s`` and dropped as soon as any agent writes the session;
writes are held and sent in one round trip when the handler returns. ``best_effort``:
writes behind as ``cached`` does, reads from Redis, and a Redis error (or no answer within
``timeout_s``) makes the run's session empty instead of failing the handler
(``ctx.session.degraded``, counted in ``reach_session_degraded_total``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError

Consistency = Literal["strong", "cached", "best_effort"]
STRONG: Consistency = "strong"
CACHED: Consistency = "cached"
BEST_EFFORT: Consistency = "best_effort"
CONSISTENCIES: tuple[Consistency, ...] = (STRONG, CACHED, BEST_EFFORT)

DEFAULT_CACHE_TTL_S = 300.0
"""How long a cached session's copy is served at most, even when no write was announced
(a write made behind reach's back, by hand in Redis, is seen after this long)."""

DEFAULT_TIMEOUT_S = 1.0
"""How long a best-effort session waits for Redis before it counts the call as failed."""


@dataclass(frozen=True, slots=True)
class SessionTier:
    """The session tier of a handler: ``@app.handler(cap, session=SessionTier("cached",
    cache_ttl_s=60))``, or just ``session="cached"`` for the defaults.

    ``cache_ttl_s`` is the longest a ``cached`` copy is served; ``timeout_s`` the longest a
    ``best_effort`` session waits for Redis (beyond it: as a Redis error)."""

    consistency: Consistency = STRONG
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.consistency not in CONSISTENCIES:
            raise ConfigError(
                f"session={self.consistency!r}: choose 'strong' (the default: every read "
                "and write goes to Redis), 'cached' (a local copy, refreshed when the "
                "session is written) or 'best_effort' (an empty session when Redis fails)."
            )
        for name in ("cache_ttl_s", "timeout_s"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not (math.isfinite(v) and v > 0)
            ):
                raise ConfigError(f"SessionTier {name}={v!r}: give a number of seconds above 0.")


def parse_tier(value: SessionTier | str) -> SessionTier:
    """``value`` as a :class:`SessionTier` (a string names the consistency)."""
    if isinstance(value, SessionTier):
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"session={value!r}: give 'strong', 'cached', 'best_effort' or a "
            "reach.SessionTier(...)."
        )
    return SessionTier(value)  # type: ignore[arg-type]  # checked in __post_init__


DEFAULT_TIER = SessionTier()

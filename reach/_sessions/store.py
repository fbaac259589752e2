"""What a worker gives its handlers' contexts: ``ctx.session`` of the tier their handler
declares, on the session Redis (the worker's own, or ``session_url``), and the process's
copies of cached sessions with the subscription that keeps them true."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..connection import AnyRedis, connect
from ..envelope import Envelope
from ..keys import Keys
from ..session import Session
from .buffered import BufferedSession
from .cache import SessionCache
from .tiers import CACHED, DEFAULT_TIER, SessionTier

if TYPE_CHECKING:
    from ..agent import Agent


class SessionStore:
    """The session stores of one agent's run."""

    def __init__(
        self, agent: Agent, keys: Keys, redis: AnyRedis, raw: AnyRedis, *, owned: bool = False
    ) -> None:
        self.agent = agent
        self.keys = keys
        self.redis = redis
        self._raw = raw
        self._owned = owned  # a client of its own (session_url): closed with the run
        cached = any(self.tier(c).consistency == CACHED for c in agent.handlers)
        self.cache = SessionCache(redis, raw, keys) if cached else None

    @classmethod
    async def open(
        cls, agent: Agent, keys: Keys, *, url: str | None, redis: AnyRedis, raw: AnyRedis
    ) -> SessionStore:
        """The store on ``url`` (a client of its own), else on the worker's ``redis``."""
        if url:
            own = await connect(url, client_name="reach-sessions")
            return cls(agent, keys, own, own, owned=True)
        return cls(agent, keys, redis, raw)

    def tier(self, capability: str) -> SessionTier:
        spec: Any = self.agent.handlers.get(capability)
        tier = getattr(spec, "session", None)
        return tier if isinstance(tier, SessionTier) else DEFAULT_TIER

    def open_session(self, env: Envelope) -> Session:
        """``ctx.session`` for a run of ``env``."""
        tier = self.tier(env.capability)
        if tier is DEFAULT_TIER or tier.consistency == "strong":
            return Session(self.redis, self.keys, env.session_id)
        return BufferedSession(
            self.redis,
            self.keys,
            env.session_id,
            tier=tier,
            capability=env.capability,
            cache=self.cache,
        )

    async def run(self) -> None:
        """Keep the cached sessions' subscription (until cancelled); nothing without a
        cached handler."""
        if self.cache is not None:
            await self.cache.run()

    async def aclose(self) -> None:
        if self._owned:
            await self.redis.aclose()

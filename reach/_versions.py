"""A client's side of version canaries: the split of a message's capability (read every
second, :class:`reach.splits.SplitCache`) and, for a message of a session, the version its
session is pinned to (``lua/pin_version.lua``), which the router then picks among
(:mod:`reach.routing.router`, *Version splits*). A targeted message ignores the split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

from ._autopipe import AutoPipeline
from .envelope import Envelope
from .keys import Keys
from .routing import Router
from .routing.split import Split
from .splits import SplitCache, pin_call
from .view import RegistryView


class Versions:
    """The split and pinned version of each message a :class:`reach._sending.delivery.Delivery`
    routes (Redis errors propagate: the caller names the Redis)."""

    def __init__(
        self,
        *,
        view: RegistryView,
        router: Router,
        commands: AutoPipeline,
        keys: Keys,
        control: AutoPipeline | None = None,
    ) -> None:
        self.view = view
        self.router = router
        self.commands = commands  # the data plane: a session's pins live in its slot
        self.control = commands if control is None else control  # the splits (reach.planes)
        self.keys = keys
        self.cache = SplitCache(keys)

    async def split_of(self, env: Envelope) -> Split | None:
        """The split ``env`` is routed by (None: none, or it names its target)."""
        if env.target:
            return None
        return await self.split_for(env.capability)

    async def split_for(self, capability: str) -> Split | None:
        """``capability``'s split (None: none), as last read."""
        return (await self.cache.get(self.control)).get(capability)

    async def route(
        self, env: Envelope, where: Mapping[str, Any] | None
    ) -> tuple[Split | None, str | None]:
        """``env``'s split and, for a message of a session, its session's version."""
        split = await self.split_of(env)
        if split is None or not env.session_id:
            return split, None
        return split, await self.pin(env.session_id, env.capability, split, where)

    async def pin(
        self, session_id: str, capability: str, split: Split, where: Mapping[str, Any] | None
    ) -> str | None:
        """The version ``session_id``'s messages of ``capability`` go to: pinned by its
        first message to one of the versions with a share that has an agent now (chosen
        by a hash of the session id, :meth:`Split.for_session`), kept while that version
        has a share. None when no such version has an agent (the pick says why)."""
        candidates, version = await self.view.candidates(capability)
        among = self.router.split_versions(
            capability, candidates, split, where=where, version=version
        )
        chosen = split.for_session(session_id, among)
        if chosen is None:
            return None
        return await pin_call(self.keys, session_id, capability, chosen=chosen, split=split).run(
            self.commands
        )

    async def pins(
        self, envs: list[Envelope], split: Split, where: Mapping[str, Any] | None
    ) -> dict[str, str | None]:
        """:meth:`pin` of each session of ``envs`` (a batch of one capability), once each,
        concurrently (the auto-pipeline sends the calls together)."""
        sessions = sorted({env.session_id for env in envs if env.session_id})
        out: dict[str, str | None] = {}
        if not sessions:
            return out
        capability = envs[0].capability

        async def one(sid: str) -> None:
            out[sid] = await self.pin(sid, capability, split, where)

        async with anyio.create_task_group() as tg:
            for sid in sessions:
                tg.start_soon(one, sid)
        return out

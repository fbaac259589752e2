"""What the scripts announce on a task record's channel (lua/includes/announce.lua), read
by a plain redis-py subscriber: :func:`listening` subscribes, and ``heard()`` returns the
messages announced since, in order. ``heard`` publishes a marker of its own last and reads
up to it, so "nothing announced" is read as surely as a message, without waiting a while."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import redis.asyncio as aredis

MARK = b"-- the test's marker --"


@asynccontextmanager
async def listening(url: str, channel: str) -> AsyncIterator[Callable[[], Awaitable[list[bytes]]]]:
    sub = aredis.Redis.from_url(url)
    ps = sub.pubsub()
    try:
        await ps.execute_command("SSUBSCRIBE", channel)
        with anyio.fail_after(10):
            while (m := await ps.get_message(timeout=1.0)) is None or m["type"] != "ssubscribe":
                pass

        async def heard() -> list[bytes]:
            await sub.execute_command("SPUBLISH", channel, MARK)
            got: list[bytes] = []
            with anyio.fail_after(10):
                while True:
                    m = await ps.get_message(timeout=1.0)
                    if m is None or m["type"] != "smessage":
                        continue
                    if m["data"] == MARK:
                        return got
                    got.append(m["data"])

        yield heard
    finally:
        await ps.aclose()
        await sub.aclose()

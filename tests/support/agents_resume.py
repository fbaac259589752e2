"""The agent of the resume process tests (``reach worker tests.support.agents_resume:app``).

* ``resume.count``: yields ``n`` chunks ``{"i": i}``, ``pause_s`` apart after chunk
  ``slow_from`` (a reader can be killed while chunks still come), and the result
  ``{"chunks": n}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio

from reach import Agent, Context


def app() -> Agent:
    a = Agent("resume-1", capabilities=["resume.count"])

    @a.handler("resume.count")
    async def count(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        for i in range(payload["n"]):
            if i >= payload.get("slow_from", payload["n"]):
                await anyio.sleep(payload["pause_s"])
            yield {"i": i}
        ctx.result = {"chunks": payload["n"]}

    return a

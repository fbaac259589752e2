"""Agents the web console's tests run as real `reach worker` processes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from reach import Agent, Context, Reject

# While this file exists, web.flaky refuses its messages (dead-lettered at once, no retry):
# a test makes dead letters with it, removes it, and replays them to success.
FLAG_ENV = "REACH_WEB_TEST_REFUSE"
# The worker is started (and has imported everything) before the test opens its page; it
# registers only once this file exists, so the page sees the agent arrive.
GATE_ENV = "REACH_WEB_TEST_GATE"


def flaky() -> Agent:
    gate = os.environ.get(GATE_ENV, "")
    end = time.monotonic() + 120
    while gate and not Path(gate).exists() and time.monotonic() < end:
        time.sleep(0.02)
    app = Agent(os.environ.get("REACH_WEB_TEST_AGENT", "web-1"), capabilities=["web.flaky"])

    @app.handler("web.flaky")
    async def handle(payload: Any, ctx: Context) -> Any:
        flag = os.environ.get(FLAG_ENV, "")
        if flag and Path(flag).exists():
            raise Reject("refused while the test's flag file exists")
        return {"echo": payload}

    return app

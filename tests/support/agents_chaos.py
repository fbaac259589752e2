"""The chaos suite's agent, run as real `reach worker tests.support.agents_chaos:agent` processes.

A zero-arg factory: each process reads its agent id from REACH_CHAOS_AGENT_ID (set per
process by the chaos engine), so a worker restarted after a SIGKILL takes the same id and
resumes its own pending entries. The handler (see reach.chaos) sleeps a few ms, then makes
its side effect once per idempotency key with an idempotent Lua write and logs the run.
"""

from __future__ import annotations

from reach import Agent
from reach.chaos import chaos_agent


def agent() -> Agent:
    return chaos_agent()

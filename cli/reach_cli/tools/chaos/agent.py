"""The agent the chaos workers run (``reach worker reach_cli.tools.chaos:chaos_agent``).

Its handler sleeps a little, then makes one counted side effect per idempotency key with
an idempotent Lua write, and logs the run (agent, pid, fence, start, end) so that the
checks can find re-executions and overlapping runs afterwards.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
from redis import exceptions as rexc

from reach import Agent, Context
from reach.envelope import now_ms

CAPABILITY = "chaos.work"
AGENT_ENV = "REACH_CHAOS_AGENT_ID"
EFFECTS = "chaos"  # Keys.effects(EFFECTS): the hash the handlers count side effects in
DEFAULT_AGENT = "reach_cli.tools.chaos:chaos_agent"

# The side effect: applied once per idempotency key, every run logged.
# KEYS[1] effects hash; ARGV[1] idempotency key, ARGV[2] fence, ARGV[3] run record
# ("agent|pid|fence|start_ms|end_ms"). Fields: effects (total applied), done:<key> (fence
# of the run that applied it), applied:<key> (times applied: must be 1), runs:<key> (runs
# that reached the effect), run:<key>:<n> (the n-th run's record).
EFFECT_LUA = """
if redis.call('HSETNX', KEYS[1], 'done:' .. ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'effects', 1)
  redis.call('HINCRBY', KEYS[1], 'applied:' .. ARGV[1], 1)
end
local n = redis.call('HINCRBY', KEYS[1], 'runs:' .. ARGV[1], 1)
redis.call('HSET', KEYS[1], 'run:' .. ARGV[1] .. ':' .. n, ARGV[3])
return n
"""


# -- the agent the workers run ----------------------------------------------------------------
async def _work(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    start = now_ms()
    await anyio.sleep(int(payload.get("s", 0)) / 1000)
    key = ctx.idempotency_key
    fx = ctx.keys.effects(EFFECTS)
    give_up = time.monotonic() + 10
    while True:  # an external write retried while Redis restarts (it is idempotent)
        try:
            record = f"{ctx.agent_id}|{os.getpid()}|{ctx.fence}|{start}|{now_ms()}"
            await ctx.redis.eval(EFFECT_LUA, 1, fx, key, ctx.fence, record)
            break
        except (rexc.ConnectionError, rexc.TimeoutError):
            if time.monotonic() > give_up:
                raise
            await anyio.sleep(0.05)
    return {"k": key, "n": payload.get("n")}


def chaos_agent() -> Agent:
    """The chaos worker (``reach worker reach_cli.tools.chaos:chaos_agent``); its agent id
    comes from ``REACH_CHAOS_AGENT_ID`` so a restarted process takes the same one."""
    agent_id = os.environ.get(AGENT_ENV) or f"w-{os.getpid()}"
    app = Agent(agent_id, capabilities=[CAPABILITY])
    app.handler(CAPABILITY)(_work)
    return app

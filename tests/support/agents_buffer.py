"""The agent of the outage-buffer test (``reach worker tests.support.agents_buffer:outage_agent``).

Each handler run applies its message's label once per idempotency key, in one Lua call:
the label's count (``n:<label>``: how many distinct keys carried it, 1 unless a message
was sent again under a new msg_id) and its position among all first applications
(``at:<label>``), so the test can count duplicates and check the order of the sends.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from redis import exceptions as rexc

from reach import Agent, Context

CAPABILITY = "test.outage"
AGENT_ID = "outage-1"
EFFECTS = "outage"  # Keys.effects(EFFECTS): the hash the handler writes

# KEYS[1] the effects hash; ARGV[1] idempotency key, ARGV[2] label. Fields: key:<key> (the
# label it applied), seq (applications so far), n:<label>, at:<label> (see the docstring),
# runs:<key> (handler runs that reached this write, reruns of one key included).
RECORD_LUA = """
redis.call('HINCRBY', KEYS[1], 'runs:' .. ARGV[1], 1)
if redis.call('HSETNX', KEYS[1], 'key:' .. ARGV[1], ARGV[2]) == 1 then
  local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  redis.call('HINCRBY', KEYS[1], 'n:' .. ARGV[2], 1)
  redis.call('HSETNX', KEYS[1], 'at:' .. ARGV[2], seq)
end
return 1
"""


async def _record(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    label = str(payload["label"])
    give_up = time.monotonic() + 60
    while True:  # the write is retried while Redis restarts (it is idempotent per key)
        try:
            await ctx.redis.eval(
                RECORD_LUA, 1, ctx.keys.effects(EFFECTS), ctx.idempotency_key, label
            )
            break
        except (rexc.ConnectionError, rexc.TimeoutError):
            if time.monotonic() > give_up:
                raise
            await anyio.sleep(0.05)
    return {"label": label}


def outage_agent() -> Agent:
    app = Agent(AGENT_ID, capabilities=[CAPABILITY])
    app.handler(CAPABILITY)(_record)
    return app

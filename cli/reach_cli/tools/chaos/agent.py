"""The agents the chaos workers run.

``chaos_agent`` (the crash scenario): its handler sleeps a little, then makes one counted
side effect per idempotency key with an idempotent Lua write, and logs the run (agent,
pid, fence, start, end) so that the checks can find re-executions and overlapping runs
afterwards.

``deploy_agent`` (the rolling-deploy scenario): a plain handler and a streaming one that
run for 0.05-5 s and write every run, when it starts and when it ends, to a ledger: a Redis
of its own (``REACH_CHAOS_LEDGER_URL``) that the scenario never restarts, so the count of
runs per message is exact whatever happens to the Redis that carries the messages.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from redis import exceptions as rexc
from redis.asyncio import Redis

from reach import Agent, Context
from reach.envelope import now_ms

CAPABILITY = "chaos.work"
STREAM_CAPABILITY = "chaos.stream"
AGENT_ENV = "REACH_CHAOS_AGENT_ID"
LEDGER_ENV = "REACH_CHAOS_LEDGER_URL"
EFFECTS = "chaos"  # Keys.effects(EFFECTS): the hash the handlers count side effects in
LEDGER = "chaos:ledger"  # the ledger Redis's one hash (that Redis holds nothing else)
DEFAULT_AGENT = "reach_cli.tools.chaos:chaos_agent"
DEPLOY_AGENT = "reach_cli.tools.chaos:deploy_agent"

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


# -- the rolling-deploy agent -----------------------------------------------------------------
# A run starts. KEYS[1] ledger hash; ARGV[1] idempotency key, ARGV[2] run record
# ("agent|pid|fence|start_ms"). Fields: starts:<key> (runs started), run:<key>:<n> (the n-th
# run's record). Returns n.
RUN_START_LUA = """
local n = redis.call('HINCRBY', KEYS[1], 'starts:' .. ARGV[1], 1)
redis.call('HSET', KEYS[1], 'run:' .. ARGV[1] .. ':' .. n, ARGV[2])
return n
"""

# A run ended. KEYS[1] ledger hash; ARGV[1] idempotency key, ARGV[2] the run's n, ARGV[3]
# end_ms, ARGV[4] fence, ARGV[5] how it ended ("ok", or the name of the exception that
# ended it: CancelledError, GeneratorExit when the runtime closed a stream, ...). Fields:
# end:<key>:<n> ("end_ms|how"); for "ok" only: the side effect, applied once per key
# (done:<key> = fence of the run that applied it, effects = effects applied) and
# ends:<key> (runs that ran to their end). Returns the runs that ran to their end.
RUN_END_LUA = """
redis.call('HSET', KEYS[1], 'end:' .. ARGV[1] .. ':' .. ARGV[2], ARGV[3] .. '|' .. ARGV[5])
if ARGV[5] ~= 'ok' then
  return tonumber(redis.call('HGET', KEYS[1], 'ends:' .. ARGV[1]) or '0')
end
if redis.call('HSETNX', KEYS[1], 'done:' .. ARGV[1], ARGV[4]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'effects', 1)
end
return redis.call('HINCRBY', KEYS[1], 'ends:' .. ARGV[1], 1)
"""

_ledger: list[Redis] = []  # this process's connection to the ledger, made at first use


def _ledger_redis() -> Redis:
    if not _ledger:
        url = os.environ.get(LEDGER_ENV)
        if not url:
            raise RuntimeError(
                f"{LEDGER_ENV} is not set: the rolling-deploy agent records its runs in a "
                "ledger Redis that `reach chaos --scenario rolling-deploy` starts and names."
            )
        _ledger.append(Redis.from_url(url))
    return _ledger[0]


async def _run_start(ctx: Context) -> int:
    record = f"{ctx.agent_id}|{os.getpid()}|{ctx.fence}|{now_ms()}"
    return int(await _ledger_redis().eval(RUN_START_LUA, 1, LEDGER, ctx.idempotency_key, record))


async def _run_end(ctx: Context, n: int, how: str) -> None:
    # Shielded: a cancelled run's end is recorded too (it is how a cut run is told apart
    # from one that never ended).
    with anyio.CancelScope(shield=True):
        await _ledger_redis().eval(
            RUN_END_LUA, 1, LEDGER, ctx.idempotency_key, n, now_ms(), ctx.fence, how
        )


async def _deploy_work(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    n = await _run_start(ctx)
    how = "ok"
    try:
        await anyio.sleep(int(payload.get("s", 0)) / 1000)
    except BaseException as e:
        how = type(e).__name__
        raise
    finally:
        await _run_end(ctx, n, how)
    return {"k": ctx.idempotency_key, "n": payload.get("n")}


async def _deploy_stream(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
    n = await _run_start(ctx)
    chunks = max(1, int(payload.get("c", 1)))
    step = int(payload.get("s", 0)) / 1000 / chunks
    how = "ok"
    try:
        for i in range(chunks):
            await anyio.sleep(step)
            yield {"i": i}
    except BaseException as e:  # GeneratorExit: the runtime stopped the stream
        how = type(e).__name__
        raise
    finally:
        await _run_end(ctx, n, how)
    ctx.result = {"k": ctx.idempotency_key, "n": payload.get("n")}


def deploy_agent() -> Agent:
    """The rolling-deploy worker (``reach worker reach_cli.tools.chaos:deploy_agent``): a
    request/send handler (``chaos.work``) and a streaming one (``chaos.stream``) that record
    each run's start and end in the ledger Redis named by ``REACH_CHAOS_LEDGER_URL``; its
    agent id comes from ``REACH_CHAOS_AGENT_ID``."""
    agent_id = os.environ.get(AGENT_ENV) or f"w-{os.getpid()}"
    app = Agent(agent_id, capabilities=[CAPABILITY, STREAM_CAPABILITY])
    app.handler(CAPABILITY)(_deploy_work)
    app.handler(STREAM_CAPABILITY)(_deploy_stream)
    return app

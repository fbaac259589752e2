"""Agents for the gather tests: each a factory ``reach worker
tests.support.agents_gather:NAME`` runs in a child process, all declaring ``vote.pick``.

``voter_<i>`` answers at once with the payload's ``answer`` (a dict, so equal answers must
be recognised whatever their key order); ``dissenter`` answers something else;
``slow_voter`` sleeps ``REACH_TEST_SLOW_S`` (600 s unless set) before it answers;
``failing_voter`` raises; ``sleepy_voter_<i>`` sleeps ``seconds`` from the payload. Every
handler counts its start (``vote.started``) and its end (``vote.finished``) per agent,
and a cancelled one counts ``vote.cancelled``; each notes its message's deadline
(``vote.deadline``), and all advertise a ``timeout_s`` of :data:`ADVERTISED_S`.
"""

from __future__ import annotations

import os
from typing import Any

import anyio

from reach import Agent, Context

CAP = "vote.pick"
ADVERTISED_S = 45  # every agent here advertises it: a gather with no timeout_s takes it


async def _count(ctx: Context, what: str) -> None:
    await ctx.redis.hincrby(ctx.keys.effects(f"vote.{what}"), ctx.agent_id, 1)


def _agent(
    agent_id: str, answer: Any = None, *, sleep_s: float | None = None, fail: bool = False
) -> Agent:
    app = Agent(agent_id, capabilities=[CAP])

    @app.handler(CAP, timeout_s=ADVERTISED_S)
    async def pick(payload: Any, ctx: Context) -> Any:
        await _count(ctx, "started")
        await ctx.redis.hset(ctx.keys.effects("vote.deadline"), ctx.agent_id, ctx.deadline_ms)
        try:
            seconds = payload.get("seconds") if sleep_s is None else sleep_s
            if seconds:
                await anyio.sleep(seconds)
        except BaseException:
            with anyio.CancelScope(shield=True):  # the cut cancels every later await too
                await _count(ctx, "cancelled")
            raise
        if fail:
            raise RuntimeError(f"{agent_id} cannot decide")
        await _count(ctx, "finished")
        return answer if answer is not None else payload["answer"]

    return app


def voter_1() -> Agent:
    return _agent("voter-1")


def voter_2() -> Agent:
    return _agent("voter-2")


def voter_3() -> Agent:
    return _agent("voter-3")


def dissenter() -> Agent:
    return _agent("dissenter", {"label": "no", "score": 0})


def slow_voter() -> Agent:
    return _agent("slow-voter", sleep_s=float(os.environ.get("REACH_TEST_SLOW_S", "600")))


def failing_voter() -> Agent:
    return _agent("failing-voter", fail=True)


def failing_voter_2() -> Agent:
    return _agent("failing-voter-2", fail=True)


def sleepy_voter_1() -> Agent:
    return _agent("sleepy-1")


def sleepy_voter_2() -> Agent:
    return _agent("sleepy-2")


def sleepy_voter_3() -> Agent:
    return _agent("sleepy-3")


def sleepy_voter_4() -> Agent:
    return _agent("sleepy-4")

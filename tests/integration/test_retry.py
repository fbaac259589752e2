"""``raise reach.Retry(delay_s=...)`` on a real worker: the next attempt comes after that
delay, it counts as an attempt, and the deadline still bounds it."""

from __future__ import annotations

import time
from typing import Any

import pytest

import reach
from reach import Agent, Context
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.tasks import parse_dead_letter
from tests.support.agents_messaging import serving, wait_status, wait_until

pytestmark = pytest.mark.anyio


async def dead_letters(r: AnyRedis, ns: str, capability: str) -> list[Any]:
    return [parse_dead_letter(i, f) for i, f in await r.xrange(Keys(ns).dlq(capability))]


async def test_retry_with_a_delay_runs_again_after_that_delay(redis_url: str, ns: str) -> None:
    app = Agent("retry-1", capabilities=["retry.later"])
    starts: list[tuple[int, float]] = []

    @app.handler("retry.later")
    async def later(payload: Any, ctx: Context) -> Any:
        starts.append((ctx.attempt, time.monotonic()))
        if ctx.attempt == 1:
            raise reach.Retry("not yet", delay_s=1.0)
        return {"attempt": ctx.attempt}

    # retry_base_s is 0.05 here: an ordinary failure would be retried within ~0.1 s
    async with serving(redis_url, ns, app) as client:
        env = client.build("retry.later", None, timeout_s=15)
        assert await client.call(env) == {"attempt": 2}
        st = await wait_status(client, env.msg_id, "succeeded")
    assert st.runs == 2
    (a1, t1), (a2, t2) = starts
    assert (a1, a2) == (1, 2)
    assert 1.0 <= t2 - t1 < 6.0


async def test_retry_counts_as_an_attempt_then_dead_letters(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    app = Agent("retry-2", capabilities=["retry.never"])

    @app.handler("retry.never")
    async def never(payload: Any, ctx: Context) -> Any:
        raise reach.Retry(f"still busy (attempt {ctx.attempt})", delay_s=0.05)

    async with serving(redis_url, ns, app) as client:
        env = client.build("retry.never", None, timeout_s=15, max_attempts=3)
        with pytest.raises(reach.RemoteError) as ei:
            await client.call(env)
        assert ei.value.type == "Retry" and ei.value.message == "still busy (attempt 3)"
        st = await wait_status(client, env.msg_id, "dead")
        assert st.runs == 3
        [dl] = await wait_until(lambda: dead_letters(r, ns, "retry.never"), what="dead letter")
    assert (dl.reason, dl.attempts, dl.error_type, dl.msg_id) == (
        "max_attempts",
        3,
        "Retry",
        env.msg_id,
    )


async def test_a_retry_after_the_deadline_expires_the_message(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    app = Agent("retry-3", capabilities=["retry.late"])
    runs: list[int] = []

    @app.handler("retry.late")
    async def late(payload: Any, ctx: Context) -> Any:
        runs.append(ctx.attempt)
        raise reach.Retry("come back in a minute", delay_s=60)

    async with serving(redis_url, ns, app) as client:
        msg_id = await client.send("retry.late", None, timeout_s=10)
        await wait_status(client, msg_id, "expired")
        [dl] = await wait_until(lambda: dead_letters(r, ns, "retry.late"), what="dead letter")
    assert runs == [1]
    assert (dl.reason, dl.error_type) == ("expired", "Retry")
    assert dl.error == "no time left for a retry after: come back in a minute"

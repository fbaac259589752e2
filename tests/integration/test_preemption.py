"""Priority preemption (issue 14, item 3): an agent saturated with low-priority work makes
room for a high-priority message within a bounded time by cutting a low-priority run and
requeueing it (its attempt not counted); a non-preemptible handler is never cut; a message
preempted max_preempts times runs to its end (aging), so low priority completes too."""

from __future__ import annotations

import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import anyio
import pytest

from reach import Agent, Client, Context
from reach.connection import AnyRedis
from reach.signing import keygen
from tests.integration.test_cancel import wait_effect
from tests.support.agents_messaging import bump, effects, serving, wait_status

pytestmark = pytest.mark.anyio


def agent() -> Agent:
    app = Agent("pre-1", capabilities=["pre.low", "pre.fixed", "pre.high"])

    @app.handler("pre.low")
    async def low(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "started")
        await anyio.sleep(float(payload))
        await bump(ctx, "finished")
        return ctx.attempt

    @app.handler("pre.fixed", preemptible=False)
    async def fixed(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "started")
        await anyio.sleep(float(payload))
        await bump(ctx, "finished")
        return ctx.attempt

    @app.handler("pre.high")
    async def high(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "high")
        return "high"

    return app


OPTS: dict[str, Any] = {"concurrency": 2, "prefetch": 0, "preempt_after_s": 0.1}


async def test_a_high_message_preempts_low_work_which_still_completes(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, agent(), max_preempts=1, **OPTS) as client:
        lows = [await client.send("pre.low", 2.0, priority="low") for _ in range(2)]
        for m in lows:
            await wait_effect(r, ns, "started", m)  # both slots taken by low work
        t0 = time.monotonic()
        assert await client.request("pre.high", None, priority="high", timeout_s=30) == "high"
        waited = time.monotonic() - t0
        assert waited < 1.5, waited  # not the 2 s a low run takes: one was cut for it
        # The preempted one went back and ran again to its end (max_preempts=1: then it
        # is no longer preemptible), its attempt not counted.
        for m in lows:
            st = await wait_status(client, m, "succeeded", timeout=30)
            assert st.attempt == 1
        started = await effects(r, ns, "started")
        assert sorted(started[m] for m in lows) == [1, 2]  # one was run twice
        assert await effects(r, ns, "finished") == {m: 1 for m in lows}


async def test_a_non_preemptible_handler_is_not_cut(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, agent(), **OPTS) as client:
        fixed = [await client.send("pre.fixed", 1.5, priority="low") for _ in range(2)]
        for m in fixed:
            await wait_effect(r, ns, "started", m)
        t0 = time.monotonic()
        assert await client.request("pre.high", None, priority="high", timeout_s=30) == "high"
        assert time.monotonic() - t0 >= 0.5  # it waited for a run to end
        started = await effects(r, ns, "started")
        assert [started[m] for m in fixed] == [1, 1]  # none was cut


async def test_without_the_option_nothing_is_preempted(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    opts = {**OPTS, "preempt_after_s": None}
    async with serving(redis_url, ns, agent(), **opts) as client:
        lows = [await client.send("pre.low", 1.5, priority="low") for _ in range(2)]
        for m in lows:
            await wait_effect(r, ns, "started", m)
        t0 = time.monotonic()
        assert await client.request("pre.high", None, priority="high", timeout_s=30) == "high"
        assert time.monotonic() - t0 >= 0.5
        assert set((await effects(r, ns, "started")).values()) == {1}


@pytest.mark.skipif(find_spec("cryptography") is None, reason="Ed25519 needs cryptography")
async def test_a_preempted_signed_message_keeps_its_senders_signature(
    redis_url: str, ns: str, r: AnyRedis, tmp_path: Path
) -> None:
    # The preemption count is a field outside the signature. Counted in the (signed)
    # headers, the requeued copy no longer verified and was signed again by the sweeping
    # agent: its sender became the agent, and its idempotency scope with it.
    files = {}
    lines = ""
    for name in ("pre-1", "caller"):
        private, line = keygen(name)
        (tmp_path / name).write_text(private)
        files[name], lines = str(tmp_path / name), lines + line
    (tmp_path / "trusted").write_text(lines)
    trusted = str(tmp_path / "trusted")
    senders: dict[str, list[str | None]] = {}
    app = agent()
    low = app.handlers["pre.low"].fn

    @app.handler("pre.low")
    async def low_seen(payload: Any, ctx: Context) -> Any:
        senders.setdefault(ctx.msg_id, []).append(ctx.sender)
        return await low(payload, ctx)

    async with (
        serving(
            redis_url,
            ns,
            app,
            max_preempts=1,
            require_signed=True,
            identity_file=files["pre-1"],
            trusted_keys_file=trusted,
            **OPTS,
        ),
        Client(
            redis_url=redis_url,
            namespace=ns,
            identity_file=files["caller"],
            trusted_keys_file=trusted,
        ) as client,
    ):
        lows = [await client.send("pre.low", 2.0, priority="low") for _ in range(2)]
        for m in lows:
            await wait_effect(r, ns, "started", m)
        assert await client.request("pre.high", None, priority="high", timeout_s=30) == "high"
        for m in lows:
            await wait_status(client, m, "succeeded", timeout=30)
        started = await effects(r, ns, "started")
        assert sorted(started[m] for m in lows) == [1, 2]  # one was cut and ran again
        assert sorted(len(senders[m]) for m in lows) == [1, 2]
        assert {s for m in lows for s in senders[m]} == {"caller"}

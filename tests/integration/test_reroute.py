"""``reroute_after_s`` with real worker processes: a message queued behind a stalled but
live agent (its only slot held) moves to another agent and runs exactly once; the stalled
agent, once free, never runs the first copy; a message its agent already runs stays."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

import reach
from reach.client import Client
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_reroute")
    yield w
    w.stop_all()


async def routable(c: Client, cap: str, *ids: str) -> None:
    async def probe() -> bool:
        c.invalidate()
        try:
            got = {a.agent_id for a in await c.eligible(cap)}
        except reach.NoAgentAvailable:
            return False
        return set(ids) <= got

    await wait_until(probe, timeout_s=60, what=f"{ids} routable for {cap}")


async def stalled(c: Client, r: AnyRedis, k: Keys, cap: str) -> str:
    """Hold the only slot of agent 'stall' (the only agent so far); the holder's msg_id."""
    holder = await c.send(cap, {"hold": True}, timeout_s=60, reroute_after_s=0.3)
    await wait_until(
        lambda: r.hget(k.effects("ran_on"), holder), timeout_s=60, what="the holder running"
    )
    return holder


async def freed_and_drained(c: Client, r: AnyRedis, k: Keys, cap: str) -> None:
    """Let the holder go; then a message sent to 'stall' directly comes back, so 'stall'
    read everything its inbox held before it (one stream, in order)."""
    await r.set(k.effects("release"), 1)
    assert await c.request(cap, {}, target="stall", timeout_s=60) == "stall"


@pytest.mark.parametrize(
    ("cap", "after_s"),
    [("route.stall", 0.5), ("route.stall_adv", None)],
    ids=["per_call", "advertised"],
)
async def test_a_message_queued_behind_a_stalled_agent_moves_and_runs_once(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis, cap: str, after_s: float | None
) -> None:
    k = Keys(ns)
    workers.start("stall", "--concurrency", "1")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await routable(c, cap, "stall")
        holder = await stalled(c, r, k, cap)
        async with anyio.create_task_group() as tg:
            got: list[str] = []

            async def queued() -> None:
                opts = {} if after_s is None else {"reroute_after_s": after_s}
                got.append(await c.request(cap, {"n": 1}, timeout_s=60, **opts))

            tg.start_soon(queued)
            # the message is in the stalled agent's inbox, unread, before the spare exists
            await wait_until(
                lambda: r.xlen(k.inbox("stall", "normal")), timeout_s=30, what="queued"
            )
            workers.start("spare", "--concurrency", "2")
        assert got == ["spare"]
        assert c._delivery.reroute.moves == 1
        runs = {kk.decode(): int(v) for kk, v in (await r.hgetall(k.effects("runs"))).items()}
        moved = next(m for m in runs if m != holder)
        assert runs == {holder: 1, moved: 1}
        await freed_and_drained(c, r, k, cap)
        runs = {kk.decode(): int(v) for kk, v in (await r.hgetall(k.effects("runs"))).items()}
        assert runs[moved] == 1 and runs[holder] == 1  # the first copy never ran
        assert (await r.hget(k.effects("ran_on"), moved)) == b"spare"
        assert (await r.hget(k.effects("ran_on"), holder)) == b"stall"  # running: stayed
        assert sum([await r.xlen(s) for s in k.inboxes("stall")]) == 0


async def test_reroute_after_s_is_refused_where_it_cannot_apply(redis_url: str, ns: str) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as c:
        with pytest.raises(reach.ConfigError, match="reroute_after_s"):
            await c.send("route.stall", {}, target="stall", reroute_after_s=1)
        for bad in (0, -1, float("nan"), float("inf")):
            with pytest.raises(reach.ConfigError, match="reroute_after_s"):
                await c.request("route.stall", {}, reroute_after_s=bad)

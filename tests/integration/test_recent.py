"""The index of recent messages on real workers: each handled attempt is listed with its
agent and timings, newest first, filtered by capability, agent, status and time, paged;
messages still in an inbox are listed as pending or running; the index stays bounded."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import reach
from reach.connection import AnyRedis, connect
from reach.keys import Keys
from reach.recent import Filters, attempts_of, list_messages, parse_since
from tests.support.agents_failing import failing_agent
from tests.support.agents_messaging import Gate, serving, wait_status, wait_until
from tests.support.cluster import RedisTestCluster

pytestmark = pytest.mark.anyio


def echo(agent_id: str = "echo-r1") -> reach.Agent:
    app = reach.Agent(agent_id, capabilities=["rec.echo"])

    @app.handler("rec.echo")
    async def run(payload: Any, ctx: reach.Context) -> Any:
        return payload

    return app


async def test_handled_messages_are_listed_newest_first_with_filters(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    keys = Keys(ns)
    async with serving(redis_url, ns, echo(), failing_agent()) as client:
        ok = [await client.request("rec.echo", {"i": i}, timeout_s=15) for i in range(3)]
        assert ok == [{"i": 0}, {"i": 1}, {"i": 2}]
        env = client.build("fail.key", {"no": "txt"}, timeout_s=15, max_attempts=2)
        with pytest.raises(reach.RemoteError):
            await client.call(env)
        await wait_status(client, env.msg_id, "dead")

        async def listed() -> Any:
            page = await list_messages(r, keys)
            return page if len(page.messages) >= 4 else None

        page = await wait_until(listed, what="4 messages listed")
        first = page.messages[0]
        assert (first.msg_id, first.status, first.capability) == (env.msg_id, "dead", "fail.key")
        assert first.agent_id == "failing-1" and first.error_type == "KeyError"
        assert first.attempt == 2 and first.started_ms <= first.ended_ms
        assert [m.capability for m in page.messages[1:4]] == ["rec.echo"] * 3
        assert all(m.status == "succeeded" for m in page.messages[1:4])

        only_failed = await list_messages(r, keys, Filters(status="failed"))
        assert [m.msg_id for m in only_failed.messages] == [env.msg_id]
        by_cap = await list_messages(r, keys, Filters(capability="rec.echo"))
        assert len(by_cap.messages) == 3
        by_agent = await list_messages(r, keys, Filters(agent_id="failing-1"))
        assert [m.msg_id for m in by_agent.messages] == [env.msg_id]
        assert not (await list_messages(r, keys, Filters(status="cancelled"))).messages
        later = await list_messages(r, keys, Filters(since_ms=parse_since("1d") + 2 * 86_400_000))
        assert not later.messages  # nothing after tomorrow

        attempts = await attempts_of(r, keys, env.msg_id)
        assert [(a.attempt, a.status, a.agent_id) for a in attempts] == [
            (1, "retrying", "failing-1"),
            (2, "dead", "failing-1"),
        ]
        assert all(a.error_type == "KeyError" and a.started_ms > 0 for a in attempts)


async def test_pages_follow_each_other_without_repeats(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    keys = Keys(ns)
    sent: list[str] = []
    async with serving(redis_url, ns, echo()) as client:
        for i in range(7):
            env = client.build("rec.echo", i, timeout_s=15)
            await client.call(env)
            sent.append(env.msg_id)

            # Each row in an index entry of its own (a lone message's row is held up to
            # 0.25 s, then written alone): a page is whole entries, so 7 rows in one entry
            # would make one page and leave the cursor unused.
            async def written(n: int = i + 1) -> bool:
                return bool(await r.xlen(keys.recent) >= n)

            await wait_until(written, what=f"index entry {i + 1}")
    pages: list[list[str]] = []
    cursor = ""
    for _ in range(10):
        page = await list_messages(r, keys, limit=3, cursor=cursor)
        pages.append([m.msg_id for m in page.messages])
        cursor = page.next
        if not cursor:
            break
    assert [len(p) for p in pages if p] == [3, 3, 1], pages
    assert [m for p in pages for m in p] == sent[::-1]  # newest first, each once


async def test_running_and_pending_messages_come_from_the_inboxes(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    keys = Keys(ns)
    gate = Gate()
    app = reach.Agent("hold-r1", capabilities=["rec.hold"])

    @app.handler("rec.hold")
    async def hold(payload: Any, ctx: reach.Context) -> Any:
        await gate.hold()
        return "done"

    async with serving(redis_url, ns, app, concurrency=1) as client:
        running = await client.send("rec.hold", 1)
        with anyio.fail_after(15):
            await gate.entered.wait()
        queued = await client.send("rec.hold", 2)
        await wait_status(client, running, "running")

        async def listed() -> Any:
            page = await list_messages(r, keys, agent_ids=["hold-r1"])
            got = {m.msg_id: m.status for m in page.messages}
            return got if len(got) == 2 else None

        got = await wait_until(listed, what="both messages listed")
        assert got == {running: "running", queued: "pending"}
        page = await list_messages(r, keys, Filters(status="running"), agent_ids=["hold-r1"])
        assert [m.msg_id for m in page.messages] == [running]
        gate.open()
        await wait_status(client, queued, "succeeded")


async def test_the_index_stays_bounded(redis_url: str, ns: str, r: AnyRedis) -> None:
    keys = Keys(ns)
    async with serving(redis_url, ns, echo(), recent_maxlen=5) as client:
        for i in range(300):
            await client.request("rec.echo", i, timeout_s=15)
    # MAXLEN ~ trims whole macro nodes (100 entries by default): about 5, at most ~100.
    assert 0 < await r.xlen(keys.recent) <= 101


async def test_no_index_is_written_with_a_bound_of_zero(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, echo(), recent_maxlen=0) as client:
        await client.request("rec.echo", 1, timeout_s=15)
    assert await r.exists(Keys(ns).recent) == 0


@pytest.mark.cluster
async def test_the_index_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    url = redis_cluster.url
    r = await connect(url)
    try:
        async with serving(url, ns, echo()) as client:
            await client.request("rec.echo", 1, timeout_s=15)

            async def listed() -> Any:
                page = await list_messages(r, Keys(ns))
                return page if page.messages else None

            page = await wait_until(listed, what="the message listed")
    finally:
        await r.aclose()
    assert [(m.capability, m.status) for m in page.messages] == [("rec.echo", "succeeded")]


async def test_lone_messages_share_index_entries(redis_url: str, ns: str, r: AnyRedis) -> None:
    keys = Keys(ns)
    async with serving(redis_url, ns, echo()) as client:
        ids = []
        for i in range(30):  # one at a time: each settled in a batch of its own
            env = client.build("rec.echo", i, timeout_s=15)
            await client.call(env)
            ids.append(env.msg_id)

        async def all_listed() -> Any:
            page = await list_messages(r, keys, limit=100)
            return page if len(page.messages) == 30 else None

        page = await wait_until(all_listed, what="30 messages listed")
    assert [m.msg_id for m in page.messages] == ids[::-1]
    assert await r.xlen(keys.recent) < 30  # held rows rode along with later settle calls

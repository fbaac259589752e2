"""The control plane apart from the data plane (issue 32, item 2): a namespace's registry,
events, limits, quotas and audit on one Redis (``registry_url``), its inboxes, records,
replies and sessions on another, here the 3-master test Cluster.

* each plane's keys are found on their own Redis only (standalone and Cluster data);
* a ``reach worker`` process SIGKILLed mid-handler and restarted: its messages are done
  again, each side effect once;
* the registry Redis restarted having lost everything: the worker registers again, the
  caller routes again, nothing sent is lost.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
import redis

import reach
from reach import Agent, Context
from reach._worker.liveness import Heartbeats
from reach.audit import operator_action
from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.keys import CONTROL, DATA, GROUP, Keys
from reach.limits import parse_limit, set_limit
from reach.quotas import set_quotas
from reach.registry import Registry
from reach.web.app import create_app
from reach.web.security import Guard, loopback_hosts
from tests.integration.test_gateway_identity import (
    test_a_caller_over_its_rate_gets_429_while_another_is_served as over_rate_gets_429,
)
from tests.support.agents_messaging import (
    REPO,
    bump,
    effects,
    serving,
    wait_eligible,
    wait_status,
    worker_cmd,
)
from tests.support.cluster import RedisTestCluster
from tests.support.planes import assert_apart, planes_on
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

CRASH = "crash-1"
WEB = "http://127.0.0.1:8090"


@pytest.fixture
async def rc(redis_cluster: RedisTestCluster) -> AsyncIterator[AnyRedis]:
    client = await connect(redis_cluster.url)
    yield client
    await client.aclose()


def echo_agent(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=["pl.echo"])

    @app.handler("pl.echo", audited=True)
    async def echo(payload: Any, ctx: Context) -> Any:
        await bump(ctx, "echo")
        if ctx.session_id:
            await ctx.session.set("seen", payload)
        return payload

    return app


# Short leases: the heartbeat thread sends each round on its own connections; long ones:
# the agents' event loop sends it on the process's clients. Both must renew on the registry.
LEASES = {"thread": {}, "loop": {"lease_s": 4.0, "evict_after_s": 8.0}}


@pytest.mark.parametrize("sender", sorted(LEASES))
async def test_each_planes_keys_are_on_their_own_redis_only(
    redis_url: str, split_planes: str, ns: str, sender: str
) -> None:
    async with serving(redis_url, ns, echo_agent("pl-1"), **LEASES[sender]) as c:
        assert await c.request("pl.echo", 1, session_id="s1") == 1
        sent = await c.send("pl.echo", 2)
        await wait_status(c, sent, "succeeded")
        await c.cancel(sent)  # an operator action: its audit entry on the control plane
        with pytest.raises(reach.NoAgentAvailable):
            await c.send("pl.none", 3)
        control = await connect(split_planes)
        try:
            await set_limit(control, Keys(ns), "pl.echo", parse_limit("1000/1"))
            await set_quotas(control, Keys(ns), max_inbox=1000)
            async with operator_action(control, Keys(ns), "test.action", target="x"):
                pass
        finally:
            await control.aclose()
        assert await c.request("pl.echo", 4) == 4
        # Heartbeats renew the lease on the registry's Redis: ten rounds later the agent
        # was registered once (a heartbeat sent to the data Redis would find no
        # registration there and register again at every round).
        hub = Heartbeats._hubs[f"{redis_url} {split_planes}"]  # this process's, for both
        start = hub.rounds

        async def ten_rounds() -> bool:
            return hub.rounds >= start + 10

        await wait_until(ten_rounds, timeout_s=30, what="ten heartbeat rounds")
        events = await c.registry.recent_events(100)
        assert [e.type for e in events if e.agent_id == "pl-1"].count("registered") == 1
        on_registry = planes_on(split_planes, ns)  # while the agent serves
        on_data = planes_on(redis_url, ns)
    assert_apart(redis_url, split_planes, ns)
    k = Keys(ns)
    assert {k.agents, k.events, k.limits, k.quotas, k.audit} <= on_registry[CONTROL]
    assert {k.session("s1"), *k.inboxes("pl-1")[1:2]} <= on_data[DATA]


async def test_a_cluster_data_plane_survives_a_worker_sigkill_and_a_registry_restart(
    redis_cluster: RedisTestCluster, rc: AnyRedis, fresh_redis: RedisServer, ns: str
) -> None:
    registry_url = fresh_redis.url  # restartable, with its AOF
    env = {
        **os.environ,
        "REACH_TEST_AGENT_ID": CRASH,
        "REACH_TEST_SLEEP_S": "60",
        "REACH_REGISTRY_URL": registry_url,
    }
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        cmd = worker_cmd("crash_agent", redis_cluster.url, ns, "--concurrency", "4")
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL)
        procs.append(p)
        return p

    async def pending() -> int:
        total = 0
        for key in Keys(ns).inboxes(CRASH):
            if await rc.exists(key):
                total += int((await rc.xpending(key, GROUP))["pending"])
        return total

    try:
        first = start()
        async with Client(
            redis_url=redis_cluster.url, registry_url=registry_url, namespace=ns, slow_start_s=0
        ) as c:
            assert c.registry.shards == 1  # the registry's own Redis is a standalone one
            await wait_eligible(c, "test.crash", [CRASH], timeout=30)
            old = (await c.registry.get(CRASH)).instance_id  # type: ignore[union-attr]
            waited = c.build("test.crash", {"n": 0}, timeout_s=60)
            sent = [await c.send("test.crash", {"n": i}) for i in (1, 2)]
            ids = [waited.msg_id, *sent]
            result: dict[str, Any] = {}

            async def call() -> None:
                result["waited"] = await c.call(waited)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)

                async def all_started() -> bool:
                    return len(await effects(rc, ns, "crash.started")) == 3

                await wait_until(all_started, timeout_s=30, what="3 handlers started")
                first.send_signal(signal.SIGKILL)  # mid-handler: every effect still to do
                await anyio.to_thread.run_sync(first.wait)
                assert await effects(rc, ns, "crash") == {}
                assert await pending() == 3, "the killed worker's entries stay"
                env["REACH_TEST_SLEEP_S"] = "0"  # the new instance's first runs: no wait
                start()  # same agent id, new instance
                await wait_eligible(c, "test.crash", [CRASH], instance_of={CRASH: old}, timeout=30)
                for msg_id in sent:
                    st = await wait_status(c, msg_id, "succeeded", timeout=30)
                    assert st.runs == 2 and st.agent_id == CRASH
            assert result["waited"]["effects"] == 1

            # The registry Redis loses everything and restarts (SIGKILL, from its AOF).
            sync = redis.Redis.from_url(registry_url)
            sync.flushall()
            sync.close()
            fresh_redis.restart()
            reg = Registry(await connect(registry_url), ns)
            try:

                async def registered_again() -> bool:
                    a = await reg.get(CRASH)
                    return a is not None and a.ready and a.state == "active"

                await wait_until(registered_again, timeout_s=30, what="the agent re-registered")
            finally:
                await reg.redis.aclose()

            async def routes_again() -> bool:
                c.invalidate()
                try:
                    return bool(await c.request("test.crash", {"n": 9}, timeout_s=5))
                except reach.ReachError:
                    return False

            await wait_until(routes_again, timeout_s=30, what="the caller routes again")
            after = await c.send("test.crash", {"n": 10})
            await wait_status(c, after, "succeeded", timeout=30)
            ids.append(after)

            async def settled() -> bool:
                return await pending() == 0

            await wait_until(settled, what="nothing pending")
        done = await effects(rc, ns, "crash")
        assert {i: done[i] for i in ids} == {i: 1 for i in ids}  # nothing lost, once each
        assert_apart(redis_cluster.url, registry_url, ns)
        assert planes_on(registry_url, ns).get(CONTROL), "the registry is on its own Redis"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


async def test_an_evicted_agents_inbox_on_the_cluster_is_moved_by_a_sweeper_reading_the_registry(
    redis_cluster: RedisTestCluster, rc: AnyRedis, registry_server: RedisServer, ns: str
) -> None:
    """The sweeper finds the evicted agent in the registry's reroute set (control plane)
    and moves its inbox entries on the Cluster (data plane) to a live agent."""
    apart = ("--registry-url", registry_server.url)
    workers = Workers(redis_cluster.url, ns, "tests.support.agents_hardening")
    try:
        workers.start("h1", *apart)
        workers.start("h2", *apart, "--lease-s", "2", "--evict-after-s", "4")
        async with Client(
            redis_url=redis_cluster.url,
            registry_url=registry_server.url,
            namespace=ns,
            slow_start_s=0,
        ) as c:
            await wait_eligible(c, "hard.echo", ["h1", "h2"], timeout=30)
            workers.procs["h2"].send_signal(signal.SIGSTOP)  # it must not handle them
            ids = [await c.send("hard.echo", {"i": i}, target="h2") for i in range(5)]
            workers.procs["h2"].send_signal(signal.SIGKILL)
            for msg_id in ids:
                st = await wait_status(c, msg_id, "succeeded", timeout=30)
                assert st.agent_id == "h1"

            async def dropped() -> bool:
                return not await rc.exists(*Keys(ns).inboxes("h2"))

            await wait_until(dropped, timeout_s=30, what="the evicted agent's inbox dropped")
        done = await effects(rc, ns, "hard")
        assert {i: done[i] for i in ids} == {i: 1 for i in ids}
        assert_apart(redis_cluster.url, registry_server.url, ns)
    finally:
        workers.stop_all()


async def test_a_registry_outage_is_a_typed_error_and_traffic_resumes_after_it(
    redis_url: str, fresh_redis: RedisServer, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry Redis away: callers route from their view while it is fresh, then a
    call fails with a reach error (the outage buffer's), never a bare redis-py one; back
    (empty, restarted), the agent registers again and calls are answered."""
    monkeypatch.setenv("REACH_REGISTRY_URL", fresh_redis.url)
    async with serving(redis_url, ns, echo_agent("pl-2")) as c:
        assert await c.request("pl.echo", 1) == 1
        async with Client(redis_url=redis_url, namespace=ns, max_staleness_s=0.2) as caller:
            assert await caller.request("pl.echo", 2) == 2
            fresh_redis.kill()
            with pytest.raises(reach.ReachError):
                with anyio.fail_after(30):
                    while True:  # answered from the view until it is stale
                        await caller.request("pl.echo", 3, timeout_s=1)
            fresh_redis.start()  # from its AOF

            async def answered() -> bool:
                caller.invalidate()
                try:
                    return await caller.request("pl.echo", 4, timeout_s=2) == 4
                except reach.ReachError:
                    return False

            await wait_until(answered, timeout_s=30, what="calls answered again")
        assert (await c.registry.get("pl-2")) is not None  # registered again
    assert_apart(redis_url, fresh_redis.url, ns)


async def test_the_gateways_per_caller_buckets_are_on_the_control_plane(
    redis_url: str, split_planes: str, ns: str
) -> None:
    """The gateway's ``--rate-per-caller`` test, its Client given the split by the
    environment: the callers' buckets land on the registry's Redis."""
    await over_rate_gets_429(redis_url, ns)
    control = planes_on(split_planes, ns).get(CONTROL, set())
    assert any(":{h:gateway/" in k for k in control), control
    assert_apart(redis_url, split_planes, ns)


async def test_the_console_reads_each_plane_from_its_own_redis(
    redis_url: str, registry_server: RedisServer, ns: str
) -> None:
    """``reach web`` with the control plane apart: the agents (registry) come from one Redis,
    their inbox depths from the other; a drain and its audit entry go to the registry's."""
    data, control = await connect(redis_url), await connect(registry_server.url)
    try:
        reg = Registry(control, ns)
        _, instance, _ = await register(reg, "sum-1", ["text.summarize"])
        await reg.mark_ready("sum-1", instance_id=instance)
        await data.xadd(Keys(ns).inbox("sum-1", "normal"), {"e": b"x"})
        guard = Guard(token=None, allowed_hosts=loopback_hosts("127.0.0.1"))
        app = create_app(data, ns, guard, interval_s=0.1, control=control)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=WEB) as h,
        ):

            async def shown() -> Any:
                frame = (await h.get("/api/frame")).json()["frame"]
                rows = [a for a in frame["agents"] if a["agent_id"] == "sum-1"]
                return rows and sum(rows[0]["queue"].values()) == 1 and rows[0]

            await wait_until(shown, timeout_s=30, what="the agent and its inbox depth shown")
            page = await h.get("/agents/drain", params={"id": "sum-1"})
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
            assert csrf, page.text
            res = await h.post("/agents/drain", data={"id": "sum-1", "csrf": csrf.group(1)})
            assert res.status_code == 303
            info = await reg.get("sum-1")
            assert info is not None and info.draining
            assert "agents.drain" in (await h.get("/audit")).text
        assert_apart(redis_url, registry_server.url, ns)
    finally:
        await data.aclose()
        await control.aclose()

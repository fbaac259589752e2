"""The integration tests that matter on a Redis Cluster, on the 3-master test cluster
(issue 12, item 5): real `reach worker` processes with sub-second leases, inboxes, the
registry and reply streams on different masters.

* a worker SIGKILLed mid-handler and restarted: its pending messages are done again, each
  side effect once, every caller answered;
* an evicted agent's inbox is rerouted to a live agent on another master;
* retries (through the namespace's delayed set) and dead letters (rejected, max attempts);
* the CLI (`reach agents`, `reach queues`, `reach dlq list`) against the cluster URL;
* a master failover (SIGKILL of a master with a replica): the replica is promoted and the
  workers and the client go on serving.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from redis.crc import key_slot

import reach
from reach import Agent, Context
from reach.client import Client
from reach.connection import AnyRedis, connect, connect_sync, is_cluster
from reach.keys import GROUP, Keys
from reach.tasks import parse_dead_letter
from tests.support.agents_messaging import (
    REPO,
    bump,
    effects,
    serving,
    wait_eligible,
    wait_status,
    worker_cmd,
)
from tests.support.cluster import (
    RedisTestCluster,
    RedisTestClusterWithReplicas,
    master_of_slot,
)
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = [pytest.mark.cluster, pytest.mark.anyio]

MASTERS = 3


def inbox_master(agent_id: str) -> int:
    return master_of_slot(key_slot(Keys("x").inbox(agent_id, "normal").encode()), MASTERS)


def registry_master(ns: str) -> int:
    return master_of_slot(key_slot(Keys(ns).agents.encode()), MASTERS)


def namespace_on(master: int) -> str:
    """A fresh namespace whose registry slot is on ``master``."""
    base = uuid.uuid4().hex[:8]
    i = 0
    while registry_master(ns := f"cs{base}{i}") != master:
        i += 1
    return ns


@pytest.fixture
async def rc(redis_cluster: RedisTestCluster) -> AsyncIterator[AnyRedis]:
    client = await connect(redis_cluster.url)
    assert is_cluster(client)
    yield client
    await client.aclose()


async def pending(r: AnyRedis, ns: str, agent_id: str) -> int:
    total = 0
    for key in Keys(ns).inboxes(agent_id):
        if await r.exists(key):
            total += int((await r.xpending(key, GROUP))["pending"])
    return total


async def inbox_len(r: AnyRedis, ns: str, agent_id: str) -> int:
    return sum([int(await r.xlen(k)) for k in Keys(ns).inboxes(agent_id)])


# -- a worker killed and restarted -------------------------------------------------------
CRASH = "crash-1"  # its inbox is on master 2


async def test_a_worker_killed_mid_handler_and_restarted_redoes_its_messages_once(
    redis_cluster: RedisTestCluster, rc: AnyRedis
) -> None:
    ns = namespace_on((inbox_master(CRASH) + 1) % MASTERS)  # registry and inbox apart
    env = {**os.environ, "REACH_TEST_AGENT_ID": CRASH, "REACH_TEST_SLEEP_S": "60"}
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        cmd = worker_cmd("crash_agent", redis_cluster.url, ns, "--concurrency", "4")
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL)
        procs.append(p)
        return p

    try:
        first = start()
        async with Client(redis_url=redis_cluster.url, namespace=ns, client_id="crash-c") as c:
            await wait_eligible(c, "test.crash", [CRASH], timeout=30)
            old = (await c.registry.get(CRASH)).instance_id  # type: ignore[union-attr]
            waited = c.build("test.crash", {"n": 0}, timeout_s=45)
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
                first.send_signal(signal.SIGKILL)
                await anyio.to_thread.run_sync(first.wait)
                assert await effects(rc, ns, "crash") == {}
                assert await pending(rc, ns, CRASH) == 3, "the killed worker's entries stay"

                start()  # same agent id, new instance
                await wait_eligible(c, "test.crash", [CRASH], instance_of={CRASH: old}, timeout=30)
                for msg_id in sent:
                    st = await wait_status(c, msg_id, "succeeded", timeout=30)
                    assert st.runs == 2 and st.agent_id == CRASH
            assert result["waited"]["effects"] == 1 and result["waited"]["starts"] == 2

            async def settled() -> bool:
                return await inbox_len(rc, ns, CRASH) == 0 and await pending(rc, ns, CRASH) == 0

            await wait_until(settled, what="inbox empty, nothing pending")
        assert await effects(rc, ns, "crash") == {i: 1 for i in ids}
        assert await effects(rc, ns, "crash.started") == {i: 2 for i in ids}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


# -- an evicted agent's inbox rerouted ---------------------------------------------------
@pytest.fixture
def hard_workers(redis_cluster: RedisTestCluster) -> Iterator[Any]:
    made: list[Workers] = []

    def make(ns: str) -> Workers:
        w = Workers(redis_cluster.url, ns, "tests.support.agents_hardening")
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop_all()


async def test_an_evicted_agents_inbox_is_rerouted_to_an_agent_on_another_master(
    redis_cluster: RedisTestCluster, rc: AnyRedis, hard_workers: Any
) -> None:
    # h1's inbox is on master 0, h2's on master 2, the registry on master 1
    assert inbox_master("h1") != inbox_master("h2")
    ns = namespace_on(({0, 1, 2} - {inbox_master("h1"), inbox_master("h2")}).pop())
    workers: Workers = hard_workers(ns)
    workers.start("h1")
    # h2 is stopped while the test sends it 5 messages: with FAST's 0.3 s lease a loaded
    # machine let it go to probation before they were all sent (NoAgentAvailable for the
    # target); a 2 s lease keeps it a valid target that long, then it is evicted as before
    workers.start("h2", "--lease-s", "2", "--evict-after-s", "4")
    async with Client(redis_url=redis_cluster.url, namespace=ns, slow_start_s=0) as c:
        await wait_eligible(c, "hard.echo", ["h1", "h2"], timeout=30)
        workers.procs["h2"].send_signal(signal.SIGSTOP)  # it must not handle them
        ids = [await c.send("hard.echo", {"i": i}, target="h2") for i in range(5)]
        assert await inbox_len(rc, ns, "h2") == 5
        workers.procs["h2"].send_signal(signal.SIGKILL)
        for msg_id in ids:
            st = await wait_status(c, msg_id, "succeeded", timeout=30)
            assert st.agent_id == "h1"

        async def dropped() -> bool:
            return not await rc.exists(*Keys(ns).inboxes("h2"))

        await wait_until(dropped, timeout_s=30, what="inbox of the evicted agent dropped")
        assert (await c.request("hard.echo", "after", timeout_s=20))["agent"] == "h1"
    done = await effects(rc, ns, "hard")
    assert {i: done[i] for i in ids} == {i: 1 for i in ids}
    assert workers.procs["h1"].poll() is None


# -- retries, dead letters and the CLI ---------------------------------------------------
def retrying_agent(agent_id: str) -> Agent:
    app = Agent(agent_id, capabilities=["cs.flaky", "cs.refuse", "cs.busy"])

    @app.handler("cs.flaky")
    async def flaky(payload: Any, ctx: Context) -> int:
        if await bump(ctx, "flaky") < 3:
            raise RuntimeError("fails twice")
        return ctx.attempt

    @app.handler("cs.refuse")
    async def refuse(payload: Any, ctx: Context) -> None:
        raise reach.Reject(f"refused {payload}")

    @app.handler("cs.busy")
    async def busy(payload: Any, ctx: Context) -> None:
        raise reach.Retry(f"still busy (attempt {ctx.attempt})", delay_s=0.05)

    return app


async def cli(url: str, ns: str, *args: str) -> Any:
    """``reach <args> --json`` as a real process against the cluster URL."""
    cmd = [
        sys.executable,
        "-m",
        "reach_cli.app",
        *args,
        "--redis-url",
        url,
        "--namespace",
        ns,
        "--json",
    ]
    with anyio.fail_after(60):
        out = await anyio.run_process(cmd, cwd=REPO, check=False)
    assert out.returncode == 0, (args, out.stderr.decode())
    return json.loads(out.stdout)


async def test_retries_dead_letters_and_the_cli_on_a_cluster(
    redis_cluster: RedisTestCluster, rc: AnyRedis
) -> None:
    url = redis_cluster.url
    ns = namespace_on(1)
    agents = [retrying_agent("cs-a"), retrying_agent("cs-b")]
    async with serving(url, ns, *agents) as c:
        # a failure retried twice through the delayed set, then a success
        flaky = c.build("cs.flaky", None, timeout_s=20)
        assert await c.call(flaky) == 3
        # a rejection: dead at once; a Retry every time: dead after max_attempts
        with pytest.raises(reach.Rejected, match="refused x"):
            await c.request("cs.refuse", "x", timeout_s=20)
        busy = c.build("cs.busy", None, timeout_s=20, max_attempts=3)
        with pytest.raises(reach.RemoteError) as ei:
            await c.call(busy)
        assert ei.value.type == "Retry"
        st = await wait_status(c, busy.msg_id, "dead")
        assert st.runs == 3
        [dl] = [parse_dead_letter(i, f) for i, f in await rc.xrange(Keys(ns).dlq("cs.busy"))]
        assert (dl.reason, dl.attempts, dl.msg_id) == ("max_attempts", 3, busy.msg_id)

        out: dict[str, Any] = {}

        async def run(name: str, *args: str) -> None:
            out[name] = await cli(url, ns, *args)

        async with anyio.create_task_group() as tg:  # three processes at once
            tg.start_soon(run, "agents", "agents")
            tg.start_soon(run, "queues", "queues")
            tg.start_soon(run, "dlq", "dlq", "list")
        listed, queues, letters = out["agents"], out["queues"], out["dlq"]
        assert sorted(a["agent_id"] for a in listed) == ["cs-a", "cs-b"]
        assert all(a["state"] == "active" and a["ready"] for a in listed)
        assert sorted(q["agent_id"] for q in queues) == ["cs-a", "cs-b"]  # inboxes on 2 masters
        assert all(q["pending"] == 0 for q in queues)
        assert sorted((d["capability"], d["reason"]) for d in letters) == [
            ("cs.busy", "max_attempts"),
            ("cs.refuse", "rejected"),
        ]
    assert await effects(rc, ns, "flaky") == {flaky.msg_id: 3}  # three runs, one message


# -- a master failover -------------------------------------------------------------------
def logs(where: Path) -> str:
    return "\n".join(
        f"--- {p.name} ---\n{p.read_text(errors='replace')}" for p in where.glob("*.log")
    )


def replicated(port: int, master: int) -> None:
    """Wait until the replica of master ``master`` (on ``port``) has all it was sent: one
    write of this connection, then ``WAIT 1`` (the replication stream is ordered)."""
    key = next(
        k
        for i in range(100_000)
        if master_of_slot(key_slot((k := f"cs-fence-{i}").encode()), MASTERS) == master
    )
    node = redis.Redis(port=port)
    try:
        node.set(key, 1)
        assert node.execute_command("WAIT", 1, 5000) == 1, "the replica did not acknowledge"
    finally:
        node.close()


@pytest.fixture
def cluster_with_replicas(server_binary: Any) -> Iterator[RedisTestClusterWithReplicas]:
    with RedisTestClusterWithReplicas(binary=server_binary, masters=MASTERS) as cluster:
        yield cluster


@pytest.mark.parametrize("hit", ["h3", "h1"], ids=["another-master", "the-url-master"])
async def test_a_master_failover_keeps_workers_and_client_serving(
    cluster_with_replicas: RedisTestClusterWithReplicas, hit: str, tmp_path: Path
) -> None:
    cluster = cluster_with_replicas
    url = cluster.url  # master 0
    victim = inbox_master(hit)  # h3: master 1; h1: master 0, the URL's node
    ns = namespace_on(victim)  # the registry dies with the inbox
    workers = Workers(url, ns, "tests.support.agents_hardening")
    try:
        for n in ("h1", "h3"):
            workers.start(n, log=tmp_path / f"{n}.log")
        async with Client(redis_url=url, namespace=ns, slow_start_s=0) as c:
            await wait_eligible(c, "hard.echo", ["h1", "h3"], timeout=30)
            for n in ("h1", "h3"):
                assert (await c.request("hard.echo", n, target=n, timeout_s=10))["agent"] == n

            # Three requests in flight on h3 (handlers sleeping) when its master dies: a
            # write made after theirs, acknowledged by the replica (WAIT), says the replica
            # has what the master had (replication is asynchronous: without it the test
            # would be about luck).
            slow = [
                c.build("hard.slow", {"sleep_s": 1.5}, target=hit, timeout_s=40) for _ in range(3)
            ]
            answers: dict[str, Any] = {}

            async def call(env: Any) -> None:
                answers[env.msg_id] = await c.call(env)

            async with anyio.create_task_group() as tg:
                for env in slow:
                    tg.start_soon(call, env)
                for env in slow:
                    await wait_status(c, env.msg_id, "running", timeout=20)
                await anyio.to_thread.run_sync(replicated, cluster.masters[victim].port, victim)
                await anyio.to_thread.run_sync(cluster.masters[victim].kill)  # SIGKILL
                replica = redis.Redis(port=cluster.replicas[victim].port)
                try:

                    async def promoted() -> bool:
                        info = await anyio.to_thread.run_sync(lambda: replica.info("replication"))
                        return bool(info["role"] == "master")

                    await wait_until(promoted, timeout_s=20, what="replica promoted")
                finally:
                    replica.close()
            assert sorted(answers) == sorted(env.msg_id for env in slow)
            for env in slow:
                assert (await c.task(env.msg_id)).status == "succeeded"

            async def answered(n: str) -> Any:
                try:
                    return await c.request("hard.echo", f"after-{n}", target=n, timeout_s=3)
                except reach.ReachError:
                    c.invalidate()
                    return None

            for n in ("h1", "h3"):
                out = await wait_until(
                    lambda n=n: answered(n), timeout_s=30, what=f"{n} answers after failover"
                )
                assert out["agent"] == n
        # New clients made from the URL find the cluster, its node dead or not (this
        # process made cluster clients from the URL before: it remembers the nodes).
        fresh = await connect(url)
        try:
            assert is_cluster(fresh) and int(await fresh.xlen(Keys(ns).inbox(hit, "normal"))) >= 0
        finally:
            await fresh.aclose()
        fresh_sync = connect_sync(url)
        try:
            assert is_cluster(fresh_sync) and fresh_sync.ping()
        finally:
            fresh_sync.close()
        for n in ("h1", "h3"):
            assert workers.procs[n].poll() is None, f"worker {n} died in the failover"
    finally:
        workers.stop_all()
        print(logs(tmp_path))  # shown when the test fails

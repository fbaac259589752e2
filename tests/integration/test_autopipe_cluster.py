"""Auto-pipelining on a Redis Cluster (reach._autopipe, multiplexed per node): each command
goes to the multiplexed connection of the node that holds its slot, so a client holds one
connection per node for its batched commands whatever the concurrency; each caller gets
its own reply or error; NOSCRIPT on one node is reloaded there; a slot that moves (ASK
while it migrates, MOVED once it has) and a master that fails over cost no caller an error
it would not get from redis-py, and no caller hangs. Real servers, counts not timings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import anyio
import pytest
import redis
import redis.asyncio as aredis
from redis import exceptions as rexc
from redis.crc import key_slot

from reach._autopipe import IDLE_RELEASE_S, AutoPipeline
from reach.connection import AnyRedis, connect
from reach.embedded import ServerBinary
from reach.scripts import Call, script
from tests.support.cluster import (
    RedisTestCluster,
    RedisTestClusterWithReplicas,
    as_str,
    master_of_slot,
)

pytestmark = [pytest.mark.cluster, pytest.mark.anyio]


async def named(cluster: RedisTestCluster, name: str) -> list[int]:
    """Connections each master holds now named ``name`` (CLIENT LIST)."""
    out = []
    for n in cluster.nodes:
        node: Any = aredis.Redis(port=n.port)
        try:
            listed = await node.execute_command("CLIENT LIST")
            out.append(len([c for c in listed if c.get("name") == name]))
        finally:
            await node.aclose()
    return out


def key_on(master: int, prefix: str) -> str:
    """A key of ``prefix`` whose slot is on master ``master`` of the test cluster."""
    i = 0
    while master_of_slot(key_slot(f"{prefix}:{i}".encode())) != master:
        i += 1
    return f"{prefix}:{i}"


@pytest.fixture
async def auto(redis_cluster: RedisTestCluster) -> AsyncIterator[AutoPipeline]:
    a = AutoPipeline(await connect(redis_cluster.url, client_name="t-cmux"))
    assert a.multiplexed
    yield a
    await a.aclose()


async def test_thousands_of_commands_over_every_slot_one_connection_per_node(
    redis_cluster: RedisTestCluster, auto: AutoPipeline, ns: str
) -> None:
    n = 6000
    keys = [f"{ns}:v:{i}" for i in range(n)]  # over every master's slots
    assert len({master_of_slot(key_slot(k.encode())) for k in keys}) == 3
    peak = [0, 0, 0]
    stop = False

    async def watch() -> None:
        while not stop:
            peak[:] = [
                max(a, b) for a, b in zip(peak, await named(redis_cluster, "t-cmux"), strict=True)
            ]
            await asyncio.sleep(0.01)

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        assert all(await asyncio.gather(*(auto.set(k, f"value-{i}") for i, k in enumerate(keys))))
        order = list(range(n))
        order.reverse()  # read back in another order of callers: each gets its own
        got = await asyncio.gather(*(auto.get(keys[i]) for i in order))
        assert got == [f"value-{i}".encode() for i in order]
        mixed = await asyncio.gather(
            *(auto.hset(f"{ns}:h:{i}", mapping={"a": i, "b": -i}) for i in range(1000)),
            *(auto.hgetall(f"{ns}:h:{i}") for i in range(1000)),
            *(auto.xadd(f"{ns}:s:{i % 50}", {"f": i}) for i in range(1000)),
            *(auto.xlen(f"{ns}:s:{i}") for i in range(50)),
            auto.xinfo_stream(f"{ns}:s:0"),
            auto.xreadgroup("g", "c", {f"{ns}:nostream": ">"}, count=1),
            return_exceptions=True,
        )
        assert mixed[:1000] == [2] * 1000
        assert mixed[1000:2000] == [
            {b"a": str(i).encode(), b"b": str(-i).encode()} for i in range(1000)
        ]
        assert all(isinstance(x, bytes) for x in mixed[2000:3000])
        assert mixed[3000:3050] == [20] * 50
        assert cast(dict[str, Any], mixed[3050])["length"] == 20
        assert isinstance(mixed[3051], rexc.ResponseError) and "NOGROUP" in str(mixed[3051])
    finally:
        stop = True
        await watcher
    assert peak == [1, 1, 1], peak  # one connection per node, whatever the concurrency
    assert await named(redis_cluster, "t-cmux") == [1, 1, 1]
    assert auto.batches < 20_000 // 50


async def test_errors_and_refusals_stay_in_place(auto: AutoPipeline, ns: str) -> None:
    lists = [key_on(m, f"{ns}:list") for m in range(3)]
    for k in lists:
        await auto.rpush(k, "x")
    calls = []
    for i in range(3000):
        if i % 3 == 0:
            calls.append(auto.get(lists[i % 9 // 3]))  # WRONGTYPE, on every master
        elif i % 7 == 0:
            calls.append(auto.set(f"{ns}:bad:{i}", object()))  # refused before the write
        elif i % 11 == 0:  # keys of two slots: redis-py's refusal (the plain client's)
            calls.append(auto.execute_command("MSET", f"{ns}:a{i}", 1, f"{ns}:b{i}", 2))
        else:
            calls.append(auto.execute_command("INCRBY", f"{ns}:n:{i}", i))
    got = await asyncio.gather(*calls, return_exceptions=True)
    for i, x in enumerate(got):
        if i % 3 == 0:
            assert isinstance(x, rexc.ResponseError) and "WRONGTYPE" in str(x), (i, x)
        elif i % 7 == 0:
            assert isinstance(x, rexc.DataError), (i, x)
        elif i % 11 == 0:
            assert isinstance(x, rexc.RedisClusterException), (i, x)
        else:
            assert x == i, (i, x)


async def test_noscript_after_a_flush_on_one_node_is_reloaded_there(
    redis_cluster: RedisTestCluster, auto: AutoPipeline, ns: str
) -> None:
    tags = [key_on(m, f"{ns}:t") for m in range(3)]
    calls = [Call("drop_inbox", (f"{{{t}}}:a", f"{{{t}}}:b", f"{{{t}}}:c"), (), int) for t in tags]
    assert len(set(await asyncio.gather(*(c.run(auto) for c in calls)))) == 1
    flushed = redis.Redis(port=redis_cluster.nodes[1].port)
    try:
        flushed.script_flush()
        got = await asyncio.gather(
            *(calls[i % 3].run(auto) for i in range(900)),
            *(auto.execute_command("INCRBY", f"{ns}:n:{i}", 1) for i in range(900)),
        )
        assert got[:900] == [got[0]] * 900 and isinstance(got[0], int)
        assert got[900:] == [1] * 900
        assert flushed.script_exists(script("drop_inbox").sha) == [True]
    finally:
        flushed.close()


async def test_commands_without_a_slot_go_through_the_plain_client(auto: AutoPipeline) -> None:
    assert await auto.ping() is True
    with pytest.raises(rexc.RedisClusterException):
        await auto.execute_command("ECHO", "x")  # no key: redis-py refuses it on a Cluster


async def getkeys_calls(cluster: RedisTestCluster) -> int:
    """COMMAND GETKEYS served so far by every master (INFO commandstats)."""
    total = 0
    for n in cluster.nodes:
        node: Any = aredis.Redis(port=n.port)
        try:
            stats = await node.info("commandstats")
            total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
        finally:
            await node.aclose()
    return total


async def test_blocking_reads_go_straight_to_their_node(
    redis_cluster: RedisTestCluster, auto: AutoPipeline, ns: str
) -> None:
    streams = [key_on(m, f"{ns}:bs") for m in range(3)]
    for k in streams:
        await auto.xgroup_create(k, "g", id="0", mkstream=True)
    before = await getkeys_calls(redis_cluster)
    for k in streams:
        got = await auto.xread({k: "0"}, block=50)
        assert got == []  # empty: waited on the server, then nothing
        await auto.xadd(k, {"f": k})
        got = await auto.xread({k: "0"}, block=1000)
        assert got[0][0] == k.encode() and got[0][1][0][1] == {b"f": k.encode()}
        got = await auto.xreadgroup("g", "c", {k: ">"}, count=5, block=1000)
        assert got[0][1][0][1] == {b"f": k.encode()}
    # redis-py would have asked a node for the keys of each (a movable-keys command)
    assert await getkeys_calls(redis_cluster) == before
    with pytest.raises(rexc.ResponseError, match="NOGROUP"):
        await auto.xreadgroup("nogroup", "c", {streams[0]: ">"}, block=10)


# -- a slot that moves -----------------------------------------------------------------------
@pytest.fixture
def own_cluster(server_binary: ServerBinary) -> Iterator[RedisTestCluster]:
    """A cluster of the test's own: it moves slots."""
    with RedisTestCluster(binary=server_binary, masters=3) as cluster:
        yield cluster


def node_ids(cluster: RedisTestCluster) -> list[str]:
    out = []
    for n in cluster.nodes:
        c: Any = redis.Redis(port=n.port)
        try:
            out.append(as_str(c.execute_command("CLUSTER", "MYID")))
        finally:
            c.close()
    return out


class SlotMove:
    """Moves ``slot`` from master ``src`` to master ``dst`` as redis-cli --cluster reshard
    does: IMPORTING / MIGRATING, MIGRATE the keys, then SETSLOT NODE on every master."""

    def __init__(self, cluster: RedisTestCluster, slot: int, src: int, dst: int) -> None:
        self.cluster, self.slot, self.src, self.dst = cluster, slot, src, dst
        self.ids = node_ids(cluster)
        self.clients: list[Any] = [redis.Redis(port=n.port) for n in cluster.nodes]

    def start(self) -> None:
        s, d = self.clients[self.src], self.clients[self.dst]
        d.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.ids[self.src])
        s.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.ids[self.dst])

    def migrate(self, keys: list[str]) -> None:
        port = self.cluster.nodes[self.dst].port
        self.clients[self.src].execute_command(
            "MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys
        )

    def finish(self) -> None:
        """Whatever the slot still holds on the source goes too (as redis-cli does:
        GETKEYSINSLOT until empty), then the slot is the destination's: told to it first,
        then to the source, then to the others (the order the Redis docs give)."""
        src = self.clients[self.src]
        while left := src.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 100):
            self.migrate([as_str(k) for k in left])
        order = [
            self.dst,
            self.src,
            *(i for i in range(len(self.clients)) if i not in (self.src, self.dst)),
        ]
        for i in order:
            self.clients[i].execute_command(
                "CLUSTER", "SETSLOT", self.slot, "NODE", self.ids[self.dst]
            )

    def close(self) -> None:
        for c in self.clients:
            c.close()


async def test_a_resharded_slot_ask_then_moved_costs_no_caller_an_error(
    own_cluster: RedisTestCluster, ns: str
) -> None:
    auto = AutoPipeline(await connect(own_cluster.url, client_name="t-move"))
    tag = f"{{{key_on(0, ns)}}}"  # every key below in one slot of master 0
    slot = key_slot(tag[1:-1].encode())
    keys = [f"{tag}:{i}" for i in range(400)]
    others = [f"{ns}:o:{i}" for i in range(600)]  # every master, not moving
    move = SlotMove(own_cluster, slot, src=0, dst=2)
    try:
        await asyncio.gather(*(auto.set(k, f"v{i}") for i, k in enumerate(keys + others)))
        move.start()
        move.migrate(keys[:200])  # half on master 2 now: those answer ASK on master 0
        got = await asyncio.gather(*(auto.get(k) for k in keys + others))
        assert got == [f"v{i}".encode() for i in range(1000)]
        assert auto._router is not None
        assert auto._router.followed["AskError"] == 200, auto._router.followed
        move.migrate(keys[200:])
        move.finish()  # master 0 answers MOVED for the slot now
        got = await asyncio.gather(
            *(auto.execute_command("INCRBY", f"{tag}:n:{i % 10}", 1) for i in range(300)),
            *(auto.get(k) for k in keys + others),
        )
        assert sorted(got[:300]) == sorted(list(range(1, 31)) * 10)
        assert got[300:] == [f"v{i}".encode() for i in range(1000)]
        node = auto.redis.get_node_from_key(keys[0])  # type: ignore[attr-defined]
        assert node.port == own_cluster.nodes[2].port  # the client's map knows the move
        assert auto._router.followed["MovedError"] > 0
        assert await named(own_cluster, "t-move") == [1, 1, 1]
    finally:
        move.close()
        await auto.aclose()


# -- a master failover -----------------------------------------------------------------------
@pytest.fixture
def cluster_with_replicas(server_binary: ServerBinary) -> Iterator[RedisTestClusterWithReplicas]:
    with RedisTestClusterWithReplicas(binary=server_binary, masters=3) as cluster:
        yield cluster


@pytest.mark.parametrize("how", ["sigkill", "cluster-failover"])
async def test_a_master_failover_with_calls_in_flight_every_caller_answered(
    cluster_with_replicas: RedisTestClusterWithReplicas, ns: str, how: str
) -> None:
    """SIGKILL: the node's connection fails with commands written (resent after the map
    is read again, per the retry policy); CLUSTER FAILOVER: the old master, a replica now,
    answers MOVED on the connection still open."""
    cluster = cluster_with_replicas
    client: AnyRedis = await connect(cluster.url, client_name="t-fail")
    auto = AutoPipeline(client)
    router = auto._router
    assert router is not None
    outcomes = {"ok": 0, "error": 0}
    stop = asyncio.Event()
    sent = 0

    async def load(w: int) -> None:
        nonlocal sent
        key = f"{ns}:w:{w}"  # its own key; about a third on the victim
        i = 0
        while not stop.is_set():
            i += 1
            sent += 1
            try:
                got = await auto.set(key, f"{w}:{i}", get=True)
            except (rexc.ConnectionError, rexc.TimeoutError, rexc.ClusterDownError) as e:
                outcomes["error"] += 1
                assert not isinstance(e, rexc.ResponseError) or "CLUSTERDOWN" in str(e)
                await asyncio.sleep(0.01)
            else:
                # Its own key's value before (the replica may have missed the last writes
                # of a killed master: an earlier one), never another caller's reply. j == i
                # is this very SET run twice: written to the master that was killed, its
                # reply lost, resent to the promoted replica, which had already received it
                # (a resent command may run twice, as the module docstring says).
                if got is not None:
                    owner, j = got.decode().split(":")
                    assert owner == str(w) and int(j) <= i, (w, i, got)
                outcomes["ok"] += 1

    try:
        with anyio.fail_after(90):  # no caller may hang
            async with anyio.create_task_group() as tg:
                for w in range(150):
                    tg.start_soon(load, w)
                await asyncio.sleep(0.5)
                assert outcomes["ok"] > 0
                victim = cluster.masters[1]
                mux = next(m for m in router.muxes.values() if m.node.port == victim.port)
                while not mux.inflight:  # killed with commands written, unanswered
                    await asyncio.sleep(0)
                replica = redis.Redis(port=cluster.replicas[1].port)
                if how == "sigkill":
                    await anyio.to_thread.run_sync(victim.kill)  # calls in flight
                else:
                    await anyio.to_thread.run_sync(replica.execute_command, "CLUSTER", "FAILOVER")
                try:
                    with anyio.fail_after(30):
                        while replica.info("replication")["role"] != "master":
                            await asyncio.sleep(0.1)
                finally:
                    replica.close()
                ok_before = outcomes["ok"]
                with anyio.fail_after(30):
                    while outcomes["ok"] < ok_before + 3000:
                        await asyncio.sleep(0.05)
                stop.set()
        followed = router.followed
        print(how, "outcomes", outcomes, "sent", sent, "redirections", followed)
        assert outcomes["ok"] + outcomes["error"] == sent  # every call answered
        if how == "cluster-failover":  # nothing was lost: MOVED, followed
            assert outcomes["error"] == 0 and followed["MovedError"] > 0
        names = [
            len([c for c in aredis_list if c.get("name") == "t-fail"])
            for aredis_list in await _client_lists(
                [
                    *(m.port for m in cluster.masters if m is not cluster.masters[1]),
                    cluster.replicas[1].port,
                ]
            )
        ]
        assert all(1 <= k <= 2 for k in names), names
    finally:
        await auto.aclose()


async def _kill_the_parsers_node(
    cluster: RedisTestClusterWithReplicas, client: Any, ns: str
) -> tuple[str, str]:
    """Kill the master redis-py asks for the keys of an XREAD (its parser's node) and wait
    for its replica's promotion. Returns a stream key on another master (alive all along)
    and a key on the master killed."""
    dead = client.commands_parser.node.port
    victim = next(i for i, m in enumerate(cluster.masters) if m.port == dead)
    other = (victim + 1) % len(cluster.masters)
    stream = key_on(other, f"{ns}:s")
    await client.xadd(stream, {"n": 1})
    await anyio.to_thread.run_sync(cluster.masters[victim].kill)
    replica = redis.Redis(port=cluster.replicas[victim].port)
    try:
        with anyio.fail_after(30):
            while replica.info("replication")["role"] != "master":
                await asyncio.sleep(0.05)
    finally:
        replica.close()
    return stream, key_on(victim, f"{ns}:k")


async def test_an_xread_recovers_when_the_node_asked_for_its_keys_died(
    cluster_with_replicas: RedisTestClusterWithReplicas, ns: str
) -> None:
    """XREAD is the only command: its stream's master never failed, but redis-py asks the
    dead node for its keys before its own retries. The first read fails; it must not keep
    failing (the reply reader of a Client once failed for as long as it was asked)."""
    client: Any = await connect(cluster_with_replicas.url)
    try:
        stream, _ = await _kill_the_parsers_node(cluster_with_replicas, client, ns)
        failures = 0
        with anyio.fail_after(30):
            while True:
                try:
                    got = await client.xread({stream: "0"}, block=50, count=1)
                    break
                except (rexc.ConnectionError, rexc.TimeoutError):
                    failures += 1
                    await asyncio.sleep(0.05)
        assert got and got[0][1], got
        assert failures <= 2, failures
    finally:
        await client.aclose()


async def test_an_xread_after_the_auto_pipeline_reloaded_the_map_asks_a_live_node(
    cluster_with_replicas: RedisTestClusterWithReplicas, ns: str
) -> None:
    """The auto-pipeline reloads the slot map itself after a failure; the keys of the next
    XREAD must then be asked of a node of that map, at the first try."""
    client: Any = await connect(cluster_with_replicas.url)
    auto = AutoPipeline(client)
    try:
        stream, on_victim = await _kill_the_parsers_node(cluster_with_replicas, client, ns)
        with anyio.fail_after(30):
            while True:  # answered once the map names the promoted replica
                try:
                    await auto.set(on_victim, "v")
                    break
                except (rexc.ConnectionError, rexc.TimeoutError, rexc.ClusterDownError):
                    await asyncio.sleep(0.05)
        got = await client.xread({stream: "0"}, block=50, count=1)
        assert got and got[0][1], got
    finally:
        await auto.aclose()


async def _client_lists(ports: list[int]) -> list[list[dict[str, Any]]]:
    out = []
    for port in ports:
        node: Any = aredis.Redis(port=port)
        try:
            out.append(await node.execute_command("CLIENT LIST"))
        finally:
            await node.aclose()
    return out


async def test_callers_cancelled_before_the_write_send_nothing(
    redis_cluster: RedisTestCluster, auto: AutoPipeline, ns: str
) -> None:
    loop = asyncio.get_running_loop()
    keys = [f"{ns}:c:{i}" for i in range(600)]  # every master
    tasks = [loop.create_task(auto.execute_command("INCRBY", k, 1)) for k in keys]
    for t in tasks[::2]:
        t.cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(x, asyncio.CancelledError) for x in done[::2])
    assert done[1::2] == [1] * 300
    got = await asyncio.gather(*(auto.get(k) for k in keys))
    assert got[::2] == [None] * 300 and got[1::2] == [b"1"] * 300


def test_one_auto_pipeline_in_a_second_event_loop_does_not_hang(
    redis_cluster: RedisTestCluster, ns: str
) -> None:
    # As on standalone: a client kept across asyncio.run() calls fails in the next loop;
    # each call there must still get an answer or an error, not wait on the first loop.
    holder: list[AutoPipeline] = []
    keys = [f"{ns}:{i}" for i in range(60)]

    async def first() -> Any:
        holder.append(AutoPipeline(await connect(redis_cluster.url)))
        return await asyncio.gather(*(holder[0].set(k, 1) for k in keys))

    assert asyncio.run(first()) == [True] * 60

    async def second() -> list[Any]:
        return await asyncio.gather(*(holder[0].get(k) for k in keys), return_exceptions=True)

    got = asyncio.run(asyncio.wait_for(second(), 10))
    assert len(got) == 60 and all(x == b"1" or isinstance(x, Exception) for x in got)


async def test_idle_node_connections_go_back_to_the_pool(auto: AutoPipeline, ns: str) -> None:
    assert all(await asyncio.gather(*(auto.set(f"{ns}:i:{i}", i) for i in range(300))))
    router = auto._router
    assert router is not None and len(router.muxes) == 3
    assert all(m.conn is not None for m in router.muxes.values())
    await asyncio.sleep(IDLE_RELEASE_S + 0.5)
    assert all(m.conn is None and m.reader is None for m in router.muxes.values())
    # taken again by the next commands
    assert await asyncio.gather(*(auto.get(f"{ns}:i:{i}") for i in range(300))) == [
        str(i).encode() for i in range(300)
    ]

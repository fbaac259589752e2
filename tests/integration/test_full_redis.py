"""A Redis at ``maxmemory`` (policy ``noeviction``): it refuses writes with
``OutOfMemoryError``, and nothing accepted is lost.

Each test runs a Redis of its own, fills it with a ballast until it refuses a write, then
sets ``maxmemory`` a little under what it uses (so a write that frees a few bytes cannot
slip one through); freeing the ballast gives the room back. Every message in Redis is
counted before, while and after it is full: a move whose write Redis refused leaves the
message where it was, and once memory is freed everything is delivered (real worker
processes) or dead-lettered where it belongs.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
from redis import exceptions as rexc

from reach import Agent, Context, Rejected
from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.envelope import encode
from reach.errors import RedisFull
from reach.keys import GROUP, Keys
from reach.registry import Registry
from reach.scripts import delivery, inbox
from reach.sweeper import move_due, release_parked, reroute_evicted
from reach.tasks import dead_letter_op
from tests.support.agents_messaging import FAST, wait_eligible
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

BALLAST_BYTES = 100_000
MARGIN_BYTES = 1_000_000


@pytest.fixture
def small_redis(server_binary) -> Iterator[RedisServer]:  # type: ignore[no-untyped-def]
    with RedisServer(binary=server_binary, extra_args=("--maxmemory-policy", "noeviction")) as s:
        yield s


@pytest.fixture
async def r(small_redis: RedisServer) -> AsyncIterator[AnyRedis]:
    client = await connect(small_redis.url)
    yield client
    await client.aclose()


class Memory:
    """Fills the test's Redis until it refuses writes, and frees it again."""

    def __init__(self, r: AnyRedis, ns: str) -> None:
        self.r = r
        self.ballast = [f"ballast:{ns}:{i}" for i in range(120)]

    async def fill(self) -> None:
        used = int((await self.r.info("memory"))["used_memory"])
        await self.r.config_set("maxmemory", used + 4 * MARGIN_BYTES)
        for key in self.ballast:
            try:
                await self.r.set(key, b"x" * BALLAST_BYTES)
            except rexc.OutOfMemoryError:
                break
        else:
            raise AssertionError("the ballast did not fill Redis")
        used = int((await self.r.info("memory"))["used_memory"])
        await self.r.config_set("maxmemory", used - MARGIN_BYTES)
        with pytest.raises(rexc.OutOfMemoryError):
            await self.r.set(f"{self.ballast[0]}:probe", b"x")

    async def free(self) -> None:
        await self.r.delete(*self.ballast)
        await self.r.set(f"{self.ballast[0]}:probe", b"x")  # room again
        await self.r.delete(f"{self.ballast[0]}:probe")


async def inbox_entries(r: AnyRedis, keys: Keys, agent_id: str) -> int:
    return sum([int(await r.xlen(k)) for k in keys.inboxes(agent_id)])


async def effects(r: AnyRedis, ns: str) -> dict[str, int]:
    h = await r.hgetall(Keys(ns).effects("rec"))
    return {k.decode(): int(v) for k, v in h.items() if not k.startswith(b"done:")}


@pytest.fixture
def workers(small_redis: RedisServer, ns: str) -> Iterator[Workers]:
    w = Workers(small_redis.url, ns, "tests.support.agents_recovery")
    yield w
    w.stop_all()


async def ready(c: Client, agent_id: str, capability: str = "rec.work") -> None:
    async def up() -> bool:
        got = await Registry(c.redis, c.namespace).agents(capability, ready=True, state="active")
        return agent_id in {a.agent_id for a in got}

    await wait_until(up, timeout_s=30, what=f"{agent_id} ready")
    c.invalidate()


async def test_evicted_inbox_waits_while_redis_is_full_then_all_delivered(
    workers: Workers, small_redis: RedisServer, r: AnyRedis, ns: str
) -> None:
    """The inbox of an evicted agent with no live agent of its capability is parked by the
    sweeper. With Redis full the parking XADD is refused: the inbox entries stay (they
    were acked and deleted anyway, 20 of 20 lost); once memory is freed all 20 run."""
    keys, reg = Keys(ns), Registry(r, ns)
    mem = Memory(r, ns)
    workers.start("w1", "--concurrency", "1")
    async with Client(redis_url=small_redis.url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "rec-1")
        ids = [await c.send("rec.work", {"sleep_s": 3 if i == 0 else 0}) for i in range(20)]
        await wait_until(
            lambda: _status_is(c, ids[0], "running"), timeout_s=20, what="first one running"
        )
        workers.procs["w1"].send_signal(signal.SIGKILL)
        workers.procs["w1"].wait(timeout=10)

        async def evicted() -> bool:
            await reg.sweep(owner="test")
            info = await reg.get("rec-1")
            return info is not None and info.state == "evicted"

        await wait_until(evicted, timeout_s=20, what="rec-1 evicted")
        c.invalidate()
        assert await inbox_entries(r, keys, "rec-1") == 20

        await mem.fill()
        for _ in range(3):
            with contextlib.suppress(rexc.OutOfMemoryError):
                await reroute_evicted(r, keys, c, reg)
            with contextlib.suppress(rexc.OutOfMemoryError):
                await release_parked(r, keys, c)
        parked = int(await r.xlen(keys.parked("rec.work")))
        assert await inbox_entries(r, keys, "rec-1") + parked == 20, "messages lost"
        assert await r.xlen(keys.dlq("rec.work")) == 0

        await mem.free()
        workers.start("w2")  # its sweeper moves the inbox (parked, then released)

        async def all_done() -> bool:
            return all([await _status_is(c, i, "succeeded") for i in ids])

        await wait_until(all_done, timeout_s=60, what="all 20 succeeded")
        assert (await effects(r, ns))["effects"] == 20
        assert await inbox_entries(r, keys, "rec-1") == 0


async def _status_is(c: Client, msg_id: str, status: str) -> bool:
    return (await c.task(msg_id)).status == status


async def test_delayed_and_parked_entries_stay_while_redis_is_full(
    workers: Workers, small_redis: RedisServer, r: AnyRedis, ns: str
) -> None:
    """The delayed set and a parked stream, each with a retry due and bytes that are no
    envelope: with Redis full and no agent, nothing leaves its place (the bytes' dead
    letter was refused and they were removed anyway); once memory is freed, the messages
    run on an agent and the bytes are dead-lettered as malformed."""
    keys = Keys(ns)
    mem = Memory(r, ns)
    async with Client(redis_url=small_redis.url, namespace=ns, slow_start_s=0) as c:
        retry = c.build("rec.work", {"sleep_s": 0}, reply=False)
        parked = c.build("rec.work", {"sleep_s": 0}, reply=False)
        await r.zadd(keys.delayed, {encode(retry): 1, b"\x01not an envelope": 1})
        for data in (encode(parked), b"\x02not an envelope"):
            await r.xadd(keys.parked("rec.work"), {"e": data})
        await r.sadd(keys.parked_caps, "rec.work")

        await mem.fill()
        for _ in range(3):
            with contextlib.suppress(rexc.OutOfMemoryError):
                await move_due(r, keys, c)
            with contextlib.suppress(rexc.OutOfMemoryError):
                await release_parked(r, keys, c)
        assert await r.zcard(keys.delayed) == 2, "delayed entries lost"
        assert await r.xlen(keys.parked("rec.work")) == 2, "parked entries lost"
        assert await r.sismember(keys.parked_caps, "rec.work")

        await mem.free()
        workers.start("w1")

        async def done() -> bool:
            return (
                all([await _status_is(c, e.msg_id, "succeeded") for e in (retry, parked)])
                and int(await r.xlen(keys.dlq("_malformed"))) == 2
            )

        await wait_until(done, timeout_s=60, what="both run, both bytes dead-lettered")
        assert await r.zcard(keys.delayed) == 0
        assert await r.xlen(keys.parked("rec.work")) == 0
        assert (await effects(r, ns))["effects"] == 2


async def test_settling_on_a_cluster_keeps_an_entry_whose_dead_letter_is_refused(
    r: AnyRedis, ns: str
) -> None:
    """The Cluster form of settling (complete.lua, then pipelined writes, then acks) on a
    full Redis: an entry whose dead letter is refused stays in its inbox, pending, and
    its error is reported; once memory is freed, settling it again files the letter and
    acks it."""
    keys = Keys(ns)
    mem = Memory(r, ns)
    stream = keys.inbox("a1", "normal")
    await r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    entry_id = await r.xadd(stream, {"e": b"\x03junk"})
    await r.xreadgroup(GROUP, "c1", {stream: ">"})
    letter = delivery.DeadLetter.of_op(
        dead_letter_op(keys, capability="rec.work", reason="malformed", data=b"\x03junk")
    )
    item = delivery.SettleItem(inbox=stream, entry_id=entry_id, follow_up=letter)

    await mem.fill()
    res = await delivery.settle(r, [item], cluster=True, ttl_ms=60_000)
    assert isinstance(res[0], rexc.OutOfMemoryError)
    assert await r.xlen(stream) == 1, "the entry was deleted without its dead letter"
    assert (await r.xpending(stream, GROUP))["pending"] == 1

    await mem.free()
    assert await delivery.settle(r, [item], cluster=True, ttl_ms=60_000) == [
        delivery.SettleCode.SETTLED
    ]
    assert await r.xlen(stream) == 0
    assert await r.xlen(keys.dlq("rec.work")) == 1


async def test_worker_settles_replies_after_redis_is_full(
    workers: Workers, small_redis: RedisServer, r: AnyRedis, ns: str
) -> None:
    """Messages whose handlers finish while Redis is full: every write of their outcome
    (the side effect, the reply, a retry of the failed attempt) is refused, and nothing is
    acked meanwhile; once memory is freed every caller gets its result and each effect is
    made once."""
    keys = Keys(ns)
    mem = Memory(r, ns)
    workers.start("w1", "--concurrency", "8")
    async with Client(redis_url=small_redis.url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "rec-1")
        ids = [await c.send("rec.work", {"sleep_s": 1.0}, timeout_s=90) for _ in range(6)]

        async def running() -> bool:
            return all([await _status_is(c, i, "running") for i in ids])

        await wait_until(running, timeout_s=20, what="handlers running")
        await mem.fill()
        await anyio.sleep(2.5)  # the handlers finish, Redis refuses what they write
        assert await inbox_entries(r, keys, "rec-1") == 6, "entries acked while full"
        await mem.free()
        with anyio.fail_after(60):
            got = [await c.result(i, timeout_s=60) for i in ids]
        assert got == ["rec-1"] * 6
        assert (await effects(r, ns))["effects"] == 6
        assert await r.xlen(keys.dlq("rec.work")) == 0


async def test_send_and_request_raise_redis_full(
    workers: Workers, small_redis: RedisServer, r: AnyRedis, ns: str
) -> None:
    """A full Redis refuses a new message: send(), request() and send_many() raise (or
    return) reach.RedisFull, which names maxmemory, not a raw redis-py OutOfMemoryError,
    and the CLI shows it as one line; nothing is half-sent, and once memory is freed the
    same calls succeed."""
    keys = Keys(ns)
    mem = Memory(r, ns)
    workers.start("w1")
    async with Client(redis_url=small_redis.url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "rec-1")
        await mem.fill()
        with pytest.raises(RedisFull, match="maxmemory") as sent:
            await c.send("rec.work", {"sleep_s": 0})
        assert isinstance(sent.value.__cause__, rexc.OutOfMemoryError)
        with pytest.raises(RedisFull, match="maxmemory"):
            await c.request("rec.work", {"sleep_s": 0}, timeout_s=10)
        many = await c.send_many("rec.work", [{"sleep_s": 0}] * 3)
        assert [type(x) for x in many] == [RedisFull] * 3
        assert await inbox_entries(r, keys, "rec-1") == 0

        cli = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "reach_cli.app",
                "send",
                "rec.work",
                '{"sleep_s": 0}',
                "--redis-url",
                small_redis.url,
                "--namespace",
                ns,
            ],
            check=False,
        )
        err = cli.stderr.decode()
        assert cli.returncode == 2, err
        assert "maxmemory" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err

        await mem.free()
        assert await c.request("rec.work", {"sleep_s": 0}, timeout_s=30) == "rec-1"


async def test_messages_held_through_an_outage_wait_while_redis_is_full(
    fresh_redis: RedisServer, ns: str
) -> None:
    """Sends a Client accepted into its outage buffer while Redis was away, and Redis
    comes back full: the flush is refused with RedisFull, and the messages stay held (they
    were dropped as failed sends); once memory is freed every one is delivered."""
    seen: list[int] = []
    agent = Agent("held-1", capabilities=["test.held"])

    @agent.handler("test.held")
    async def handle(payload: dict[str, int], ctx: Context) -> int:
        seen.append(payload["i"])
        return payload["i"]

    # Leases long enough for the outage and the full spell: the agent stays routable.
    opts = {**FAST, "heartbeat_s": 1.0, "lease_s": 30.0, "evict_after_s": 60.0}
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: agent.run(redis_url=fresh_redis.url, namespace=ns, **opts))
        async with Client(redis_url=fresh_redis.url, namespace=ns) as c:
            await wait_eligible(c, "test.held", ["held-1"])
            r = c.redis
            ballast = [f"ballast:{ns}:{i}" for i in range(100)]
            for key in ballast:
                await r.set(key, b"x" * BALLAST_BYTES)
            used = int((await r.info("memory"))["used_memory"])
            await anyio.to_thread.run_sync(fresh_redis.kill)
            for i in range(5):
                await c.send("test.held", {"i": i})
            assert len(c.pending_local()) == 5
            # Back with its data (AOF) and a maxmemory it is already over.
            fresh_redis.extra_args = (
                *fresh_redis.extra_args,
                "--maxmemory-policy",
                "noeviction",
                "--maxmemory",
                str(used - 2 * MARGIN_BYTES),
            )
            await anyio.to_thread.run_sync(fresh_redis.start)

            async def refused() -> bool:
                with contextlib.suppress(rexc.RedisError):
                    info = await r.info("stats")
                    return int(info.get("total_error_replies", 0)) > 0
                return False

            await wait_until(refused, timeout_s=20, what="Redis refusing the flush")
            await anyio.sleep(1.0)  # the flusher tries again and again meanwhile
            assert len(c.pending_local()) == 5, "held messages dropped while Redis was full"
            assert seen == []

            await r.delete(*ballast)
            with anyio.fail_after(30):
                while len(seen) < 5:
                    await anyio.sleep(0.02)
            assert sorted(seen) == [0, 1, 2, 3, 4]
            assert c.pending_local() == []
        agent.stop()


async def test_dead_letters_and_retries_of_a_worker_wait_while_redis_is_full(
    small_redis: RedisServer, r: AnyRedis, ns: str
) -> None:
    """Handlers that finish while Redis is full with a rejection (a dead letter and an
    error reply to write) or a failure (a retry to write): nothing is acked and nothing
    is filed while full; once memory is freed each is settled: the rejected ones
    dead-lettered and their callers told, the failed ones retried and answered."""
    keys = Keys(ns)
    mem = Memory(r, ns)
    workers = Workers(small_redis.url, ns, "tests.support.agents_full")
    try:
        # A lease longer than the full spell: the agent stays registered through it (with
        # the tests' 0.3 s lease, the first sweep after the spell evicts it: its
        # heartbeats were refused too; its inbox then moves, and a message can run twice).
        workers.start("w1", "--concurrency", "8", "--lease-s", "10", "--evict-after-s", "20")
        async with Client(redis_url=small_redis.url, namespace=ns, slow_start_s=0) as c:
            await ready(c, "full-1", "full.work")
            modes = ["ok", "reject", "fail_first"] * 2
            results: dict[int, object] = {}

            async def ask(i: int) -> None:
                try:
                    results[i] = await c.request(
                        "full.work", {"sleep_s": 1.0, "mode": modes[i]}, timeout_s=90
                    )
                except Exception as e:  # noqa: BLE001 - checked below
                    results[i] = e

            async with anyio.create_task_group() as tg:
                for i in range(len(modes)):
                    tg.start_soon(ask, i)

                async def read() -> bool:  # every one read by the worker (1 s handlers)
                    stream = keys.inbox("full-1", "normal")
                    return int((await r.xpending(stream, GROUP))["pending"]) == len(modes)

                await wait_until(read, timeout_s=20, what="all read by the worker")
                await mem.fill()
                await anyio.sleep(2.5)  # the handlers end; their outcomes are refused
                assert await inbox_entries(r, keys, "full-1") == len(modes), "acked while full"
                assert await r.xlen(keys.dlq("full.work")) == 0
                assert await r.zcard(keys.delayed) == 0
                assert results == {}
                await mem.free()
        for i, mode in enumerate(modes):
            got = results[i]
            if mode == "reject":
                assert isinstance(got, Rejected), got
            else:
                assert got == ("ok:1" if mode == "ok" else "ok:2"), (mode, got)
        assert await r.xlen(keys.dlq("full.work")) == 2

        async def emptied() -> bool:  # a copy that waited for its busy key replays
            return await inbox_entries(r, keys, "full-1") == 0

        await wait_until(emptied, timeout_s=30, what="every inbox entry settled")
        assert await r.xlen(keys.dlq("full.work")) == 2
    finally:
        workers.stop_all()


async def test_moves_to_a_live_agent_wait_while_redis_is_full(
    workers: Workers, small_redis: RedisServer, r: AnyRedis, ns: str
) -> None:
    """A live agent to place messages on, and Redis full: a retry due in the delayed set,
    a parked message and an evicted agent's inbox entry are each refused at the agent's
    inbox, and each stays where it was; once memory is freed the agent runs all three."""
    keys, reg = Keys(ns), Registry(r, ns)
    mem = Memory(r, ns)
    # Its lease outlasts the test: paused, it stays the live agent the moves pick.
    p = workers.start("w1", "--lease-s", "60", "--evict-after-s", "120")
    async with Client(redis_url=small_redis.url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "rec-1")
        p.send_signal(signal.SIGSTOP)
        try:
            envs = [c.build("rec.work", {"sleep_s": 0}) for _ in range(3)]
            await r.zadd(keys.delayed, {encode(envs[0]): 1})
            await r.xadd(keys.parked("rec.work"), {"e": encode(envs[1])})
            await r.sadd(keys.parked_caps, "rec.work")
            ghost = keys.inbox("ghost-1", "normal")
            await r.xgroup_create(ghost, GROUP, id="0", mkstream=True)
            await r.xadd(ghost, {"e": encode(envs[2])})
            await r.sadd(reg.keys.reroute_of(0), "ghost-1")

            await mem.fill()
            for chore in (
                lambda: move_due(r, keys, c),
                lambda: release_parked(r, keys, c),
                lambda: reroute_evicted(r, keys, c, reg),
            ):
                with pytest.raises(rexc.OutOfMemoryError):
                    await chore()
            assert await r.zcard(keys.delayed) == 1
            assert await r.xlen(keys.parked("rec.work")) == 1
            assert await inbox_entries(r, keys, "ghost-1") == 1
            assert await inbox_entries(r, keys, "rec-1") == 0
            await mem.free()
        finally:
            p.send_signal(signal.SIGCONT)

        async def all_done() -> bool:
            return all([await _status_is(c, e.msg_id, "succeeded") for e in envs])

        await wait_until(all_done, timeout_s=60, what="all three ran")
        assert (await effects(r, ns))["effects"] == 3
        assert await r.zcard(keys.delayed) == 0
        assert await r.xlen(keys.parked("rec.work")) == 0


async def test_a_cli_write_on_a_full_redis_is_one_line_that_says_what_to_do(
    small_redis: RedisServer, r: AnyRedis, ns: str
) -> None:
    """An operator command that writes (reach quota set) on a full Redis: exit code 2
    (an error: docs/cli.md) and one line that names maxmemory and what to do, no traceback."""
    mem = Memory(r, ns)
    await mem.fill()
    cli = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "reach_cli.app",
            "quota",
            "set",
            "--max-inbox",
            "5",
            "--redis-url",
            small_redis.url,
            "--namespace",
            ns,
        ],
        check=False,
    )
    err = cli.stderr.decode()
    assert cli.returncode == 2, err
    assert "out of memory" in err and "raise maxmemory" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


async def test_the_streaming_scripts_write_nothing_while_redis_is_full(
    r: AnyRedis, ns: str
) -> None:
    """send.lua's compact form (its records copied) and settle.lua's plain successes, alone
    and in a run, each begin with a write a full Redis refuses: nothing of them is written
    (a script that has written once is not stopped by a full Redis, so a write it allows,
    an HDEL, must not come first)."""
    k = Keys(ns)
    stream = k.inbox("w-1", "normal")
    await r.xgroup_create(stream, GROUP, id="0", mkstream=True)

    def batch(prefix: str) -> delivery.Call[list[inbox.Sent]]:
        msgs = [
            inbox.Message(b"E", "full.cap", 1, f"{prefix}{i}", f"{prefix}{i}") for i in range(3)
        ]
        return inbox.send_batch_call(
            k, [(m, "normal") for m in msgs], agent_id="w-1", ttl_ms=60_000,
            claim_for="w-1/i1", claim_lease_ms=60_000,
        )  # fmt: skip

    await batch("m").run(r)
    got = await r.xreadgroup(GROUP, "w-1", {stream: ">"})
    entries = [e.decode() for e, _ in got[0][1]]
    records = [k.idem(f"m{i}") for i in range(3)]
    before = [await r.hgetall(rec) for rec in records]
    items = [
        delivery.SettleItem(
            stream,
            entries[i],
            delivery.Completion(records[i], 1, "succeeded", delivery.Mode.DONE, stored=b"S"),
        )
        for i in range(3)
    ]
    run, alone = (
        delivery.settle_call(items[:2], ttl_ms=60_000),
        delivery.settle_call(items[2:], ttl_ms=60_000),
    )
    assert run.args[3] == "*2" and alone.args[3].startswith("+")
    mem = Memory(r, ns)
    await mem.fill()
    try:
        for call in (run, alone, batch("n")):
            with pytest.raises(rexc.OutOfMemoryError):
                await call.run(r)
        assert [await r.hgetall(rec) for rec in records] == before
        assert (await r.xpending(stream, GROUP))["pending"] == 3
        assert await r.xlen(stream) == 3
        assert not await r.exists(*(k.idem(f"n{i}") for i in range(3)))
    finally:
        await mem.free()
    assert await run.run(r) == [delivery.SettleCode.SETTLED] * 2  # room again: settled

"""Session tiers (issue 32, item 3): ``@app.handler(cap, session=...)``.

* every tier keeps a conversation as the strong tier does (read-your-writes in a run);
* ``strong`` writes at once, each write a round trip; ``cached`` and ``best_effort`` hold a
  run's writes and send them in one round trip when the handler returns, before its reply;
* ``cached`` serves a session from the process's copy (no command reaches the session
  Redis) and serves it fresh after another agent's write (a `reach worker` process);
* ``best_effort`` answers with an empty session while its Redis is killed, flagged on the
  context and counted, and its writes made meanwhile do not overwrite the session.

The session store is on a Redis of its own (``session_url``, the ``fresh_redis`` server)
in the tests that count commands or kill it: ``INFO commandstats`` there counts session
traffic only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY

import reach
from reach import Agent, Context, SessionTier
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.keys import Keys
from tests.support.agents_messaging import serving, wait_eligible
from tests.support.cluster import RedisTestCluster
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

TIERS = ["strong", "cached", "best_effort"]


def _chat(tier: str | SessionTier) -> Agent:
    app = Agent("chat-1", capabilities=["t.chat"])

    @app.handler("t.chat", session=tier)
    async def chat(payload: str, ctx: Context) -> dict[str, Any]:
        turns = await ctx.session.get("turns", 0) + 1
        await ctx.session.set("turns", turns)
        await ctx.session.set("last", payload)
        await ctx.session.set("scratch", 1)
        await ctx.session.delete("scratch")
        length = await ctx.session.append({"said": payload}, max_len=3)
        return {
            "turns": turns,
            "length": length,
            "history": [h["said"] for h in await ctx.session.history()],
            "last2": [h["said"] for h in await ctx.session.history(last=2)],
            "all": await ctx.session.all(),
            "scratch": await ctx.session.get("scratch", "gone"),
            "tier": ctx.session.consistency,
            "degraded": ctx.session.degraded,
        }

    return app


@pytest.mark.parametrize("tier", TIERS)
async def test_every_tier_keeps_a_conversation(
    redis_url: str, ns: str, r: AnyRedis, tier: str
) -> None:
    async with serving(redis_url, ns, _chat(tier)) as client:
        got = [
            await client.request("t.chat", said, session_id="s-1", timeout_s=10)
            for said in ["a", "b", "c", "d"]
        ]
        other = await client.request("t.chat", "x", session_id="s-2", timeout_s=10)
        with pytest.raises(reach.RemoteError, match="no session_id"):
            await client.request("t.chat", "anon", timeout_s=10)
    assert [g["turns"] for g in got] == [1, 2, 3, 4]
    assert [g["length"] for g in got] == [1, 2, 3, 3]  # max_len=3 trims
    assert got[3]["history"] == ["b", "c", "d"] and got[3]["last2"] == ["c", "d"]
    assert got[3]["all"] == {"turns": 4, "last": "d"} and got[3]["scratch"] == "gone"
    assert {g["tier"] for g in got} == {tier} and not any(g["degraded"] for g in got)
    assert (other["turns"], other["history"]) == (1, ["x"])
    keys = Keys(ns)
    for key in (keys.session("s-1"), keys.session_history("s-1"), keys.session_version("s-1")):
        assert 0 < await r.pttl(key) <= 24 * 3600 * 1000
    assert int(await r.get(keys.session_version("s-1"))) > 0


@pytest.mark.parametrize("tier", TIERS)
async def test_a_run_reads_its_clear_and_appends(redis_url: str, ns: str, tier: str) -> None:
    app = Agent("c-1", capabilities=["t.redo"])

    @app.handler("t.redo", session=tier)
    async def redo(payload: Any, ctx: Context) -> Any:
        before = await ctx.session.history()
        await ctx.session.append("a")
        await ctx.session.set("k", 1)
        await ctx.session.clear()
        n = await ctx.session.append("b", max_len=2)
        n = await ctx.session.append("c", max_len=2)
        n = await ctx.session.append("d", max_len=2)
        return [before, n, await ctx.session.history(), await ctx.session.all()]

    async with serving(redis_url, ns, app) as client:
        first = await client.request("t.redo", None, session_id="s-r", timeout_s=10)
        second = await client.request("t.redo", None, session_id="s-r", timeout_s=10)
    assert first == [[], 2, ["c", "d"], {}]
    assert second == [["c", "d"], 2, ["c", "d"], {}]


@pytest.mark.parametrize("tier", TIERS)
async def test_strong_writes_at_once_the_others_when_the_handler_returns(
    redis_url: str, ns: str, r: AnyRedis, tier: str
) -> None:
    """A strong write is in Redis when set() returns; a held write is not there while the
    handler still runs, and is there when its caller has the reply."""
    app = Agent("w-1", capabilities=["t.hold"])
    wrote, go_on = anyio.Event(), anyio.Event()

    @app.handler("t.hold", session=tier)
    async def hold(payload: Any, ctx: Context) -> str:
        await ctx.session.set("k", "v")
        wrote.set()
        await go_on.wait()
        return "done"

    key = Keys(ns).session("s-h")
    async with serving(redis_url, ns, app) as client, anyio.create_task_group() as tg:
        got: list[Any] = []

        async def call() -> None:
            got.append(await client.request("t.hold", None, session_id="s-h", timeout_s=20))

        tg.start_soon(call)
        with anyio.fail_after(20):
            await wrote.wait()
        during = await r.hget(key, "k")
        go_on.set()
        with anyio.fail_after(20):
            while not got:
                await anyio.sleep(0.01)
        after = await r.hget(key, "k")
    assert during == (reach.envelope.encode("v") if tier == "strong" else None)
    assert after == reach.envelope.encode("v")


_IN_SCRIPT = {"type", "hset", "hdel", "del", "rpush", "ltrim", "incr", "pexpire", "publish", "llen"}


@pytest.mark.parametrize("tier", ["cached", "best_effort"])
async def test_a_call_made_by_the_handler_sees_its_held_writes(
    redis_url: str, ns: str, tier: str
) -> None:
    """ctx.client.request and send send the run's held writes first: the callee, reading
    the same session, finds them."""
    app = Agent("p-1", capabilities=["t.parent", "t.child"])
    heard: list[Any] = []

    @app.handler("t.parent", session=tier)
    async def parent(payload: Any, ctx: Context) -> Any:
        calls = ctx.client  # taken before the session is first used
        await ctx.session.set("plan", "draft")
        seen = await calls.request("t.child", None)  # same session, inherited
        await ctx.session.set("plan", "final")
        await calls.send("t.child", None)
        return seen

    @app.handler("t.child")
    async def child(payload: Any, ctx: Context) -> Any:
        heard.append(got := await ctx.session.get("plan"))
        return got

    async with serving(redis_url, ns, app) as client:
        assert await client.request("t.parent", None, session_id="s-p", timeout_s=20) == "draft"
        with anyio.fail_after(20):
            while len(heard) < 2:
                await anyio.sleep(0.01)
    assert heard == ["draft", "final"]


def _calls(stats: dict[str, Any], command: str) -> int:
    entry = stats.get(f"cmdstat_{command}")
    return int(entry["calls"]) if entry else 0


async def _command_stats(r: AnyRedis) -> dict[str, Any]:
    return dict(await r.info("commandstats"))


@pytest.fixture
async def sr(fresh_redis: RedisServer) -> Any:
    """A client of the session Redis (``fresh_redis``)."""
    client = await connect(fresh_redis.url)
    yield client
    await client.aclose()


@pytest.mark.parametrize("tier", TIERS)
async def test_write_behind_sends_a_runs_writes_in_one_round_trip(
    redis_url: str, ns: str, fresh_redis: RedisServer, sr: AnyRedis, tier: str
) -> None:
    app = Agent("w-2", capabilities=["t.many"])

    @app.handler("t.many", session=tier)
    async def many(payload: int, ctx: Context) -> None:
        for i in range(payload):
            await ctx.session.set(f"k{i}", i)
        await ctx.session.delete("k0")
        await ctx.session.clear()
        await ctx.session.set("after", "clear")

    async with serving(redis_url, ns, app, session_url=fresh_redis.url) as client:
        await client.request("t.many", 1, session_id="s-m", timeout_s=10)  # scripts loaded
        await sr.config_resetstat()
        await client.request("t.many", 10, session_id="s-m", timeout_s=10)
        stats = await _command_stats(sr)
    writes = 10 + 3  # sets, a delete, a clear, a set
    assert _calls(stats, "evalsha") == (writes if tier == "strong" else 1)
    # (commandstats counts the commands a script runs as well: those are not round trips)
    sent = {k.removeprefix("cmdstat_") for k in stats} - _IN_SCRIPT
    assert sent == {"evalsha", "config|resetstat"}, sent
    assert await reach.Session(sr, Keys(ns), "s-m").all() == {"after": "clear"}


def _cache_reads(result: str) -> float:
    return REGISTRY.get_sample_value("reach_session_cache_total", {"result": result}) or 0.0


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_sessions")
    yield w
    w.stop_all()


async def test_a_cached_session_is_served_locally_and_fresh_after_another_agents_write(
    redis_url: str, ns: str, fresh_redis: RedisServer, sr: AnyRedis, workers: Workers
) -> None:
    app = Agent("reader-1", capabilities=["t.read", "t.note"])

    @app.handler("t.read", session="cached")
    async def read(payload: Any, ctx: Context) -> dict[str, Any]:
        return {
            "color": await ctx.session.get("color"),
            "history": await ctx.session.history(),
        }

    @app.handler("t.note", session="cached")
    async def note(payload: Any, ctx: Context) -> None:
        await ctx.session.set("color", "green")
        await ctx.session.append(payload)

    workers.start("writer", "--session-url", fresh_redis.url)
    async with serving(redis_url, ns, app, session_url=fresh_redis.url) as client:
        await wait_eligible(client, "t.session.write", ["session-writer"])
        store = app.runtime.state.sessions if app.runtime else None
        assert store is not None and store.cache is not None
        with anyio.fail_after(20):
            await store.cache.subscribed.wait()

        async def read_now() -> dict[str, Any]:
            got: dict[str, Any] = await client.request(
                "t.read", None, session_id="s-c", timeout_s=10
            )
            return got

        async def write(**payload: Any) -> None:
            await client.request("t.session.write", payload, session_id="s-c", timeout_s=10)

        await write(set={"color": "red"}, append=["one"])
        assert await read_now() == {"color": "red", "history": ["one"]}  # read through
        # (a read that met the write's announcement on its way is not kept: read again)
        assert await read_now() == {"color": "red", "history": ["one"]}
        await sr.config_resetstat()
        hits = _cache_reads("hit")
        for _ in range(5):
            assert await read_now() == {"color": "red", "history": ["one"]}
        # served locally: not one command reached the session Redis
        assert _calls(await _command_stats(sr), "evalsha") == 0
        assert _calls(await _command_stats(sr), "hget") == 0
        assert _cache_reads("hit") - hits == 10  # 5 runs, values and history each

        await write(set={"color": "blue"}, append=["two"])  # the other agent, its process
        # The announcement travels on its own connection: the next reads may come before
        # it, and then they see red; once it is heard, blue (well before the 300 s TTL).
        with anyio.fail_after(20):
            while (got := await read_now())["color"] != "blue":
                await anyio.sleep(0.01)
        assert got == {"color": "blue", "history": ["one", "two"]}
        assert await read_now() == got
        await sr.config_resetstat()
        assert await read_now() == {"color": "blue", "history": ["one", "two"]}
        assert _calls(await _command_stats(sr), "evalsha") == 0  # cached again

        # its own write (written through when the handler returned) keeps its copy true
        await client.request("t.note", "three", session_id="s-c", timeout_s=10)
        await sr.config_resetstat()
        assert await read_now() == {"color": "green", "history": ["one", "two", "three"]}
        assert _calls(await _command_stats(sr), "evalsha") == 0


async def test_a_cached_copy_is_read_again_after_its_ttl(
    redis_url: str, ns: str, fresh_redis: RedisServer, sr: AnyRedis
) -> None:
    """A write behind reach's back (no announcement) shows once the copy is older than
    ``cache_ttl_s``; a write of the reader itself keeps its copy true at once."""
    app = Agent("reader-2", capabilities=["t.read", "t.bump"])
    tier = SessionTier("cached", cache_ttl_s=0.5)

    @app.handler("t.read", session=tier)
    async def read(payload: Any, ctx: Context) -> Any:
        return await ctx.session.get("n", 0)

    @app.handler("t.bump", session=tier)
    async def bump(payload: Any, ctx: Context) -> Any:
        n = await ctx.session.get("n", 0) + 1
        await ctx.session.set("n", n)
        return n

    async with serving(redis_url, ns, app, session_url=fresh_redis.url) as client:
        store = app.runtime.state.sessions if app.runtime else None
        assert store is not None and store.cache is not None
        with anyio.fail_after(20):
            await store.cache.subscribed.wait()

        async def call(cap: str) -> Any:
            return await client.request(cap, None, session_id="s-t", timeout_s=10)

        assert await call("t.bump") == 1
        assert await call("t.bump") == 2
        await sr.config_resetstat()
        assert await call("t.read") == 2
        await sr.hset(Keys(ns).session("s-t"), "n", reach.envelope.encode(40))  # unannounced
        t0 = time.monotonic()
        seen = await call("t.read")
        if time.monotonic() - t0 < 0.4:
            assert seen == 2  # the copy, within its TTL
        with anyio.fail_after(20):
            while await call("t.read") != 40:
                await anyio.sleep(0.05)


async def test_cached_sessions_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    """On a 3-master Cluster: a write of one agent reaches the other's copy (PUBLISH from
    the script reaches every node; the cache listens on any one), whatever slot the
    session is in."""
    reader = Agent("c-reader", capabilities=["t.read"])
    writer = Agent("c-writer", capabilities=["t.write"])

    @reader.handler("t.read", session="cached")
    async def read(payload: Any, ctx: Context) -> Any:
        return await ctx.session.get("n", 0)

    @writer.handler("t.write", session="best_effort")
    async def write(payload: int, ctx: Context) -> None:
        await ctx.session.set("n", payload)

    async with serving(redis_cluster.url, ns, reader, writer) as client:
        store = reader.runtime.state.sessions if reader.runtime else None
        assert store is not None and store.cache is not None
        with anyio.fail_after(20):
            await store.cache.subscribed.wait()
        sessions = [f"s-{i}" for i in range(6)]  # spread over the masters' slots
        for n in (1, 2):
            for sid in sessions:
                await client.request("t.write", n, session_id=sid, timeout_s=10)
            for sid in sessions:
                with anyio.fail_after(20):
                    while await client.request("t.read", None, session_id=sid, timeout_s=10) != n:
                        await anyio.sleep(0.01)
        for sid in sessions:  # kept now (a read that met its announcement is not kept)
            assert await client.request("t.read", None, session_id=sid, timeout_s=10) == 2
        hits = _cache_reads("hit")
        for sid in sessions:
            assert await client.request("t.read", None, session_id=sid, timeout_s=10) == 2
        assert _cache_reads("hit") - hits == len(sessions)


def _degraded(cap: str, op: str) -> float:
    return (
        REGISTRY.get_sample_value("reach_session_degraded_total", {"capability": cap, "op": op})
        or 0.0
    )


async def test_a_best_effort_session_answers_empty_while_its_redis_is_down(
    redis_url: str, ns: str, fresh_redis: RedisServer
) -> None:
    app = Agent("be-1", capabilities=["t.be", "t.strict"])

    @app.handler("t.be", session="best_effort")
    async def be(payload: str, ctx: Context) -> dict[str, Any]:
        turns = await ctx.session.get("turns", 0) + 1
        await ctx.session.set("turns", turns)
        await ctx.session.append(payload)
        return {
            "turns": turns,
            "history": await ctx.session.history(),
            "degraded": ctx.session.degraded,
        }

    @app.handler("t.strict")
    async def strict(payload: str, ctx: Context) -> Any:
        return await ctx.session.get("turns", 0)

    async with serving(redis_url, ns, app, session_url=fresh_redis.url) as client:

        async def call(cap: str, said: str) -> Any:
            return await client.request(cap, said, session_id="s-b", timeout_s=20)

        assert await call("t.be", "a") == {"turns": 1, "history": ["a"], "degraded": False}
        reads, writes = _degraded("t.be", "read"), _degraded("t.be", "write")
        fresh_redis.kill()
        down = await call("t.be", "b")
        assert down == {"turns": 1, "history": ["b"], "degraded": True}  # an empty session
        assert _degraded("t.be", "read") == reads + 1
        assert _degraded("t.be", "write") == writes + 1  # its writes let go
        with pytest.raises(reach.RemoteError):  # the strong tier fails instead
            await client.request("t.strict", "x", session_id="s-b", timeout_s=20, max_attempts=1)
        fresh_redis.start()
        # back: the session as it was before the outage (the degraded run wrote nothing)
        with anyio.fail_after(30):
            while (up := await call("t.be", "c"))["degraded"]:
                await anyio.sleep(0.05)
        assert up == {"turns": 2, "history": ["a", "c"], "degraded": False}


def test_an_unknown_tier_is_refused_when_the_handler_is_declared() -> None:
    app = Agent("x-1", capabilities=["t.x"])
    with pytest.raises(reach.ConfigError, match="strong.*cached.*best_effort"):
        app.handler("t.x", session="eventual")
    with pytest.raises(reach.ConfigError, match="cache_ttl_s"):
        SessionTier("cached", cache_ttl_s=0)

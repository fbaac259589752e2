"""Resuming a stream (``client.resume``, issue 29 item 6) with agents in the test's event
loop: chunks numbered from 1, a resume after ``n`` yields ``n + 1``.. then the final result
(or the handler's error), chunks written while nobody read included; the bounds in chunks,
bytes and time are enforced and a resume asking for dropped chunks gets ChunksNotKept; a
send() is resumable; a Cluster. The SIGKILLed reader resumed in another process is
``test_resume_processes.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from reach import (
    Agent,
    ChunksNotKept,
    Client,
    ConfigError,
    Context,
    Reject,
    Rejected,
    RemoteError,
)
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.support.agents_messaging import Gate, serving
from tests.support.cluster import RedisTestCluster

pytestmark = pytest.mark.anyio


def resumable(gate: Gate | None = None, agent_id: str = "resume-1") -> Agent:
    """``test.count``: yields ``n`` chunks ``{"i": i}`` (``size`` bytes of padding each, if
    asked), result ``{"chunks": n}``; ``test.held``: yields ``before`` chunks, waits for
    ``gate``, yields ``after`` more; ``test.broken``: two chunks, then rejects."""
    app = Agent(agent_id, capabilities=["test.count", "test.held", "test.broken"])

    @app.handler("test.count")
    async def count(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        pad = "x" * payload.get("size", 0)
        for i in range(payload["n"]):
            yield {"i": i, "pad": pad} if pad else {"i": i}
        ctx.result = {"chunks": payload["n"]}

    @app.handler("test.held")
    async def held(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        for i in range(payload["before"]):
            yield i
        assert gate is not None
        await gate.hold()
        for i in range(payload["before"], payload["before"] + payload["after"]):
            yield i
        ctx.result = "done"

    @app.handler("test.broken")
    async def broken(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        yield "one"
        yield "two"
        raise Reject("broke after two chunks")

    return app


async def test_a_resume_after_n_yields_the_rest_then_the_result(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, resumable()) as client:
        s = client.stream("test.count", {"n": 600}, timeout_s=30)
        got = [c async for c in s]
        assert s.seq == 600 and len(got) == 600
        for after in (0, 1, 299, 599, 600):
            r = client.resume(s.msg_id, after=after, timeout_s=30)
            rest = [c async for c in r]
            assert rest == [{"i": i} for i in range(after, 600)], after
            assert r.seq == 600 and r.result == {"chunks": 600}


async def test_a_resume_follows_chunks_written_while_it_waits(redis_url: str, ns: str) -> None:
    gate = Gate()
    async with serving(redis_url, ns, resumable(gate)) as client:
        s = client.stream("test.held", {"before": 3, "after": 400}, timeout_s=60)
        it = aiter(s)
        first = [await anext(it), await anext(it)]
        assert first == [0, 1] and s.seq == 2
        await s.aclose()  # the caller stops reading after chunk 2
        await gate.entered.wait()
        r = client.resume(s.msg_id, after=s.seq, timeout_s=60)
        ri = aiter(r)
        assert await anext(ri) == 2  # chunk 3, kept before the resume began
        gate.open()  # the rest is written while the resume waits
        rest = [c async for c in r]
        assert rest == list(range(3, 403)) and r.seq == 403 and r.result == "done"


async def test_a_resume_raises_the_handlers_error_after_its_chunks(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, resumable()) as client:
        s = client.stream("test.broken", None, timeout_s=30)
        with pytest.raises(Rejected):
            [c async for c in s]
        got: list[Any] = []
        # From the record, which keeps no dead-letter reason: a RemoteError, as result() has it.
        with pytest.raises(RemoteError, match="broke after two chunks"):
            async for c in client.resume(s.msg_id, after=0, timeout_s=30):
                got.append(c)
        assert got == ["one", "two"]


async def test_a_sent_message_is_resumable(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, resumable()) as client:
        msg_id = await client.send("test.count", {"n": 5}, timeout_s=30)
        r = client.resume(msg_id, timeout_s=30)
        assert [c async for c in r] == [{"i": i} for i in range(5)]
        assert r.result == {"chunks": 5}


async def test_the_chunk_bound_keeps_the_newest_and_older_ones_raise(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, resumable(), stream_keep_chunks=100) as client:
        s = client.stream("test.count", {"n": 1000}, timeout_s=30)
        assert len([c async for c in s]) == 1000
        rec = await r.hgetall(Keys(ns).idem(s.msg_id))
        kept_from = int(rec[b"chunks_from"])
        # Whole entries go, the oldest first; an entry holds at most a quarter of the bound.
        assert int(rec[b"chunks"]) == 1000 and 901 <= kept_from <= 926
        kept = Keys(ns).kept_chunks(s.msg_id)
        n_entries = await r.xlen(kept)
        assert n_entries >= 1
        with pytest.raises(ChunksNotKept) as e:
            [c async for c in client.resume(s.msg_id, after=10, timeout_s=30)]
        assert e.value.first == kept_from and e.value.after == 10
        assert "no longer kept" in str(e.value)
        got = [c async for c in client.resume(s.msg_id, after=kept_from - 1, timeout_s=30)]
        assert got == [{"i": i} for i in range(kept_from - 1, 1000)]


async def test_the_bytes_bound_keeps_the_newest(redis_url: str, ns: str, r: AnyRedis) -> None:
    bound = 64 * 1024
    async with serving(redis_url, ns, resumable(), stream_keep_bytes=bound) as client:
        s = client.stream("test.count", {"n": 200, "size": 1000}, timeout_s=30)
        assert len([c async for c in s]) == 200
        keys = Keys(ns)
        rec = await r.hgetall(keys.idem(s.msg_id))
        held = int(rec[b"chunks_bytes"])
        entries = await r.xrange(keys.kept_chunks(s.msg_id))
        assert held == sum(len(f[b"r"]) for _, f in entries) and 0 < held <= bound
        kept_from = int(rec[b"chunks_from"])
        assert kept_from > 100  # 200 chunks of ~1 KB: well past 64 KiB
        with pytest.raises(ChunksNotKept):
            [c async for c in client.resume(s.msg_id, after=0, timeout_s=30)]
        got = [c["i"] async for c in client.resume(s.msg_id, after=kept_from - 1, timeout_s=30)]
        assert got == list(range(kept_from - 1, 200))


async def test_kept_chunks_expire_and_a_resume_then_raises(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, resumable(), stream_keep_s=0.5) as client:
        s = client.stream("test.count", {"n": 10}, timeout_s=30)
        assert len([c async for c in s]) == 10
        kept = Keys(ns).kept_chunks(s.msg_id)
        assert 0 < await r.pttl(kept) <= 500
        with anyio.fail_after(10):
            while await r.exists(kept):
                await anyio.sleep(0.05)
        with pytest.raises(ChunksNotKept, match="expired"):
            [c async for c in client.resume(s.msg_id, after=3, timeout_s=30)]
        # After the last chunk nothing is asked of the kept stream: the final result.
        r_end = client.resume(s.msg_id, after=10, timeout_s=30)
        assert [c async for c in r_end] == [] and r_end.result == {"chunks": 10}


async def test_nothing_is_kept_with_keep_chunks_0(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, resumable(), stream_keep_chunks=0) as client:
        s = client.stream("test.count", {"n": 10}, timeout_s=30)
        assert len([c async for c in s]) == 10
        assert not await r.exists(Keys(ns).kept_chunks(s.msg_id))


async def test_resume_of_an_unknown_message_and_bad_arguments(redis_url: str, ns: str) -> None:
    async with Client(redis_url=redis_url, namespace=ns) as client:
        with pytest.raises(ChunksNotKept, match="No task"):
            [c async for c in client.resume("no-such-msg")]
        for bad in (-1, 1.5, True, "3"):
            with pytest.raises(ConfigError):
                client.resume("m", after=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            client.resume("m", timeout_s=0)


async def test_resume_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    async with serving(redis_cluster.url, ns, resumable()) as client:
        s = client.stream("test.count", {"n": 300}, idempotency_key="order-7", timeout_s=30)
        it = aiter(s)
        for _ in range(10):
            await anext(it)
        await s.aclose()
        r = client.resume(s.msg_id, after=s.seq, timeout_s=30)
        assert [c["i"] async for c in r] == list(range(10, 300))
        assert r.result == {"chunks": 300}


async def test_an_entry_that_is_not_reachs_is_skipped_not_read_forever(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, resumable()) as client:
        s = client.stream("test.count", {"n": 5}, timeout_s=30)
        assert len([c async for c in s]) == 5
        keys = Keys(ns)
        await r.xadd(keys.kept_chunks(s.msg_id), {"r": b"not an entry"}, id="6-6")
        await r.hset(keys.idem(s.msg_id), "chunks", 6)
        with anyio.fail_after(10):
            got: list[Any] = []
            with pytest.raises(ChunksNotKept):
                async for c in client.resume(s.msg_id, after=0, timeout_s=30):
                    got.append(c)
        assert got == [{"i": i} for i in range(5)]


async def test_a_watch_of_a_streaming_message_does_not_yield_its_chunks(
    redis_url: str, ns: str
) -> None:
    gate = Gate()
    async with serving(redis_url, ns, resumable(gate)) as client:
        s = client.stream("test.held", {"before": 2, "after": 50}, timeout_s=60)
        await s.start()
        await gate.entered.wait()
        changes: list[Any] = []
        watching = anyio.Event()

        async def watch() -> None:
            async for change in client.watch(s.msg_id, timeout_s=60):
                changes.append(change)
                watching.set()  # the watch read the record: it is watched

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with anyio.fail_after(30):
                await watching.wait()
            gate.open()  # 50 chunk entries kept and announced on the watched record
            assert len([c async for c in s]) == 52
        # Its statuses only (a message claimed at send shows pending until it ran 10 ms).
        assert changes[0].kind == "current" and changes[-1].final
        assert [c.status for c in changes[1:]] in (["running", "succeeded"], ["succeeded"])
        assert {c.kind for c in changes[1:]} == {"status"}

"""Streamed results (issue 14 item 1) on a real Redis: chunks reach a ``Client.stream``
caller in order and before the final reply, ``request()`` gets only the final result, a
handler failing midway raises after its chunks, chunk entries are signed like replies, and
garbage in the reply stream does not break the caller. Agents run in the test's event
loop; the SIGKILL-and-redelivery test with real worker processes is
``test_streaming_crash.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
import pytest

from reach import Agent, Context, Reject, Rejected, RemoteError, StreamTooLarge
from reach.client import Client
from reach.connection import AnyRedis
from reach.envelope import CHUNK, Reply, encode
from reach.keys import Keys
from reach.signing import Keyring
from tests.support.agents_messaging import Gate, serving
from tests.support.cluster import RedisTestCluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

SECRET = "team-secret-0123456789abcdef"
OTHER = "not-the-team-secret-0123456789"


def streaming_agent(gate: Gate | None = None, agent_id: str = "streamer-1") -> Agent:
    """``test.count``: an async generator yielding ``n`` chunks (``ctx.result`` set to their
    count); ``test.emit``: a coroutine calling ``ctx.emit`` and returning a value;
    ``test.broken``: emits two chunks, then rejects; ``test.held``: emits one chunk, then
    waits for ``gate`` before the next and the end."""
    app = Agent(agent_id, capabilities=["test.count", "test.emit", "test.broken", "test.held"])

    @app.handler("test.count")
    async def count(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        for i in range(payload["n"]):
            yield {"i": i}
        ctx.result = {"chunks": payload["n"]}

    @app.handler("test.emit")
    async def emit(payload: dict[str, Any], ctx: Context) -> str:
        for word in payload["words"]:
            await ctx.emit(word)
        return " ".join(payload["words"])

    @app.handler("test.broken")
    async def broken(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        yield "one"
        yield "two"
        raise Reject("broke after two chunks")

    @app.handler("test.held")
    async def held(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        yield "first"
        assert gate is not None
        await gate.hold()
        yield "second"
        ctx.result = "done"

    return app


async def test_chunks_arrive_in_order_and_before_the_final_result(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, streaming_agent()) as client:
        s = client.stream("test.count", {"n": 1000}, timeout_s=30)
        got = [chunk async for chunk in s]
        assert got == [{"i": i} for i in range(1000)]
        assert s.result == {"chunks": 1000} and s.duplicates == 0

        # A coroutine handler streaming with ctx.emit: its return value is the final result.
        s2 = client.stream("test.emit", {"words": ["a", "b", "c"]}, timeout_s=30)
        assert [c async for c in s2] == ["a", "b", "c"]
        assert s2.result == "a b c"
        assert not client._reader.streams and not client._reader.events  # nothing left over


async def test_each_chunk_comes_while_the_handler_still_runs(redis_url: str, ns: str) -> None:
    gate = Gate()
    async with serving(redis_url, ns, streaming_agent(gate)) as client:
        async with client.stream("test.held", None, timeout_s=30) as s:
            it = aiter(s)
            # The first chunk comes while the handler is held: streamed, not sent at the end.
            with anyio.fail_after(20):
                assert await anext(it) == "first"
            assert gate.entered.is_set()
            gate.open()
            assert [c async for c in s] == ["second"]
        assert s.result == "done"


async def test_request_of_a_streaming_handler_returns_the_final_result(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, streaming_agent()) as client:
        assert await client.request("test.count", {"n": 50}, timeout_s=30) == {"chunks": 50}
        assert await client.request("test.emit", {"words": ["x", "y"]}, timeout_s=30) == "x y"
        assert not client._reader.unclaimed  # the chunks were dropped, not kept for result()

        async def stream_emptied() -> bool:  # read chunk entries are deleted like replies
            await client._reader.delete_answered()
            return int(await r.xlen(Keys(ns).replies(client.client_id))) == 0

        await wait_until(stream_emptied, what="reply stream emptied")


async def test_a_handler_failing_midway_raises_after_its_chunks(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, streaming_agent()) as client:
        got: list[Any] = []
        with pytest.raises(Rejected, match="broke after two chunks"):
            async for chunk in client.stream("test.broken", None, timeout_s=30):
                got.append(chunk)
        assert got == ["one", "two"]
        with pytest.raises(Rejected):
            await client.request("test.broken", None, timeout_s=30)


async def test_a_replay_of_a_completed_key_gives_the_final_result_and_no_chunks(
    redis_url: str, ns: str
) -> None:
    async with serving(redis_url, ns, streaming_agent()) as client:
        first = client.stream("test.count", {"n": 3}, timeout_s=30, idempotency_key="k-1")
        assert len([c async for c in first]) == 3
        again = client.stream("test.count", {"n": 3}, timeout_s=30, idempotency_key="k-1")
        assert [c async for c in again] == []
        assert again.result == first.result == {"chunks": 3}


async def test_a_stream_bounded_in_bytes_holds_no_more_while_unread(
    redis_url: str, ns: str
) -> None:
    """A caller that reads nothing while its handler streams 20,000 chunks holds at most
    ``max_bytes`` of them (what the A2A gateway bounds each task's stream with): its loop
    gets the chunks kept, then StreamTooLarge, not the 20,000."""
    async with serving(redis_url, ns, streaming_agent()) as client:
        async with client.stream("test.count", {"n": 20_000}, timeout_s=60, max_bytes=4096) as s:
            it = aiter(s)
            assert await anext(it) == {"i": 0}  # sent, and its chunks coming

            async def finished() -> bool:
                return (await client.task(s.msg_id)).status == "succeeded"

            await wait_until(finished, timeout_s=60, what="the handler to end")
            got = [{"i": 0}]
            with pytest.raises(StreamTooLarge, match="4096 bytes"):
                async for chunk in s:
                    got.append(chunk)
        assert 1 < len(got) <= 4096 // 4, len(got)  # a chunk {"i": i} is at least 4 bytes
        assert got == [{"i": i} for i in range(len(got))]
        assert await client.request("test.emit", {"words": ["ok"]}, timeout_s=30) == "ok"


async def test_leaving_the_loop_early_forgets_the_call(redis_url: str, ns: str) -> None:
    async with serving(redis_url, ns, streaming_agent()) as client:
        async with client.stream("test.count", {"n": 200}, timeout_s=30) as s:
            async for chunk in s:
                assert chunk == {"i": 0}
                break
        assert s.msg_id not in client._reader.streams
        assert s.msg_id not in client._reader.events
        # The client goes on serving calls (the rest of the abandoned stream is dropped).
        assert await client.request("test.emit", {"words": ["ok"]}, timeout_s=30) == "ok"


async def test_garbage_and_forged_chunk_entries_do_not_break_the_caller(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    gate = Gate()
    async with serving(redis_url, ns, streaming_agent(gate)) as client:
        async with client.stream("test.held", None, timeout_s=30) as s:
            it = aiter(s)
            with anyio.fail_after(20):
                assert await anext(it) == "first"
            key = Keys(ns).replies(client.client_id)

            def chunk(**kw: Any) -> bytes:
                return encode(Reply(msg_id=s.msg_id, status=CHUNK, **kw))

            for junk in (
                b"not msgpack at all",
                encode({"msg_id": s.msg_id, "status": CHUNK, "seq": -1}),  # seq out of range
                chunk(result=msgspec.Raw(encode("not a list")), seq=1),
                chunk(result=msgspec.Raw(b"\xc1"), seq=1),  # bytes that do not decode
                chunk(result=msgspec.Raw(encode(["again"])), seq=0),  # a number already seen
                chunk(result=msgspec.Raw(encode(["far"])), seq=10**6),  # past the next one
            ):
                await r.xadd(key, {"r": junk})
            await r.xadd(key, {"x": b"no r field"})
            gate.open()
            assert [c async for c in s] == ["second"]
        assert s.result == "done" and s.duplicates == 1


async def test_chunk_entries_are_signed_and_a_forged_one_is_dropped(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    gate = Gate()
    async with (
        serving(redis_url, ns, streaming_agent(gate), secret=SECRET),
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as client,
    ):
        async with client.stream("test.held", None, timeout_s=30) as s:
            it = aiter(s)
            with anyio.fail_after(20):
                assert await anext(it) == "first"
            key = Keys(ns).replies(client.client_id)
            raw = msgspec.Raw(encode(["forged"]))
            unsigned = Reply(msg_id=s.msg_id, status=CHUNK, result=raw, seq=1)
            other = Keyring.from_option(ns, OTHER)
            assert other is not None
            wrong = other.sign_reply(Reply(msg_id=s.msg_id, status=CHUNK, result=raw, seq=1))
            # A final reply's signature does not pass for a chunk entry's (labels differ).
            ring = Keyring.from_option(ns, SECRET)
            assert ring is not None
            final = ring.sign_reply(Reply(msg_id=s.msg_id, status="succeeded", result=raw))
            relabelled = msgspec.structs.replace(final, status=CHUNK, seq=1)
            for forged in (unsigned, wrong, relabelled):
                await r.xadd(key, {"r": encode(forged)})

            async def all_dropped() -> bool:
                return client.forged_replies == 3

            await wait_until(all_dropped, what="3 forged chunk entries dropped")
            gate.open()
            assert [c async for c in s] == ["second"]
        assert s.result == "done"


async def test_a_chunk_that_cannot_be_encoded_fails_the_handler(redis_url: str, ns: str) -> None:
    app = Agent("bad-chunk-1", capabilities=["test.bad"])

    @app.handler("test.bad")
    async def bad(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        yield "fine"
        yield object()

    async with serving(redis_url, ns, app) as client:
        got: list[Any] = []
        with pytest.raises(RemoteError, match="cannot be sent"):
            async for chunk in client.stream("test.bad", None, timeout_s=30, max_attempts=1):
                got.append(chunk)
        assert got == ["fine"]


async def test_a_retried_run_does_not_repeat_chunks(redis_url: str, ns: str, r: AnyRedis) -> None:
    # Attempt 1 sends chunks 0..2 and raises; attempt 2 runs from the start and sends 0..5:
    # the caller gets 0..5 once (0..2 from the first run), then attempt 2's final result.
    app = Agent("retry-stream-1", capabilities=["test.flaky"])

    @app.handler("test.flaky")
    async def flaky(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        for i in range(6):
            yield (ctx.attempt, i)
            if ctx.attempt == 1 and i == 2:
                raise ValueError("first attempt fails midway")
        ctx.result = ctx.attempt

    async with serving(redis_url, ns, app) as client:
        s = client.stream("test.flaky", None, timeout_s=30)
        got = [tuple(c) async for c in s]
        assert got == [(1, 0), (1, 1), (1, 2), (2, 3), (2, 4), (2, 5)]
        assert s.result == 2 and s.duplicates == 3


async def test_a_thread_handler_emits_through_the_event_loop(redis_url: str, ns: str) -> None:
    app = Agent("thread-stream-1", capabilities=["test.thread"])

    @app.handler("test.thread")
    def in_thread(payload: Any, ctx: Context) -> str:
        for i in range(3):
            anyio.from_thread.run(ctx.emit, i)
        return "done"

    async with serving(redis_url, ns, app) as client:
        s = client.stream("test.thread", None, timeout_s=30)
        assert [c async for c in s] == [0, 1, 2] and s.result == "done"


@pytest.mark.cluster
async def test_streaming_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    # The chunk entries go to the caller's reply stream slot, wherever the inbox is.
    async with serving(redis_cluster.url, ns, streaming_agent()) as client:
        s = client.stream("test.count", {"n": 600}, timeout_s=60)
        assert [c async for c in s] == [{"i": i} for i in range(600)]
        assert s.result == {"chunks": 600}
        assert await client.request("test.count", {"n": 5}, timeout_s=60) == {"chunks": 5}


async def test_a_handler_relays_a_stream_through_ctx_client(redis_url: str, ns: str) -> None:
    relay = Agent("relay-1", capabilities=["test.relay"])

    @relay.handler("test.relay")
    async def relay_chunks(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        inner = ctx.client.stream("test.count", {"n": 3})
        async for chunk in inner:
            yield {"relayed": chunk["i"]}
        # The inner call inherited this message's deadline, less the margin for this
        # handler's own reply (ctx.client's contract: at most a second).
        assert ctx.deadline_ms - 1000 <= inner.envelope.deadline_ms < ctx.deadline_ms
        ctx.result = inner.result

    async with serving(redis_url, ns, streaming_agent(), relay) as client:
        s = client.stream("test.relay", None, timeout_s=30)
        assert [c async for c in s] == [{"relayed": i} for i in range(3)]
        assert s.result == {"chunks": 3}

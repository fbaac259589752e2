"""A streaming handler's worker SIGKILLed mid-stream: its message is redelivered to another
agent's worker, which runs the handler again from the start; the caller gets every chunk
number exactly once, in order (the chunks before the kill from the dead worker, the rest
from the new one), then the final result of the new run."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from reach.client import Client
from tests.support.agents_messaging import effects, wait_eligible
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_streaming")
    yield w
    w.stop_all()


async def test_no_duplicate_chunk_after_a_sigkill_and_a_redelivery(
    redis_url: str, ns: str, workers: Workers
) -> None:
    first = workers.start("stream_a")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "test.stream", ["stream-a"], timeout=30)
        got: list[dict[str, Any]] = []
        async with client.stream("test.stream", {"n": 8, "hold_after": 2}, timeout_s=60) as s:
            it = aiter(s)
            with anyio.fail_after(30):
                for _ in range(3):  # chunks 0..2 come, then the first run sleeps
                    got.append(await anext(it))
            assert {c["pid"] for c in got} == {first.pid}

            workers.start("stream_b")
            await wait_eligible(client, "test.stream", ["stream-b"], timeout=30)
            first.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(first.wait)
            with anyio.fail_after(45):  # evicted, its inbox rerouted, run again on stream-b
                got.extend([c async for c in s])
        assert [c["i"] for c in got] == list(range(8)), got
        second = {c["pid"] for c in got[3:]}
        assert len(second) == 1 and first.pid not in second
        assert all(c["start"] == 2 for c in got[3:])
        # The new run sent chunks 0..2 again: the caller dropped them.
        assert s.duplicates == 3
        assert s.result == {"start": 2, "pid": second.pop(), "agent": "stream-b"}
        assert set((await effects(client.redis, ns, "stream.started")).values()) == {2}

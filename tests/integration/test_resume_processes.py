"""Resuming a stream across processes (issue 29 item 6): a reader process streaming from a
real ``reach worker`` is SIGKILLed mid-stream, the worker goes on writing chunks nobody
reads, and a resumer in another process, ``after=`` the last chunk the reader printed,
gets every chunk after it exactly once, in order, then the final result; a resume started
after the stream ended gets the same; a worker SIGKILLed mid-stream and its message run
again elsewhere still gives each chunk once; a resume asking for trimmed chunks is told
so (ChunksNotKept)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import IO, Any

import anyio
import pytest

from reach import Client
from reach.keys import Keys
from tests.support.agents_messaging import effects, wait_eligible, wait_status
from tests.support.waiting import wait_until
from tests.support.workers import ROOT, Workers

pytestmark = pytest.mark.anyio

N = 400


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def reader(
    procs: list[subprocess.Popen[str]], url: str, ns: str, *args: str
) -> subprocess.Popen[str]:
    """``tests.support.stream_reader`` in a process of its own (stdout: its JSON lines)."""
    cmd = [sys.executable, "-m", "tests.support.stream_reader", url, ns, *args]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    procs.append(p)
    return p


async def line(out: IO[str] | None) -> dict[str, Any]:
    assert out is not None
    with anyio.fail_after(60):
        text = await anyio.to_thread.run_sync(out.readline)
    assert text, "the reader ended without its last line"
    row: dict[str, Any] = json.loads(text)
    return row


async def rest(p: subprocess.Popen[str]) -> tuple[list[tuple[int, Any]], dict[str, Any]]:
    """The chunks (seq, chunk) a reader prints until its end, and its last line."""
    got: list[tuple[int, Any]] = []
    while True:
        row = await line(p.stdout)
        if "seq" not in row:
            return got, row
        got.append((row["seq"], row["chunk"]))


def exactly(got: list[tuple[int, Any]], first: int, last: int) -> None:
    """``got`` is chunks ``first..last``, each once, in order, numbered as sent."""
    assert [s for s, _ in got] == list(range(first, last + 1))
    assert [c["i"] for _, c in got] == list(range(first - 1, last))


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_resume")
    yield w
    w.stop_all()


async def test_a_reader_sigkilled_mid_stream_is_resumed_in_another_process(
    redis_url: str, ns: str, workers: Workers, procs: list[subprocess.Popen[str]]
) -> None:
    workers.start("app")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "resume.count", ["resume-1"], timeout=30)
        payload = {"n": N, "slow_from": 50, "pause_s": 0.01}
        first = reader(procs, redis_url, ns, "stream", "resume.count", json.dumps(payload))
        msg_id = (await line(first.stdout))["msg_id"]
        seen: list[tuple[int, Any]] = []
        while len(seen) < 120:  # chunks still come, 10 ms apart, when the reader dies
            row = await line(first.stdout)
            seen.append((row["seq"], row["chunk"]))
        first.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(first.wait)
        exactly(seen, 1, 120)
        after = seen[-1][0]

        record = Keys(ns).idem(msg_id)

        async def written_meanwhile() -> bool:  # chunks nobody reads, kept
            return int(await client.redis.hget(record, "chunks") or 0) >= after + 50

        await wait_until(written_meanwhile, timeout_s=60)
        assert (await client.task(msg_id)).status == "running"  # the stream goes on

        second = reader(procs, redis_url, ns, "resume", msg_id, str(after))
        got, end = await rest(second)
        exactly(got, after + 1, N)
        assert end == {"result": {"chunks": N}}

        # Resumed again after the end, from another chunk: the same chunks, the same result.
        await wait_status(client, msg_id, "succeeded")
        third = reader(procs, redis_url, ns, "resume", msg_id, "300")
        got, end = await rest(third)
        exactly(got, 301, N)
        assert end == {"result": {"chunks": N}}


async def test_a_resume_asking_for_trimmed_chunks_is_told_so(
    redis_url: str, ns: str, workers: Workers, procs: list[subprocess.Popen[str]]
) -> None:
    workers.start("app", "--stream-keep-chunks", "100")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "resume.count", ["resume-1"], timeout=30)
        msg_id = await client.send("resume.count", {"n": N}, timeout_s=60)
        await wait_status(client, msg_id, "succeeded")
        first = int(await client.redis.hget(Keys(ns).idem(msg_id), "chunks_from") or 0)
        assert N - 100 < first <= N - 74  # whole entries of at most 25 chunks go

        p = reader(procs, redis_url, ns, "resume", msg_id, "10")
        got, end = await rest(p)
        assert got == [] and end["type"] == "ChunksNotKept"
        assert f"the oldest kept is {first}" in end["error"]

        p = reader(procs, redis_url, ns, "resume", msg_id, str(first - 1))
        got, end = await rest(p)
        exactly(got, first, N)
        assert end == {"result": {"chunks": N}}


async def test_a_worker_sigkilled_mid_stream_still_gives_each_chunk_once(
    redis_url: str, ns: str, procs: list[subprocess.Popen[str]]
) -> None:
    """The first run writes chunks 1..3 and hangs; its worker is SIGKILLed; the message runs
    again on another agent, which writes chunks 1..8: the kept stream keeps 1..3 of the
    first run and 4..8 of the second, and a resume in another process gets 4..8 once."""
    w = Workers(redis_url, ns, "tests.support.agents_streaming")
    try:
        a = w.start("stream_a")
        async with Client(redis_url=redis_url, namespace=ns) as client:
            await wait_eligible(client, "test.stream", ["stream-a"], timeout=30)
            s = client.stream("test.stream", {"n": 8, "hold_after": 2}, timeout_s=60)
            it = aiter(s)
            with anyio.fail_after(30):
                got = [await anext(it) for _ in range(3)]
            await s.aclose()
            w.start("stream_b")
            await wait_eligible(client, "test.stream", ["stream-b"], timeout=30)
            a.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(a.wait)
            await wait_status(client, s.msg_id, "succeeded", timeout=45)

            p = reader(procs, redis_url, ns, "resume", s.msg_id, str(s.seq))
            rows, end = await rest(p)
            assert [seq for seq, _ in rows] == [4, 5, 6, 7, 8]
            assert [c["i"] for _, c in rows] == [3, 4, 5, 6, 7]
            assert all(c["start"] == 2 for _, c in rows)  # the second run's
            assert end["result"]["agent"] == "stream-b"
            # From the start: the first run's 1..3, then the second run's 4..8.
            p = reader(procs, redis_url, ns, "resume", s.msg_id, "0")
            rows, end = await rest(p)
            assert [c["i"] for _, c in rows] == list(range(8))
            assert [c["start"] for _, c in rows[:3]] == [1, 1, 1] == [c["start"] for c in got]
            assert set((await effects(client.redis, ns, "stream.started")).values()) == {2}
    finally:
        w.stop_all()

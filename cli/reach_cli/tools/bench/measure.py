"""The workloads, measured: reach's backlog, streaming and latency phases, the floor's and
the lean floor's same workloads, and the CPU each process spent per message."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import redis.asyncio as aredis

from reach import Client, admin
from reach._sending.delivery import CLAIM_AT_SEND_LEASE_MS
from reach.connection import AnyRedis, connect
from reach.envelope import Envelope, encode
from reach.keys import GROUP, Keys
from reach.scripts import inbox, run_calls
from reach.signing import make_signer
from reach.tasks import TASK_TTL_MS

from .. import floor, lean_floor
from .processes import (
    AGENT_ID,
    CAP,
    FLOOR_BATCH,
    LOAD_BATCH,
    NS,
    POLL_S,
    STREAM_INFLIGHT,
    WARM_UP,
    Measure,
    Progress,
)


async def _commandstats(r: AnyRedis) -> dict[str, int]:
    info = await r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


async def _reads(r: AnyRedis) -> int:
    """Requests (or pipelines) Redis has read from all clients so far."""
    return int((await r.info("stats"))["total_reads_processed"])


async def entries_added(r: Any, stream: str) -> int:
    """Entries ever added to ``stream`` (0 before it exists)."""
    if not await r.exists(stream):
        return 0
    return int((await r.xinfo_stream(stream))["entries-added"])


async def _until_processed(
    r: Any, stream: str, group: str, n: int, phase: str, progress: Progress | None
) -> None:
    """Poll until ``group`` has read and acknowledged every entry of ``stream``."""
    with anyio.fail_after(600):
        while True:
            left = await floor.remaining(r, stream, group)
            if progress:
                progress(phase, max(0, n - left), n)
            if left == 0:
                return
            await anyio.sleep(POLL_S)


# -- reach: backlog, streaming, latency ----------------------------------------------------


async def load_backlog(
    r: AnyRedis,
    keys: Keys,
    envs: Sequence[Envelope],
    *,
    claim_for: str = "",
    progress: Progress | None = None,
) -> None:
    """Add ``envs`` to the benchmark agent's inbox as ``Client.send`` does on a standalone
    Redis (``send.lua``: the inbox entry and the pending record in one step, each claimed
    at send for ``claim_for``, the worker's ``agent_id/instance_id``, when given), pipelined
    ``LOAD_BATCH`` at a time so that loading is quick; the Redis state is what that many
    sends leave."""
    n = len(envs)
    # With REACH_SECRET or REACH_IDENTITY_FILE set (--secret, --ed25519), signed as
    # Client.send signs them.
    signer = make_signer(keys.namespace)
    if signer is not None:
        for env in envs:
            signer.sign_envelope(env)
    for i in range(0, n, LOAD_BATCH):
        calls = [
            inbox.send_call(
                keys,
                inbox.Message.of(env, encode(env)),
                agent_id=AGENT_ID,
                priority=env.priority,
                ttl_ms=TASK_TTL_MS,
                claim_for=claim_for,
                claim_lease_ms=CLAIM_AT_SEND_LEASE_MS if claim_for else 0,
            )
            for env in envs[i : i + LOAD_BATCH]
        ]
        for sent in await run_calls(r, calls):
            if isinstance(sent, Exception):
                raise sent
        if progress:
            progress("loading", min(i + LOAD_BATCH, n), n)


async def _throughput(
    url: str, n: int, worker: subprocess.Popen[bytes], progress: Progress | None
) -> dict[str, Any]:
    keys = Keys(NS)
    r = await connect(url)
    try:
        async with Client(redis=r, namespace=NS) as c:
            envs = [c.build(CAP, {"i": i}, reply=False) for i in range(n)]
            [agent] = await c.eligible(CAP)
            worker.send_signal(signal.SIGSTOP)  # load the backlog while it cannot read
            t_load = time.perf_counter()
            owner = f"{agent.agent_id}/{agent.instance_id}"
            await load_backlog(r, keys, envs, claim_for=owner, progress=progress)
            t_loaded = time.perf_counter()
            before = await _commandstats(r)
            reads_before = await _reads(r)
            own_reads = 0  # the bench's own requests, taken out of the count below
            t0 = time.perf_counter()
            worker.send_signal(signal.SIGCONT)
            with anyio.fail_after(600):
                while True:  # one pipeline of XLEN a poll (left out of the counts below)
                    depth = sum((await admin.queue_depths(r, keys, [AGENT_ID]))[AGENT_ID].values())
                    own_reads += 1
                    if progress:
                        progress("processing", n - depth, n)
                    if depth == 0:
                        break
                    await anyio.sleep(POLL_S)
            t1 = time.perf_counter()
            after = await _commandstats(r)
            reads = await _reads(r) - reads_before - own_reads - 1  # the INFO before it
            last = (await c.task(envs[-1].msg_id)).status
    finally:
        await r.aclose()
    # Commands run for the backlog, those inside scripts included; the bench's own polling
    # (XLEN, INFO) is left out.
    skip = {"xlen", "info"}
    worker_cmds = sum(v - before.get(k, 0) for k, v in after.items() if k not in skip)
    return {
        "messages": n,
        "seconds": t1 - t0,
        "load_seconds": t_loaded - t_load,
        "msgs_per_s": n / (t1 - t0),
        "redis_commands_per_msg_worker": worker_cmds / n,
        "round_trips_per_msg_worker": max(0, reads) / n,
        "last_status": last,
    }


async def _streaming(
    url: str, n: int, worker: subprocess.Popen[bytes], progress: Progress | None
) -> dict[str, Any]:
    """reach, streaming: Client.send with STREAM_INFLIGHT in flight while the worker runs."""
    stream = Keys(NS).inbox(AGENT_ID, "normal")
    r = await connect(url)  # the bench's own connection, for polling
    try:
        async with Client(redis_url=url, namespace=NS) as c:
            await c.eligible(CAP)  # the routing view is loaded before the clock starts
            added_before = await entries_added(r, stream)
            load_before = await _server_load(r)
            cpu = CpuMeter(r, worker.pid)
            await cpu.start()
            sent = 0
            every = max(1, n // 20)

            async def sender() -> None:
                nonlocal sent
                while sent < n:
                    i = sent
                    sent += 1
                    await c.send(CAP, {"i": i})
                    if progress and (i + 1) % every == 0:
                        progress("streaming reach: sent", i + 1, n)

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(min(STREAM_INFLIGHT, n)):
                    tg.start_soon(sender)
            t_sent = time.perf_counter()
            await _until_processed(r, stream, GROUP, n, "streaming reach: processed", progress)
            t1 = time.perf_counter()
            used = await cpu.per_msg(n)
            processed = await entries_added(r, stream) - added_before
            load = _per_message(load_before, await _server_load(r), n)
    finally:
        await r.aclose()
    figures = stream_figures(n, t0, t_sent, t1, processed, inflight=STREAM_INFLIGHT)
    return {**figures, **load, **used}


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, from /proc (Linux); None
    elsewhere or when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state is field 3 of stat(5), utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of the three processes of a streaming run: this one (the caller), the
    worker and the Redis server, so a phase reports the CPU each spends per message (on a
    machine whose cores are all busy, throughput is bounded by their sum)."""

    def __init__(self, r: Any, worker_pid: int) -> None:
        self.r = r
        self.worker_pid = worker_pid
        self._start: tuple[float, float | None, float] = (0.0, None, 0.0)

    async def _redis_cpu_s(self) -> float:
        cpu = await self.r.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    async def start(self) -> None:
        self._start = (
            time.process_time(),
            process_cpu_s(self.worker_pid),
            await self._redis_cpu_s(),
        )

    async def per_msg(self, n: int) -> dict[str, float]:
        """µs of CPU per message since :meth:`start`: ``cpu_caller_us``, ``cpu_worker_us``
        (absent when /proc cannot tell), ``cpu_redis_us``."""
        caller0, worker0, redis0 = self._start
        out = {
            "cpu_caller_us": (time.process_time() - caller0) * 1e6 / n,
            "cpu_redis_us": (await self._redis_cpu_s() - redis0) * 1e6 / n,
        }
        worker1 = process_cpu_s(self.worker_pid)
        if worker0 is not None and worker1 is not None:
            out["cpu_worker_us"] = (worker1 - worker0) * 1e6 / n
        return out


async def _server_load(r: AnyRedis) -> tuple[float, int, int]:
    """Redis's CPU seconds so far, its script calls and the requests it has read."""
    cpu = await r.info("cpu")
    calls = await _commandstats(r)
    return (
        float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        calls.get("evalsha", 0) + calls.get("eval", 0),
        await _reads(r),
    )


def _per_message(
    before: tuple[float, int, int], after: tuple[float, int, int], n: int
) -> dict[str, float]:
    """Redis's load of a phase per message (the benchmark's own polling included: a few
    commands a second)."""
    return {
        "redis_cpu_us_per_msg": (after[0] - before[0]) * 1e6 / n,
        "script_calls_per_msg": (after[1] - before[1]) / n,
        "redis_reads_per_msg": (after[2] - before[2]) / n,
    }


async def _streaming_many(
    url: str, n: int, worker: subprocess.Popen[bytes], progress: Progress | None
) -> dict[str, Any]:
    """reach, streaming with Client.send_many: ``FLOOR_BATCH`` messages per call, one call
    at a time (as the floor pipelines its XADDs), while the worker runs."""
    stream = Keys(NS).inbox(AGENT_ID, "normal")
    r = await connect(url)  # the bench's own connection, for polling
    try:
        async with Client(redis_url=url, namespace=NS) as c:
            await c.eligible(CAP)  # the routing view is loaded before the clock starts
            added_before = await entries_added(r, stream)
            cpu = CpuMeter(r, worker.pid)
            await cpu.start()
            t0 = time.perf_counter()
            for start in range(0, n, FLOOR_BATCH):
                out = await c.send_many(
                    CAP, [{"i": i} for i in range(start, min(start + FLOOR_BATCH, n))]
                )
                failed = [x for x in out if isinstance(x, Exception)]
                if failed:
                    raise RuntimeError(f"send_many: {len(failed)} not sent, e.g. {failed[0]!r}")
                if progress:
                    progress("streaming reach send_many: sent", min(start + FLOOR_BATCH, n), n)
            t_sent = time.perf_counter()
            await _until_processed(
                r, stream, GROUP, n, "streaming reach send_many: processed", progress
            )
            t1 = time.perf_counter()
            used = await cpu.per_msg(n)
            processed = await entries_added(r, stream) - added_before
    finally:
        await r.aclose()
    return {**stream_figures(n, t0, t_sent, t1, processed, batch=FLOOR_BATCH), **used}


def stream_figures(
    n: int, t0: float, t_sent: float, t1: float, processed: int, **extra: int
) -> dict[str, Any]:
    return {
        "messages": n,
        **extra,
        "seconds": t1 - t0,
        "send_seconds": t_sent - t0,
        "msgs_per_s": n / (t1 - t0),
        "sent_per_s": n / (t_sent - t0),  # the caller's enqueue rate
        "processed": processed,
    }


async def _latency(
    url: str, n: int, worker: subprocess.Popen[bytes], progress: Progress | None
) -> dict[str, Any]:
    r = await connect(url)  # the bench's own connection, for INFO only
    try:
        async with Client(redis_url=url, namespace=NS) as c:
            for _ in range(WARM_UP):
                await c.request(CAP, 1)
            before, reads_before = await _commandstats(r), await _reads(r)
            samples = []
            every = max(1, n // 20)
            for i in range(n):
                t = time.perf_counter()
                await c.request(CAP, i)
                samples.append((time.perf_counter() - t) * 1000)
                if progress and ((i + 1) % every == 0 or i + 1 == n):
                    progress("requests", i + 1, n)
            after, reads = await _commandstats(r), await _reads(r) - reads_before - 1
    finally:
        await r.aclose()
    cmds = sum(v - before.get(k, 0) for k, v in after.items() if k != "info")
    return {
        "requests": n,
        **_latency_figures(samples),
        # Caller and worker together (heartbeats and the like included).
        "redis_commands_per_request": cmds / n,
        "round_trips_per_request": max(0, reads) / n,
    }


def _latency_figures(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[max(0, int(len(samples) * 0.99) - 1)],
        "mean_ms": statistics.fmean(samples),
    }


# -- the floor: the same workloads on the bare loop ---------------------------------------


Send = Callable[[Any, int, Callable[[int], None]], Awaitable[None]]
"""A floor's streaming caller: send ``n`` messages on client ``r``, ``on_sent(total so
far)`` after each batch."""
Ask = Callable[[bytes, int], Awaitable[bytes]]
"""A floor's request: one request/reply after reply entry ``last`` (message number ``i``);
returns the reply's entry id (the next ``last``)."""


def _streaming_measure(stream: str, group: str, label: str, send: Send) -> Measure:
    """A floor's streaming workload: ``send`` the messages, then wait until ``group`` has
    processed them all; the figures and the CPU per message of each process."""

    async def measure(
        url: str, n: int, worker: subprocess.Popen[bytes], progress: Progress | None
    ) -> dict[str, Any]:
        r: Any = aredis.Redis.from_url(url)
        try:
            every = max(1, n // 20)
            cpu = CpuMeter(r, worker.pid)
            await cpu.start()

            def on_sent(done: int) -> None:
                if progress and (done % every < FLOOR_BATCH or done == n):
                    progress(f"streaming {label}: sent", done, n)

            t0 = time.perf_counter()
            await send(r, n, on_sent)
            t_sent = time.perf_counter()
            await _until_processed(r, stream, group, n, f"streaming {label}: processed", progress)
            t1 = time.perf_counter()
            used = await cpu.per_msg(n)
            processed = await entries_added(r, stream)
        finally:
            await r.aclose()
        return {**stream_figures(n, t0, t_sent, t1, processed, batch=FLOOR_BATCH), **used}

    return measure


def _latency_measure(label: str, ask: Callable[[Any], Ask]) -> Measure:
    """A floor's latency workload: :data:`WARM_UP` requests, then ``n`` timed ones, one at a
    time (``ask(r)`` makes the request function for client ``r``)."""

    async def measure(
        url: str, n: int, worker: subprocess.Popen[bytes], progress: Progress | None
    ) -> dict[str, Any]:
        r: Any = aredis.Redis.from_url(url)
        one = ask(r)
        last = b"0-0"
        try:
            for i in range(WARM_UP):
                last = await one(last, i)
            samples = []
            every = max(1, n // 20)
            for i in range(n):
                t = time.perf_counter()
                last = await one(last, i)
                samples.append((time.perf_counter() - t) * 1000)
                if progress and ((i + 1) % every == 0 or i + 1 == n):
                    progress(f"{label} requests", i + 1, n)
        finally:
            await r.aclose()
        return {"requests": n, **_latency_figures(samples)}

    return measure


def _floor_streaming(stream: str) -> Measure:
    async def send(r: Any, n: int, on_sent: Callable[[int], None]) -> None:
        await floor.stream(
            r, stream, n, batch=FLOOR_BATCH, reply_key=f"{stream}:replies", on_sent=on_sent
        )

    return _streaming_measure(stream, floor.GROUP, "floor", send)


def _floor_latency(stream: str) -> Measure:
    def ask(r: Any) -> Ask:
        async def one(last: bytes, i: int) -> bytes:
            return await floor.request(r, stream, f"{stream}:reply", last, i)

        return one

    return _latency_measure("floor", ask)


# -- the lean floor: the same workloads, keeping the core guarantees -----------------------


def _lean_streaming(stream: str) -> Measure:
    async def send(r: Any, n: int, on_sent: Callable[[int], None]) -> None:
        reply = lean_floor.reply_key(stream, "bench")
        await lean_floor.stream(r, stream, n, batch=FLOOR_BATCH, reply=reply, on_sent=on_sent)

    return _streaming_measure(stream, lean_floor.GROUP, "lean floor", send)


def _lean_latency(stream: str) -> Measure:
    def ask(r: Any) -> Ask:
        sender = lean_floor.Sender(r, stream)
        reply = lean_floor.reply_key(stream, "caller")

        async def one(last: bytes, i: int) -> bytes:
            return await lean_floor.request(r, sender, reply, last, b"%d" % i)

        return one

    return _latency_measure("lean floor", ask)


def _cpu_total(fig: dict[str, Any]) -> float | None:
    parts = [fig.get(k) for k in ("cpu_caller_us", "cpu_worker_us", "cpu_redis_us")]
    if any(p is None for p in parts):
        return None
    return float(sum(p for p in parts if p is not None))

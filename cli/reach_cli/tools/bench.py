"""The messaging benchmark: one Redis, one `reach worker` process (`reach bench`,
`bench/messaging_bench.py`). A tool shipped with the CLI, not part of the library.

It measures
* fire-and-forget throughput on a backlog: N messages are sent to the inbox of the worker
  while it is stopped (SIGSTOP; loading is not timed); after SIGCONT it processes them
  (batch reads, claim, handler, fenced completion, ack + delete): messages/s until the
  inbox is empty;
* request/reply latency with one sequential caller (``Client.request``): p50 / p99;
* Redis commands and round trips per message, for each phase: commands from INFO
  commandstats (those inside scripts included), round trips as the reads Redis processed
  (INFO stats ``total_reads_processed``: one per request or pipeline a client sends), with
  the benchmark's own polling taken out; and the worker's own count of its round trips
  (logged by the runtime when it stops);
* streaming throughput (``stream_messages`` > 0): the worker runs while one caller sends
  with ``Client.send``, ``STREAM_INFLIGHT`` sends in flight; the clock runs from the first
  send until every message is processed (see "processed" below);
* ``Client.send_many`` streaming (with the streaming workload): the same messages sent
  ``FLOOR_BATCH`` per ``send_many`` call, one call at a time, while the worker runs; its
  enqueue rate (messages sent per second of sending) is compared with the floor's
  pipelined XADDs (goal: >= 80 %);
* with ``floor=True``, the floor (:mod:`reach_cli.tools.floor`): the bare redis-py loop on
  Redis Streams, no guarantees, measured in the same run on the same Redis with the same
  two workloads (streaming throughput: XADD pipelined ``FLOOR_BATCH`` per batch, the
  worker replying to each message in one pipeline with the batch's XACK; sequential
  request/reply latency), and reach's figures as ratios to it;
* with ``floor=True`` too, the lean floor (:mod:`reach_cli.tools.lean_floor`): the simplest
  code keeping reach's core guarantees (an idempotency record per message written with its
  inbox entry, claimed at send; a fenced completion storing the result with the reply,
  XACK and XDEL, one Lua call per batch at each end), the same workloads in the same
  rounds, and reach's figures as ratios to it, the CPU per message of each process
  included (the goals of :data:`LEAN_GOALS`); and the lean floor's figures as ratios to
  the bare floor's (what the guarantees cost the simplest code keeping them).

"Processed", for both systems in the streaming workload: the stream's consumer group has
read every entry added and has none pending (XINFO STREAM / XINFO GROUPS, polled every
5 ms once the caller has sent all): reach acknowledges an entry after its fenced
completion (and then deletes it), the floor after its reply.

Each phase has a worker process of its own (started fresh, waited for until it is ready),
so its figures are its own. ``repeat`` runs every phase that many times, the systems
alternating which goes first; the figures are medians of the rounds and each ratio is the
median of the rounds' ratios (a ratio only ever compares two runs of the same round).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis

from reach import Agent, Client, Context, admin
from reach._delivery import CLAIM_AT_SEND_LEASE_MS
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.envelope import Envelope, encode
from reach.errors import ConfigError
from reach.keys import GROUP, Keys
from reach.registry import Registry
from reach.scripts import inbox, run_calls
from reach.signing import Keyring, keygen, make_signer
from reach.tasks import TASK_TTL_MS

from . import floor, lean_floor

NS = "bench"
CAP = "bench.noop"
AGENT_ID = "bench-1"
Progress = Callable[[str, int, int], None]  # (phase, done, total)
WARM_UP = 200  # requests before the latency samples
STREAM_INFLIGHT = 50  # reach's streaming caller: Client.send calls in flight
FLOOR_BATCH = 500  # the floor's streaming caller: XADDs per pipeline
POLL_S = 0.005  # completion polling interval
LOAD_BATCH = 1000  # backlog messages per loading pipeline
Measure = Callable[[str, int, subprocess.Popen[bytes], Progress | None], Awaitable[dict[str, Any]]]


def bench_agent() -> Agent:
    """The benchmark's agent: answers with its payload (the cost is reach's, not the handler's)."""
    app = Agent(AGENT_ID, capabilities=[CAP])

    @app.handler(CAP)
    async def handle(payload: Any, ctx: Context) -> Any:
        return payload

    return app


def _popen(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=err)


def _reach_worker_cmd(url: str, concurrency: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reach_cli.app",
        "worker",
        "reach_cli.tools.bench:bench_agent",
        "--redis-url",
        url,
        "--namespace",
        NS,
        "--concurrency",
        str(concurrency),
        "--log-level",
        "info",
    ]


def _floor_worker_cmd(url: str, stream: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reach_cli.tools.floor",
        "worker",
        "--redis-url",
        url,
        "--stream",
        stream,
    ]


async def _wait_ready(url: str) -> None:
    r = await connect(url)
    try:
        reg = Registry(r, NS)
        with anyio.fail_after(30):
            while not await reg.agents(CAP, ready=True):
                await anyio.sleep(0.02)
    finally:
        await r.aclose()


def _lean_worker_cmd(url: str, stream: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reach_cli.tools.lean_floor",
        "worker",
        "--redis-url",
        url,
        "--stream",
        stream,
    ]


async def _wait_floor_ready(url: str, stream: str) -> None:
    r: Any = aredis.Redis.from_url(url)
    try:
        with anyio.fail_after(30):
            while not await r.get(floor.ready_key(stream)):
                await anyio.sleep(0.02)
    finally:
        await r.aclose()


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


# -- phases and rounds -------------------------------------------------------------------


def _phase(
    url: str,
    cmd: list[str],
    ready: Callable[[], Awaitable[None]],
    log: Path,
    measure: Measure,
    n: int,
    progress: Progress | None,
    stats_prefix: str = "stats: ",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One phase with a worker process of its own: (figures, the worker's own stats, from
    the ``<stats_prefix>{...}`` line it logs when it stops)."""
    w = _popen(cmd, log)
    try:
        anyio.run(ready)
        out = anyio.run(measure, url, n, w, progress)
    except BaseException:
        # The worker's side of a failed phase, for the report (its log is a temporary file).
        tail = log.read_text(errors="replace").strip().splitlines()[-20:]
        print(f"worker log ({log.name}), last lines:", *tail, sep="\n", file=sys.stderr)
        raise
    finally:
        w.send_signal(signal.SIGCONT)
        w.send_signal(signal.SIGTERM)
        try:
            w.wait(timeout=60)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
    m = re.search(re.escape(stats_prefix) + r"(\{.*\})", log.read_text(errors="replace"))
    return out, (json.loads(m.group(1)) if m else {})


def _round(
    url: str,
    tmp: Path,
    k: int,
    *,
    messages: int,
    requests: int,
    stream_messages: int,
    concurrency: int,
    with_floor: bool,
    progress: Progress | None,
) -> dict[str, Any]:
    """Round ``k`` (0-based) of every phase. With the floors, each workload runs on reach,
    the bare floor and the lean floor in that order in even rounds and in the reverse
    order in odd ones, so that no system always runs first (or last) on a warm machine."""
    reach_cmd = _reach_worker_cmd(url, concurrency)

    def ready() -> Awaitable[None]:
        return _wait_ready(url)

    def reach_phase(name: str, measure: Measure, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        log = tmp / f"worker-{name}-{k}.log"
        return _phase(url, reach_cmd, ready, log, measure, n, progress)

    def floor_phase(name: str, make: Callable[[str], Measure], n: int) -> dict[str, Any]:
        stream = f"floor:{name}:{k}"  # a fresh stream (and group) for each run

        def floor_ready() -> Awaitable[None]:
            return _wait_floor_ready(url, stream)

        out, stats = _phase(
            url,
            _floor_worker_cmd(url, stream),
            floor_ready,
            tmp / f"floor-{name}-{k}.log",
            make(stream),
            n,
            progress,
            stats_prefix="floor stats: ",
        )
        return {**out, "worker_stats": stats}

    def lean_phase(name: str, make: Callable[[str], Measure], n: int) -> dict[str, Any]:
        stream = f"lean:{{{name}-{k}}}"  # fresh, its keys under one hash tag

        def lean_ready() -> Awaitable[None]:
            return _wait_floor_ready(url, stream)

        out, stats = _phase(
            url,
            _lean_worker_cmd(url, stream),
            lean_ready,
            tmp / f"lean-{name}-{k}.log",
            make(stream),
            n,
            progress,
            stats_prefix="lean floor stats: ",
        )
        return {**out, "worker_stats": stats}

    def in_order(steps: list[Callable[[], None]]) -> None:
        for step in steps[::-1] if k % 2 else steps:
            step()

    res: dict[str, Any] = {}
    res["throughput"], res["backlog_stats"] = reach_phase("backlog", _throughput, messages)
    if stream_messages:

        def reach_streaming() -> None:
            st, st_stats = reach_phase("streaming", _streaming, stream_messages)
            res["streaming"] = {**st, "worker_stats": st_stats}
            many, many_stats = reach_phase("streaming_many", _streaming_many, stream_messages)
            res["streaming_many"] = {**many, "worker_stats": many_stats}

        def floor_streaming() -> None:
            res["floor_streaming"] = floor_phase("streaming", _floor_streaming, stream_messages)

        def lean_streaming() -> None:
            res["lean_streaming"] = lean_phase("streaming", _lean_streaming, stream_messages)

        in_order([reach_streaming, *([floor_streaming, lean_streaming] if with_floor else [])])

    def reach_latency() -> None:
        res["latency"], res["requests_stats"] = reach_phase("requests", _latency, requests)

    def floor_latency() -> None:
        res["floor_latency"] = floor_phase("requests", _floor_latency, requests)

    def lean_latency() -> None:
        res["lean_latency"] = lean_phase("requests", _lean_latency, requests)

    in_order([reach_latency, *([floor_latency, lean_latency] if with_floor else [])])
    if with_floor:
        res["ratios"] = _ratios(res)
        res["lean_ratios"] = _lean_ratios(res)
        res["guarantee_cost"] = _guarantee_cost(res)
        if stream_messages:
            res["send_many_ratios"] = _send_many_ratios(res)
    return res


def _send_many_ratios(res: dict[str, Any]) -> dict[str, float]:
    """Client.send_many / floor for one round: ``enqueue`` = the callers' enqueue rates
    (messages sent per second of sending; goal >= 0.80), ``throughput`` = processed msgs/s."""
    many, fs = res["streaming_many"], res["floor_streaming"]
    return {
        "enqueue": many["sent_per_s"] / fs["sent_per_s"],
        "throughput": many["msgs_per_s"] / fs["msgs_per_s"],
    }


def _ratios(res: dict[str, Any]) -> dict[str, float]:
    """reach / floor for one round: throughput (higher is better for reach, 1.0 = the
    floor's), p50 and p99 (lower is better, 1.0 = the floor's)."""
    lat, flat = res["latency"], res["floor_latency"]
    out = {
        "p50": lat["p50_ms"] / flat["p50_ms"],
        "p99": lat["p99_ms"] / flat["p99_ms"],
    }
    if "streaming" in res:
        out["throughput"] = res["streaming"]["msgs_per_s"] / res["floor_streaming"]["msgs_per_s"]
    return out


# The goals for reach against the lean floor: (ratio, "min" or "max", goal). CPU
# ratios are per process, per processed message of the streaming workload.
LEAN_GOALS: tuple[tuple[str, str, float], ...] = (
    ("throughput", "min", 0.8),
    ("p50", "max", 1.3),
    ("p99", "max", 1.5),
    ("cpu_caller", "max", 2.0),
    ("cpu_worker", "max", 1.5),
    ("cpu_redis", "max", 1.25),
)


_RATIO_LABELS = {
    "throughput": "throughput",
    "p50": "p50",
    "p99": "p99",
    "cpu_caller": "caller",
    "cpu_worker": "worker",
    "cpu_redis": "Redis",
    "cpu_sum": "CPU sum",
}


def _ratio_set(
    streaming: dict[str, Any] | None,
    latency: dict[str, Any],
    base_streaming: dict[str, Any] | None,
    base_latency: dict[str, Any],
) -> dict[str, float]:
    """One system's figures over another's, for one round: ``throughput`` (processed
    msgs/s; higher is better), ``p50``, ``p99`` and, where both are known and the base is
    not 0, ``cpu_caller``, ``cpu_worker``, ``cpu_redis`` and ``cpu_sum`` (CPU per processed
    message; lower is better)."""
    out = {
        "p50": latency["p50_ms"] / base_latency["p50_ms"],
        "p99": latency["p99_ms"] / base_latency["p99_ms"],
    }
    if streaming is None or base_streaming is None:
        return out
    out["throughput"] = streaming["msgs_per_s"] / base_streaming["msgs_per_s"]
    for part in ("caller", "worker", "redis"):
        a, b = streaming.get(f"cpu_{part}_us"), base_streaming.get(f"cpu_{part}_us")
        if a is not None and b:
            out[f"cpu_{part}"] = a / b
    a_sum, b_sum = _cpu_total(streaming), _cpu_total(base_streaming)
    if a_sum is not None and b_sum:
        out["cpu_sum"] = a_sum / b_sum
    return out


def _lean_ratios(res: dict[str, Any]) -> dict[str, float]:
    """reach / the lean floor for one round (goals: :data:`LEAN_GOALS`)."""
    return _ratio_set(
        res.get("streaming"), res["latency"], res.get("lean_streaming"), res["lean_latency"]
    )


def _guarantee_cost(res: dict[str, Any]) -> dict[str, float]:
    """The lean floor / the bare floor for one round: what keeping the guarantees costs
    the simplest code that keeps them."""
    return _ratio_set(
        res.get("lean_streaming"),
        res["lean_latency"],
        res.get("floor_streaming"),
        res["floor_latency"],
    )


def _median_ratios(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The median of each ratio over the rounds that have it, and the rounds' own."""
    per_round = [r[key] for r in rounds]
    names = {name for x in per_round for name in x}
    return {
        **{
            name: statistics.median(x[name] for x in per_round if name in x)
            for name in sorted(names)
        },
        "rounds": per_round,
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key: the median of the runs' numbers; anything else (and ints that are counts
    the same in every run) as in the last run."""
    out: dict[str, Any] = {}
    for key, last in runs[-1].items():
        values = [r[key] for r in runs if key in r]
        if isinstance(last, float):
            out[key] = statistics.median(values)
        else:
            out[key] = last
    return out


@contextlib.contextmanager
def _signing_env(secret: str | None, ed25519: bool = False) -> Iterator[None]:
    """The signing variables for the run: ``REACH_SECRET`` (HMAC) or an Ed25519 identity
    made for the run (``REACH_IDENTITY_FILE``, ``REACH_TRUSTED_KEYS_FILE``; the worker and
    the callers share it), and ``REACH_REQUIRE_SIGNED``. All unset without either: a
    benchmark without them never signs, whatever the caller's environment."""
    names = (
        "REACH_SECRET",
        "REACH_REQUIRE_SIGNED",
        "REACH_IDENTITY_FILE",
        "REACH_TRUSTED_KEYS_FILE",
    )
    if secret and ed25519:
        raise ConfigError("--secret and --ed25519: choose one signing mode.")
    saved = {n: os.environ.pop(n, None) for n in names}
    tmp = tempfile.TemporaryDirectory(prefix="reach-bench-keys-")
    if secret:
        Keyring.from_option(NS, secret)  # its length checked before anything starts
        os.environ.update(REACH_SECRET=secret, REACH_REQUIRE_SIGNED="1")
    elif ed25519:
        private, line = keygen("bench")
        key, trusted = Path(tmp.name) / "bench.key", Path(tmp.name) / "trusted"
        key.write_text(private)
        key.chmod(0o600)
        trusted.write_text(line)
        os.environ.update(
            REACH_IDENTITY_FILE=str(key),
            REACH_TRUSTED_KEYS_FILE=str(trusted),
            REACH_REQUIRE_SIGNED="1",
        )
    try:
        yield
    finally:
        tmp.cleanup()
        for n, v in saved.items():
            os.environ.pop(n, None)
            if v is not None:
                os.environ[n] = v


def run_bench(
    *,
    messages: int = 30_000,
    requests: int = 3_000,
    concurrency: int = 64,
    stream_messages: int = 0,
    floor: bool = False,
    repeat: int = 1,
    progress: Progress | None = None,
    secret: str | None = None,
    ed25519: bool = False,
) -> dict[str, Any]:
    """Run the whole benchmark on an embedded Redis; returns the figures.

    ``secret``: sign every message with it (HMAC, reach.signing; ``ed25519``: with a key
    pair made for the run instead) and run the worker with
    signatures required (``REACH_SECRET`` and ``REACH_REQUIRE_SIGNED=1`` for the run: the
    worker processes and the clients read them).
    ``stream_messages``: the streaming workload's size (0: not run; needed by ``floor``,
    whose throughput ratio it is). ``floor``: the same workloads on the bare loop, and the
    ratios. ``repeat``: rounds; figures are medians of the rounds."""
    if messages < 1 or requests < 1:
        raise ConfigError("messages and requests must be >= 1")
    if stream_messages < 0:
        raise ConfigError("--stream-messages (stream_messages) must be >= 0 (0: no streaming).")
    if floor and stream_messages < 1:
        raise ConfigError(
            "The floor needs the streaming workload: --stream-messages (stream_messages) >= 1."
        )
    if repeat < 1:
        raise ConfigError("--repeat must be >= 1.")
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    with (
        _signing_env(secret, ed25519),
        RedisServer() as server,
        tempfile.TemporaryDirectory(prefix="reach-bench-") as tmp,
    ):
        for k in range(repeat):

            def tagged(phase: str, done: int, total: int, k: int = k) -> None:
                assert progress is not None
                progress(f"[{k + 1}/{repeat}] {phase}" if repeat > 1 else phase, done, total)

            rounds.append(
                _round(
                    server.url,
                    Path(tmp),
                    k,
                    messages=messages,
                    requests=requests,
                    stream_messages=stream_messages,
                    concurrency=concurrency,
                    with_floor=floor,
                    progress=tagged if progress else None,
                )
            )
    last = rounds[-1]
    tp = medians([r["throughput"] for r in rounds])
    lat = medians([r["latency"] for r in rounds])
    tp_stats, lat_stats = last["backlog_stats"], last["requests_stats"]
    if "round_trips" in tp_stats:
        tp["worker_own_round_trips_per_msg"] = tp_stats["round_trips"] / messages
    if "round_trips" in lat_stats:
        lat["worker_own_round_trips_per_request"] = lat_stats["round_trips"] / (requests + WARM_UP)
    out: dict[str, Any] = {
        "throughput": tp,
        "latency": lat,
        "worker_stats": {"backlog": tp_stats, "requests": lat_stats},
        "redis": f"{server.binary.origin} {server.binary.version_str}",
        "cpus": os.cpu_count(),
        "concurrency": concurrency,
        "repeat": repeat,
        # The 1-minute load average before and after: a loaded machine shows here.
        "load_avg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "signed": "hmac" if secret else "ed25519" if ed25519 else "",
    }
    if stream_messages:
        out["streaming"] = medians([r["streaming"] for r in rounds])
        out["send_many"] = medians([r["streaming_many"] for r in rounds])
        if floor:
            many_ratios = [r["send_many_ratios"] for r in rounds]
            out["send_many"]["ratios"] = {
                key: statistics.median(x[key] for x in many_ratios) for key in many_ratios[-1]
            }
    if floor:
        ratios = [r["ratios"] for r in rounds]
        out["floor"] = {
            "streaming": medians([r["floor_streaming"] for r in rounds]),
            "latency": medians([r["floor_latency"] for r in rounds]),
        }
        out["ratios"] = {
            **{key: statistics.median(x[key] for x in ratios) for key in ratios[-1]},
            "rounds": ratios,
        }
        out["lean_floor"] = {
            "streaming": medians([r["lean_streaming"] for r in rounds]),
            "latency": medians([r["lean_latency"] for r in rounds]),
        }
        out["lean_ratios"] = _median_ratios(rounds, "lean_ratios")
        out["guarantee_cost"] = _median_ratios(rounds, "guarantee_cost")
    if repeat > 1:
        out["rounds"] = [
            {
                key: {f: v for f, v in fig.items() if f != "worker_stats"}
                for key, fig in r.items()
                if key
                in (
                    "throughput",
                    "latency",
                    "streaming",
                    "streaming_many",
                    "floor_streaming",
                    "floor_latency",
                    "lean_streaming",
                    "lean_latency",
                )
            }
            for r in rounds
        ]
    return out


def format_report(out: dict[str, Any]) -> str:
    tp, lat = out["throughput"], out["latency"]
    rounds = out.get("repeat", 1)
    med = f" (medians of {rounds} rounds)" if rounds > 1 else ""
    load = out.get("load_avg_1m")
    lines = [
        f"redis {out['redis']}, {out['cpus']} cpus, worker concurrency {out['concurrency']}"
        + (f", load average {load[0]} -> {load[1]}" if load else "")
        + (f", messages signed ({out['signed']}), signatures required" if out.get("signed") else "")
        + med,
        (
            f"fire-and-forget backlog of {tp['messages']} msgs processed in "
            f"{tp['seconds']:.2f}s = {tp['msgs_per_s']:,.0f} msgs/s "
            f"(loading it took {tp['load_seconds']:.2f}s)"
        ),
        (
            f"  per msg, worker: {tp['redis_commands_per_msg_worker']:.2f} Redis commands, "
            f"{tp['round_trips_per_msg_worker']:.3f} round trips"
        ),
        (
            f"request/reply, 1 sequential caller, {lat['requests']} requests: p50 "
            f"{lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms, mean {lat['mean_ms']:.3f} ms"
        ),
        (
            f"  per request, caller and worker: {lat['redis_commands_per_request']:.2f} Redis "
            f"commands, {lat['round_trips_per_request']:.2f} round trips"
        ),
    ]
    st = out.get("streaming")
    if st:
        lines.append(
            f"streaming, 1 caller (Client.send, {st['inflight']} in flight) and the worker at "
            f"once, {st['messages']} msgs: {st['msgs_per_s']:,.0f} msgs/s processed "
            f"({st['seconds']:.2f}s; sent in {st['send_seconds']:.2f}s)"
        )
        if "redis_cpu_us_per_msg" in st:
            lines.append(
                f"  per msg, Redis: {st['redis_cpu_us_per_msg']:.1f} µs of CPU, "
                f"{st['script_calls_per_msg']:.2f} script calls, "
                f"{st['redis_reads_per_msg']:.2f} requests read (caller and worker)"
            )
        lines += _cpu_line(st)
    many = out.get("send_many")
    if many:
        lines.append(
            f"streaming, 1 caller (Client.send_many, {many['batch']} per call) and the worker "
            f"at once, {many['messages']} msgs: {many['msgs_per_s']:,.0f} msgs/s processed "
            f"({many['seconds']:.2f}s; sent in {many['send_seconds']:.2f}s = "
            f"{many['sent_per_s']:,.0f} msgs/s enqueued)"
        )
        lines += _cpu_line(many)
    fl = out.get("floor")
    if fl:
        fs, flat, ra = fl["streaming"], fl["latency"], out["ratios"]
        lines += [
            "floor (bare redis-py on Streams, no guarantees; same Redis, same run):",
            (
                f"  streaming, XADD pipelined {fs['batch']} per batch, a reply XADD + XACK per "
                f"message, {fs['messages']} msgs: "
                f"{fs['msgs_per_s']:,.0f} msgs/s processed ({fs['seconds']:.2f}s)"
            ),
            *_cpu_line(fs),
            (
                f"  request/reply, {flat['requests']} requests: p50 {flat['p50_ms']:.3f} ms, "
                f"p99 {flat['p99_ms']:.3f} ms"
            ),
            (
                f"reach / floor: throughput {ra['throughput']:.2f}x (goal >= 0.90), p50 "
                f"{ra['p50']:.2f}x (goal <= 1.5), p99 {ra['p99']:.2f}x (goal <= 2)"
                + (" (medians of the rounds' ratios)" if rounds > 1 else "")
            ),
        ]
        ceiling = _cpu_ceiling(st, fs) if st else None
        if ceiling is not None:
            lines.append(
                f"CPU per processed msg, caller + worker + Redis: reach (Client.send) "
                f"{ceiling[0]:.1f} µs, floor {ceiling[1]:.1f} µs: with every core busy, reach "
                f"can do at most {ceiling[1] / ceiling[0]:.2f}x the floor's throughput"
            )
        mr = (many or {}).get("ratios")
        if mr:
            lines.append(
                f"send_many / floor: enqueue rate {mr['enqueue']:.2f}x (goal >= 0.80; floor "
                f"{fs['sent_per_s']:,.0f} msgs/s enqueued), throughput {mr['throughput']:.2f}x"
            )
    lean = out.get("lean_floor")
    if lean:
        lines += _lean_report(out, lean, st, fl, rounds)
    return "\n".join(lines)


def _lean_report(
    out: dict[str, Any],
    lean: dict[str, Any],
    st: dict[str, Any] | None,
    fl: dict[str, Any] | None,
    rounds: int,
) -> list[str]:
    """The lean floor's lines of the report: its figures, reach / lean floor with the
    goals, lean floor / bare floor, and the CPU table of the three systems."""
    ls, llat = lean["streaming"], lean["latency"]
    lr, gc = out["lean_ratios"], out["guarantee_cost"]
    med = " (medians of the rounds' ratios)" if rounds > 1 else ""
    lines = [
        (
            "lean floor (the simplest code keeping reach's core guarantees: an idempotency "
            "record per message claimed at send, a fenced completion storing the result "
            "with the reply, XACK and XDEL; same Redis, same run):"
        ),
        (
            f"  streaming, one send Lua call per {ls['batch']} msgs (XADD + record each), one "
            f"completion Lua call per XREADGROUP of {lean_floor.READ_COUNT}, "
            f"{ls['messages']} msgs: {ls['msgs_per_s']:,.0f} msgs/s processed "
            f"({ls['seconds']:.2f}s)"
        ),
        *_cpu_line(ls),
        (
            f"  request/reply, {llat['requests']} requests: p50 {llat['p50_ms']:.3f} ms, "
            f"p99 {llat['p99_ms']:.3f} ms"
        ),
    ]
    goals = []
    for name, way, goal in LEAN_GOALS:
        if name in lr:
            met = lr[name] >= goal if way == "min" else lr[name] <= goal
            sign = ">=" if way == "min" else "<="
            goals.append(
                f"{_RATIO_LABELS[name]} {lr[name]:.2f}x (goal {sign} {goal:g}"
                + (", met)" if met else ")")
            )
    half = 3  # throughput and latency, then the CPU of each process
    lines.append("reach / lean floor: " + ", ".join(goals[:half]) + med)
    if goals[half:]:
        lines.append(
            "  CPU per processed msg: "
            + ", ".join(goals[half:])
            + (f", sum {lr['cpu_sum']:.2f}x" if "cpu_sum" in lr else "")
        )
    cost = [
        f"{_RATIO_LABELS[k]} {gc[k]:.2f}x"
        for k in ("throughput", "p50", "p99", "cpu_sum")
        if k in gc
    ]
    lines.append("lean floor / bare floor (what the guarantees cost): " + ", ".join(cost) + med)
    table = [
        ("reach (Client.send)", st),
        ("bare floor", fl["streaming"] if fl else None),
        ("lean floor", ls),
    ]
    if all(fig is not None and _cpu_total(fig) is not None for _, fig in table):
        lines.append(
            f"  {'CPU µs per processed msg':<26}{'caller':>8}{'worker':>8}{'Redis':>8}{'sum':>8}"
        )
        for label, fig in table:
            assert fig is not None
            lines.append(
                f"  {label:<26}{fig['cpu_caller_us']:>8.1f}{fig['cpu_worker_us']:>8.1f}"
                f"{fig['cpu_redis_us']:>8.1f}{_cpu_total(fig) or 0.0:>8.1f}"
            )
    return lines


def _cpu_total(fig: dict[str, Any]) -> float | None:
    parts = [fig.get(k) for k in ("cpu_caller_us", "cpu_worker_us", "cpu_redis_us")]
    if any(p is None for p in parts):
        return None
    return float(sum(p for p in parts if p is not None))


def _cpu_line(fig: dict[str, Any]) -> list[str]:
    """The CPU line of a streaming figure ([] when the worker's CPU is unknown)."""
    total = _cpu_total(fig)
    if total is None:
        return []
    line = (
        f"  CPU per msg: caller {fig['cpu_caller_us']:.1f} µs, worker "
        f"{fig['cpu_worker_us']:.1f} µs, Redis {fig['cpu_redis_us']:.1f} µs (sum {total:.1f} µs)"
    )
    return [line]


def _cpu_ceiling(reach: dict[str, Any], fl: dict[str, Any]) -> tuple[float, float] | None:
    """(reach's, the floor's) CPU per message of the three processes together, when known:
    on a machine whose cores all run the benchmark, throughput is at most cores / that sum,
    so the floor's sum / reach's bounds the throughput ratio however the work overlaps."""
    a, b = _cpu_total(reach), _cpu_total(fl)
    return None if a is None or b is None else (a, b)


HELP_EPILOG = """\
The floors (--floor): the same workloads on two redis-py loops on Redis Streams.
The bare floor, with none of reach's guarantees (reach_cli.tools.floor): the caller
pipelines XADD 500 per batch; its worker process reads XREADGROUP COUNT 100 and answers
each batch with one pipeline (a reply XADD per message, one XACK). The lean floor, the
simplest code keeping reach's core guarantees (reach_cli.tools.lean_floor): one Lua call
per 500 messages adds each inbox entry with its idempotency record (pending, claimed at
send, fence 1, 24 h TTL); its worker process reads XREADGROUP COUNT 100 and completes each
batch in one Lua call (fence check, result into the record, reply XADD with its TTL, XACK,
XDEL). All three systems run in the same invocation on the same Redis, each phase with a
fresh worker process, in alternating order between rounds, and reach's figures are
printed as ratios to each floor's: throughput = reach msgs/s / floor msgs/s (streaming
workload), p50 and p99 = reach's latency / the floor's, and against the lean floor the
CPU per processed message of each process (caller, worker, Redis) with the goals: throughput
>= 0.8, p50 <= 1.3, p99 <= 1.5, CPU caller <= 2, worker <= 1.5, Redis <= 1.25. Numbers
from separate runs are never compared.
"""


def progress_lines() -> Progress:
    """A progress callback for the plain scripts: a line on stderr at every tenth of a
    phase and at its end (phases that poll report the same count often)."""
    shown: dict[str, int] = {}  # phase -> the last count printed

    def progress(phase: str, done: int, total: int) -> None:
        before = shown.get(phase, -1)
        step = max(1, total // 10)
        if done != before and (done == total or done // step > max(before, 0) // step):
            shown[phase] = done
            print(f"{phase} {done}/{total}", file=sys.stderr, flush=True)

    return progress


def main(argv: Sequence[str] | None = None) -> int:
    """`python bench/messaging_bench.py` (plain progress lines on stderr)."""
    ap = argparse.ArgumentParser(
        prog="messaging_bench",
        description=__doc__,
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--messages", type=int, default=30_000, help="backlog messages")
    ap.add_argument("--requests", type=int, default=3_000, help="sequential request/replies")
    ap.add_argument(
        "--stream-messages",
        type=int,
        default=20_000,
        help="messages of the streaming workload (0: skip it; not with --floor)",
    )
    ap.add_argument("--concurrency", type=int, default=64, help="the reach worker's handlers")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also measure the bare floor (no guarantees) and the lean floor (the core "
        "guarantees kept)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="rounds; figures are medians")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--secret",
        default=None,
        help="sign every message with this secret (HMAC) and require signatures on the "
        "worker, to compare with a run without",
    )
    ap.add_argument(
        "--ed25519",
        action="store_true",
        help="the same with an Ed25519 key pair made for the run (needs cryptography)",
    )
    a = ap.parse_args(argv)

    progress = progress_lines()

    try:
        out = run_bench(
            messages=a.messages,
            requests=a.requests,
            stream_messages=a.stream_messages,
            concurrency=a.concurrency,
            floor=a.floor,
            repeat=a.repeat,
            progress=progress,
            secret=a.secret,
            ed25519=a.ed25519,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2) if a.json else format_report(out))
    return 0

"""Scaling figures (``bench/scaling_bench.py``): how reach's throughput moves with worker
processes, with agents sharing a capability and with payload size, and what a 10,000-way
fan-out from one caller costs. A tool shipped with the CLI, not part of the library.

Every run has an embedded Redis of the benchmark's own (:class:`reach.embedded.RedisServer`
on a free port), a fresh namespace, and worker processes started for it alone (stopped,
and the Redis flushed, before the next run). The figure sets:

* ``workers`` -- 1, 2 and 4 worker processes, each a real ``reach worker`` process
  (``python -m reach_cli.app worker reach_cli.tools.scaling:scaling_agent``) serving one
  agent (``scale-1``, ``scale-2``...; the id comes from ``REACH_SCALING_AGENT_ID``) of the
  capability ``scaling.noop``;
* ``agents`` -- 1, 10 and 100 agents sharing ``scaling.noop``, hosted in a fixed number
  of processes (``agent_processes``, default 1; the agents are dealt to them in turn), so
  that the figure shows what spreading one capability over many agents costs (routing
  over more candidates, thinner batches per inbox, more heartbeats, sweepers and blocked
  reads) and not what more CPUs give (that is the ``workers`` set). ``reach worker`` runs
  one agent a process; a hundred processes would measure a 2-core machine's scheduler,
  so the agents are hosted by ``python -m reach_cli.tools.scaling host``: one event loop
  running several :meth:`reach.Agent.run` side by side, each with its own connections,
  heartbeat thread and ``concurrency`` handlers, as separate ``reach worker`` processes
  would have;
* ``payloads`` -- one ``reach worker`` process, payloads of 1 KB and 64 KB (the msgpack
  encoding of ``{"i": i, "pad": <bytes>}``, padded to the size); a run sends at most
  ``payload_mib`` MiB (20,000 x 1 KB, 3,200 x 64 KB by default);
* ``fanout`` -- one ``reach worker`` process and a caller process of its own
  (``python -m reach_cli.tools.scaling fanout``: its RSS is its own) that starts one
  :class:`reach.Client`, makes one request (the routing view and the reply reader are
  then up), then starts 10,000 ``Client.request`` calls at once in one anyio task group.
  Reported: the time until every call has returned (answered or failed), the calls
  answered and the errors by type (the harness never stops on them: what a Client does
  past its limits is a figure too), the caller's max RSS (``resource.getrusage``) before
  and after the fan-out, and the connections Redis saw from the caller: ``CLIENT LIST``
  on the benchmark's Redis, polled by this process every ``CLIENT_LIST_EVERY_S`` while
  the caller runs, counting the connections whose client address is one of the caller
  process's sockets (from ``/proc``; on a system without it, those named after the
  caller's client id), at the most at once and in all.

The throughput workload is the streaming workload of ``reach bench``
(:mod:`reach_cli.tools.bench`): one caller (this process) sending with ``Client.send``,
``STREAM_INFLIGHT`` (50) sends in flight, while the workers run; the clock runs from the
first send until the inboxes are drained: every agent's inbox streams are empty
(:func:`reach.admin.queue_depths`, polled every 5 ms once everything is sent; reach
acknowledges an entry after its fenced completion and then deletes it). "Processed" is
the number of entries added to the inboxes during the run, and the consumer groups must
have nothing pending at the end (``unacked``). The handler returns the message's index
(a small result whatever the payload's size, so the payload figure is the cost of
carrying the payload in). Worker concurrency is ``concurrency`` handlers per agent. Each
run also reports the CPU seconds that the caller, the worker processes and Redis spent
during it (``cpu_s``): on a machine with fewer cores than processes they say which one
was the limit.

``repeat`` runs every figure set that many times (odd rounds in reverse order, so that a
drift of the machine's load does not always favour one end); figures are medians of the
rounds. The machine's 1-minute load average before and after is part of the output.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from reach import Agent, Client, Context, admin
from reach.connection import connect
from reach.embedded import RedisServer
from reach.envelope import encode_payload
from reach.errors import ConfigError
from reach.keys import GROUP, Keys
from reach.registry import Registry

from . import floor
from .bench import (
    POLL_S,
    STREAM_INFLIGHT,
    Progress,
    entries_added,
    medians,
    progress_lines,
    stream_figures,
)

CAP = "scaling.noop"
AGENT_ENV = "REACH_SCALING_AGENT_ID"  # the agent id of a `reach worker` process
SETS = ("workers", "agents", "payloads", "fanout")
WORKERS = (1, 2, 4)
AGENTS = (1, 10, 100)
PAYLOAD_BYTES = (1024, 65536)
FANOUT = 10_000
CLIENT_LIST_EVERY_S = 0.02  # how often CLIENT LIST is read while the fan-out caller runs
READY_TIMEOUT_S = 120.0  # 100 agents in one process on a loaded 2-core machine take a while
DRAIN_TIMEOUT_S = 600.0
FANOUT_CONNECTIONS_GOAL = 8  # issue 11: a 10,000-way fan-out from one Client, <= 8 connections


# -- the agent ----------------------------------------------------------------------------


def make_agent(agent_id: str) -> Agent:
    """An agent of ``scaling.noop`` whose handler returns the message's index (small
    whatever the payload's size)."""
    app = Agent(agent_id, capabilities=[CAP])

    @app.handler(CAP)
    async def handle(payload: Any, ctx: Context) -> Any:
        return payload.get("i") if isinstance(payload, dict) else None

    return app


def scaling_agent() -> Agent:
    """The ``reach worker`` target: :func:`make_agent` of ``$REACH_SCALING_AGENT_ID``."""
    return make_agent(os.environ.get(AGENT_ENV, "scale-1"))


def payload_pad(size: int) -> bytes:
    """The padding that makes ``{"i": i, "pad": pad}`` encode to about ``size`` bytes (exactly
    for i < 128; a few bytes more for larger indexes). 0: no padding field at all."""
    if size <= 0:
        return b""
    pad = max(0, size - len(encode_payload({"i": 0, "pad": b""})))
    while pad and len(encode_payload({"i": 0, "pad": b"\0" * pad})) > size:
        pad -= 1  # the bin header grows with the length
    return b"\0" * pad


def _payload(i: int, pad: bytes) -> dict[str, Any]:
    return {"i": i, "pad": pad} if pad else {"i": i}


# -- processes ----------------------------------------------------------------------------


def _worker_cmd(url: str, ns: str, concurrency: int) -> list[str]:
    return [
        sys.executable, "-m", "reach_cli.app", "worker", "reach_cli.tools.scaling:scaling_agent",
        "--redis-url", url, "--namespace", ns, "--concurrency", str(concurrency),
        "--log-level", "info",
    ]  # fmt: skip


def _host_cmd(url: str, ns: str, agent_ids: Sequence[str], concurrency: int) -> list[str]:
    return [
        sys.executable, "-m", "reach_cli.tools.scaling", "host", "--redis-url", url,
        "--namespace", ns, "--agents", ",".join(agent_ids), "--concurrency", str(concurrency),
    ]  # fmt: skip


class _Procs:
    """Worker processes of one run and their logs."""

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        with open(log, "wb") as err:
            p = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env or None
            )
        self.procs.append((p, log))

    def check_alive(self) -> None:
        for p, log in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"worker process exited with {p.returncode}: {_tail(log)}")

    def stop(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, _ in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stats(self) -> dict[str, int]:
        """The workers' own counts (``stats: {...}`` lines, one per agent), summed."""
        total: Counter[str] = Counter()
        for _, log in self.procs:
            for m in re.finditer(r"stats: (\{.*\})", log.read_text(errors="replace")):
                total.update(
                    {k: v for k, v in json.loads(m.group(1)).items() if isinstance(v, int)}
                )
        return dict(total)

    def tails(self) -> str:
        return "\n".join(f"{log.name}: {_tail(log)}" for _, log in self.procs)


def _tail(log: Path, lines: int = 15) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return "\n".join(text[-lines:])


@contextmanager
def _processes() -> Iterator[_Procs]:
    procs = _Procs()
    try:
        yield procs
    finally:
        procs.stop()


async def _wait_ready(url: str, ns: str, n_agents: int, procs: _Procs) -> None:
    """Until ``n_agents`` agents of the capability are registered and ready."""
    r = await connect(url)
    try:
        reg = Registry(r, ns)
        with anyio.fail_after(READY_TIMEOUT_S):
            while len(await reg.agents(CAP, ready=True)) < n_agents:
                procs.check_alive()
                await anyio.sleep(0.05)
    finally:
        await r.aclose()


async def _flush(url: str) -> None:
    """Empty the benchmark's own Redis between runs (each run starts from nothing)."""
    r: Any = await connect(url)
    try:
        await r.flushdb()
    finally:
        await r.aclose()


# -- throughput ---------------------------------------------------------------------------


class _Drain:
    """Whether the inboxes of ``agent_ids`` are drained, polled: each poll asks only about
    the inboxes not yet seen empty (so that polling 100 inboxes every few ms does not
    load Redis), and all of them again before answering 0 (an evicted agent's inbox may
    be moved to another)."""

    def __init__(self, keys: Keys, agent_ids: list[str]) -> None:
        self.keys = keys
        self.all = list(agent_ids)
        self.left = list(agent_ids)

    async def entries_left(self, r: Any) -> int:
        """Entries in the inboxes not seen empty (0: every inbox is empty)."""
        while True:
            depths = await admin.queue_depths(r, self.keys, self.left)
            self.left = [a for a in self.left if sum(depths[a].values())]
            if self.left:
                return sum(sum(depths[a].values()) for a in self.left)
            if len(depths) == len(self.all):
                return 0
            self.left = list(self.all)  # the final check: every inbox


async def _throughput(
    url: str,
    ns: str,
    agent_ids: list[str],
    n: int,
    pad: bytes,
    label: str,
    worker_pids: list[int],
    check_alive: Callable[[], None],
    progress: Progress | None,
) -> dict[str, Any]:
    """One caller sends ``n`` messages (``STREAM_INFLIGHT`` in flight) while the workers
    run; the clock stops when the inboxes are drained. Also the CPU seconds the caller,
    the workers and Redis spent meanwhile (on a small machine they show which one was the
    limit)."""
    keys = Keys(ns)
    inboxes = {a: keys.inbox(a, "normal") for a in agent_ids}
    r = await connect(url)  # the benchmark's own connection, for polling
    try:
        async with Client(redis_url=url, namespace=ns) as c:
            with anyio.fail_after(30):  # the routing view sees every agent
                while len(await c.eligible(CAP)) < len(agent_ids):
                    await anyio.sleep(0.1)
            added_before = {a: await entries_added(r, s) for a, s in inboxes.items()}
            sent = 0
            errors: Counter[str] = Counter()
            first_error = ""
            every = max(1, n // 20)

            async def sender() -> None:
                nonlocal sent, first_error
                while sent < n:
                    i = sent
                    sent += 1
                    try:
                        await c.send(CAP, _payload(i, pad))
                    except Exception as e:  # noqa: BLE001 - counted and reported, not fatal
                        errors[type(e).__name__] += 1
                        first_error = first_error or f"{type(e).__name__}: {e}"
                    if progress and (i + 1) % every == 0:
                        progress(f"{label}: sent", i + 1, n)

            cpu0 = await _cpu(r, worker_pids)
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(min(STREAM_INFLIGHT, n)):
                    tg.start_soon(sender)
            t_sent = time.perf_counter()
            drain = _Drain(keys, agent_ids)
            with anyio.fail_after(DRAIN_TIMEOUT_S):
                while True:
                    left = await drain.entries_left(r)
                    if progress:
                        progress(f"{label}: processed", max(0, n - left), n)
                    if left == 0:
                        break
                    check_alive()  # a dead worker's inbox would never drain
                    await anyio.sleep(POLL_S)
            t1 = time.perf_counter()
            cpu1 = await _cpu(r, worker_pids)
            per_agent = [await entries_added(r, s) - added_before[a] for a, s in inboxes.items()]
            unacked = 0
            for s in inboxes.values():
                unacked += await floor.remaining(r, s, GROUP) if await r.exists(s) else 0
    finally:
        await r.aclose()
    processed = sum(per_agent)
    out = stream_figures(n, t0, t_sent, t1, processed, inflight=STREAM_INFLIGHT)
    out["msgs_per_s"] = processed / (t1 - t0)  # = n / seconds unless sends failed
    out["unacked"] = unacked
    out["send_errors"] = dict(errors)
    if first_error:
        out["first_error"] = first_error
    # How evenly routing spread the messages: the least and most any agent got.
    out["per_agent_min"], out["per_agent_max"] = min(per_agent), max(per_agent)
    out["cpu_s"] = {k: _minus(cpu1[k], cpu0[k]) for k in cpu0}
    return out


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


async def _cpu(r: Any, worker_pids: list[int]) -> dict[str, float | None]:
    """CPU seconds (user + system) used so far by this process (the caller), the worker
    processes (Linux ``/proc``; None elsewhere) and Redis (``INFO cpu``)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    info = await r.info("cpu")
    workers: float | None = 0.0
    for pid in worker_pids:
        t = _proc_cpu_s(pid)
        workers = None if t is None or workers is None else workers + t
    return {
        "caller": me.ru_utime + me.ru_stime,
        "workers": workers,
        "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
    }


def _proc_cpu_s(pid: int) -> float | None:
    """CPU seconds of process ``pid`` (utime + stime of ``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _run_throughput(
    url: str,
    tmp: Path,
    name: str,
    *,
    label: str,
    processes: list[list[str]],
    n_agents: int,
    n: int,
    pad: bytes,
    progress: Progress | None,
    agent_envs: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Start ``processes`` (with ``n_agents`` agents among them), run the throughput
    workload, stop them; the figures plus the workers' own counts. ``name``: the run's
    namespace and log files; ``label``: its name in progress lines."""
    ns = f"scaling-{name}"
    agent_ids = [f"scale-{i + 1}" for i in range(n_agents)]
    with _processes() as procs:
        for i, cmd in enumerate(processes):
            env = agent_envs[i] if agent_envs else None
            procs.start(cmd, tmp / f"{name}-{i}.log", env)
        try:
            anyio.run(_wait_ready, url, ns, n_agents, procs)
            pids = [p.pid for p, _ in procs.procs]
            out = anyio.run(
                _throughput, url, ns, agent_ids, n, pad, label, pids, procs.check_alive, progress
            )
        except BaseException:
            print(f"{name}: worker logs, last lines:\n{procs.tails()}", file=sys.stderr)
            raise
    out["worker_stats"] = procs.stats()
    anyio.run(_flush, url)
    return out


def _workers_run(
    url: str,
    tmp: Path,
    k: int,
    workers: int,
    *,
    n: int,
    concurrency: int,
    progress: Progress | None,
) -> dict[str, Any]:
    ns = f"workers-{workers}-{k}"
    cmd = _worker_cmd(url, f"scaling-{ns}", concurrency)
    envs = [{**os.environ, AGENT_ENV: f"scale-{i + 1}"} for i in range(workers)]
    out = _run_throughput(
        url, tmp, ns, label=f"{workers} worker process(es)", processes=[cmd] * workers,
        n_agents=workers, n=n, pad=b"", progress=progress, agent_envs=envs,
    )  # fmt: skip
    return {"workers": workers, "agents": workers, **out}


def _agents_run(
    url: str,
    tmp: Path,
    k: int,
    agents: int,
    *,
    n: int,
    concurrency: int,
    agent_processes: int,
    progress: Progress | None,
) -> dict[str, Any]:
    ns = f"agents-{agents}-{k}"
    ids = [f"scale-{i + 1}" for i in range(agents)]
    nproc = min(agents, agent_processes)
    cmds = [_host_cmd(url, f"scaling-{ns}", ids[p::nproc], concurrency) for p in range(nproc)]
    out = _run_throughput(
        url, tmp, ns, label=f"{agents} agent(s)", processes=cmds, n_agents=agents, n=n,
        pad=b"", progress=progress,
    )  # fmt: skip
    return {"agents": agents, "processes": nproc, **out}


def _payload_run(
    url: str,
    tmp: Path,
    k: int,
    size: int,
    *,
    n: int,
    concurrency: int,
    progress: Progress | None,
) -> dict[str, Any]:
    ns = f"payload-{size}-{k}"
    pad = payload_pad(size)
    cmd = _worker_cmd(url, f"scaling-{ns}", concurrency)
    env = {**os.environ, AGENT_ENV: "scale-1"}
    out = _run_throughput(
        url, tmp, ns, label=f"{size}-byte payloads", processes=[cmd], n_agents=1, n=n,
        pad=pad, progress=progress, agent_envs=[env],
    )  # fmt: skip
    encoded = len(encode_payload(_payload(0, pad)))
    return {
        "payload_bytes": size,
        "encoded_payload_bytes": encoded,
        **out,
        "payload_mib_per_s": out["msgs_per_s"] * encoded / 2**20,
    }


# -- fan-out ------------------------------------------------------------------------------


def _max_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (ru_maxrss: KB on Linux, bytes
    on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


async def fanout_caller(
    url: str, ns: str, n: int, *, client_id: str, timeout_s: float
) -> dict[str, Any]:
    """The fan-out caller's side (its own process): one Client, one warm-up request, then
    ``n`` concurrent requests. Errors are counted by type, never raised."""
    out: dict[str, Any] = {"requests": n, "rss_start_mb": _max_rss_mb()}
    errors: Counter[str] = Counter()
    first_error = ""
    answered = 0
    try:
        async with Client(
            redis_url=url, namespace=ns, client_id=client_id, default_timeout_s=timeout_s
        ) as c:
            await c.request(CAP, {"i": -1})
            out["rss_before_mb"] = _max_rss_mb()
            ru0 = resource.getrusage(resource.RUSAGE_SELF)

            async def one(i: int) -> None:
                nonlocal answered, first_error
                try:
                    await c.request(CAP, {"i": i})
                    answered += 1
                except Exception as e:  # noqa: BLE001 - counted and reported, not fatal
                    errors[type(e).__name__] += 1
                    first_error = first_error or f"{type(e).__name__}: {e}"

            out["t_start"] = time.time()  # wall clock: the parent's CLIENT LIST samples
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
            t1 = time.perf_counter()
            out["t_end"] = time.time()
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            out["seconds"] = t1 - t0
            out["answered_per_s"] = answered / (t1 - t0)
            out["caller_cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    except Exception as e:  # noqa: BLE001 - the client could not start or close: say so
        out["error"] = f"{type(e).__name__}: {e}"
    out["answered"] = answered
    out["errors"] = dict(errors)
    if first_error:
        out["first_error"] = first_error
    out["rss_max_mb"] = _max_rss_mb()
    return out


def _socket_ports(pid: int) -> set[int] | None:
    """The local TCP ports of ``pid``'s sockets (Linux ``/proc``); None without /proc."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        ports = set()
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9 and cols[9] in inodes:
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        return ports
    except OSError:
        return None


async def _sample_connections(
    url: str,
    caller: subprocess.Popen[bytes],
    client_id: str,
    limit_s: float,
    worker_pids: list[int],
) -> dict[str, Any]:
    """Read CLIENT LIST until the caller exits (or ``limit_s`` has passed): the caller's
    connections (by its sockets' addresses, else by its client name) at each sample; and
    the CPU seconds the workers and Redis spent meanwhile."""
    r: Any = await connect(url)
    samples: list[tuple[float, int]] = []
    ids: set[str] = set()
    by = "address"
    received0 = int((await r.info("stats"))["total_connections_received"])
    cpu0 = await _cpu(r, worker_pids)
    try:
        deadline = time.monotonic() + limit_s
        while caller.poll() is None and time.monotonic() < deadline:
            ports = _socket_ports(caller.pid)
            clients = await r.client_list()
            if ports is None:
                by = "name"
                mine = [x for x in clients if client_id in str(x.get("name", ""))]
            else:
                mine = [x for x in clients if _port(x.get("addr", "")) in ports]
            samples.append((time.time(), len(mine)))
            ids.update(str(x["id"]) for x in mine)
            await anyio.sleep(CLIENT_LIST_EVERY_S)
        received = int((await r.info("stats"))["total_connections_received"]) - received0
        cpu1 = await _cpu(r, worker_pids)
    finally:
        await r.aclose()
    return {
        "samples": samples,
        "distinct": len(ids),
        "by": by,
        "received": received,
        "cpu_s": {k: _minus(cpu1[k], cpu0[k]) for k in ("workers", "redis")},
    }


def _port(addr: str) -> int:
    try:
        return int(addr.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


def _fanout_run(
    url: str,
    tmp: Path,
    k: int,
    *,
    n: int,
    concurrency: int,
    timeout_s: float,
    progress: Progress | None,
) -> dict[str, Any]:
    ns = f"scaling-fanout-{k}"
    client_id = f"fanout-{k}"
    with _processes() as procs:
        procs.start(
            _worker_cmd(url, ns, concurrency),
            tmp / f"fanout-worker-{k}.log",
            {**os.environ, AGENT_ENV: "scale-1"},
        )
        try:
            anyio.run(_wait_ready, url, ns, 1, procs)
        except BaseException:
            print(f"fanout: worker log, last lines:\n{procs.tails()}", file=sys.stderr)
            raise
        if progress:
            progress("fanout: requests", 0, n)
        log = tmp / f"fanout-caller-{k}.log"
        with open(log, "wb") as err:
            caller = subprocess.Popen(
                [sys.executable, "-m", "reach_cli.tools.scaling", "fanout", "--redis-url", url,
                 "--namespace", ns, "--requests", str(n), "--client-id", client_id,
                 "--timeout-s", str(timeout_s)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
            )  # fmt: skip
        try:
            # The caller's requests time out after timeout_s: past that (and its start and
            # stop) it is stuck, and is killed below.
            limit_s = timeout_s + 120
            pids = [p.pid for p, _ in procs.procs]
            conns = anyio.run(_sample_connections, url, caller, client_id, limit_s, pids)
            stdout, _ = caller.communicate(timeout=30 if caller.poll() is None else None)
        finally:
            if caller.poll() is None:
                caller.kill()
                caller.wait()
    lines = stdout.decode(errors="replace").strip().splitlines()
    try:
        out: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        out = {"requests": n, "answered": 0, "errors": {}, "error": f"caller: {_tail(log)}"}
    out["caller_exit_code"] = caller.returncode
    during = [c for t, c in conns["samples"] if out.get("t_start", 0) <= t <= out.get("t_end", 0)]
    out["connections_peak"] = max(during, default=0)  # at once, during the fan-out
    out["connections_peak_lifetime"] = max((c for _, c in conns["samples"]), default=0)
    out["connections_distinct"] = conns["distinct"]  # every caller connection seen
    out["connections_counted_by"] = conns["by"]
    out["connections_received_all_clients"] = conns["received"]
    out["connection_samples"] = len(conns["samples"])
    # While the caller process ran (its start and stop included).
    out["worker_cpu_s"], out["redis_cpu_s"] = conns["cpu_s"]["workers"], conns["cpu_s"]["redis"]
    out["worker_stats"] = procs.stats()
    for key in ("t_start", "t_end"):
        out.pop(key, None)
    if progress:
        progress("fanout: requests", out["answered"], n)
    anyio.run(_flush, url)
    return out


# -- the whole run ------------------------------------------------------------------------


def _guarded(what: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A run's figures, or ``{"error": ...}``: one failed run does not lose the others."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported in the output
        print(f"{what}: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return {"error": f"{type(e).__name__}: {e}"}


def _combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the rounds that succeeded; the errors of those that did not."""
    ok = [r for r in runs if "error" not in r]
    out = medians(ok) if ok else {}
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        out["errors_of_rounds"] = errors
    out["rounds_ok"] = len(ok)
    return out


def run_scaling(
    *,
    sets: Sequence[str] = SETS,
    workers: Sequence[int] = WORKERS,
    agents: Sequence[int] = AGENTS,
    payload_bytes: Sequence[int] = PAYLOAD_BYTES,
    messages: int = 20_000,
    payload_mib: float = 200.0,
    fanout: int = FANOUT,
    fanout_timeout_s: float = 120.0,
    concurrency: int = 64,
    agent_processes: int = 1,
    repeat: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the chosen figure sets on an embedded Redis; returns the figures (see the
    module's docstring for what each set measures)."""
    unknown = set(sets) - set(SETS)
    if unknown:
        raise ConfigError(f"Unknown figure set(s) {sorted(unknown)}: choose from {list(SETS)}.")
    for name, values in (
        ("workers", workers),
        ("agents", agents),
        ("payload sizes", payload_bytes),
    ):
        if any(v < 1 for v in values):
            raise ConfigError(f"{name} must be >= 1, got {list(values)}.")
    if messages < 1 or fanout < 1 or concurrency < 1 or agent_processes < 1 or repeat < 1:
        raise ConfigError("messages, fanout, concurrency, agent_processes and repeat must be >= 1.")
    if payload_mib <= 0 or fanout_timeout_s <= 0:
        raise ConfigError("payload_mib and fanout_timeout_s must be > 0.")
    load_before = os.getloadavg()
    rounds: dict[str, dict[int, list[dict[str, Any]]]] = {s: {} for s in sets}
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="reach-scaling-") as t:
        url, tmp = server.url, Path(t)
        for k in range(repeat):

            def tagged(phase: str, done: int, total: int, k: int = k) -> None:
                assert progress is not None
                progress(f"[{k + 1}/{repeat}] {phase}" if repeat > 1 else phase, done, total)

            prog = tagged if progress else None

            def order(values: Sequence[int], k: int = k) -> list[int]:
                return list(reversed(values)) if k % 2 else list(values)

            if "workers" in sets:
                for w in order(workers):
                    fig = _guarded(f"{w} workers", partial(
                        _workers_run, url, tmp, k, w, n=messages, concurrency=concurrency,
                        progress=prog,
                    ))  # fmt: skip
                    rounds["workers"].setdefault(w, []).append(fig)
            if "agents" in sets:
                for a in order(agents):
                    fig = _guarded(f"{a} agents", partial(
                        _agents_run, url, tmp, k, a, n=messages, concurrency=concurrency,
                        agent_processes=agent_processes, progress=prog,
                    ))  # fmt: skip
                    rounds["agents"].setdefault(a, []).append(fig)
            if "payloads" in sets:
                for size in order(payload_bytes):
                    n = max(1, min(messages, int(payload_mib * 2**20 // size)))
                    fig = _guarded(f"{size}-byte payloads", partial(
                        _payload_run, url, tmp, k, size, n=n, concurrency=concurrency,
                        progress=prog,
                    ))  # fmt: skip
                    rounds["payloads"].setdefault(size, []).append(fig)
            if "fanout" in sets:
                fig = _guarded("fan-out", partial(
                    _fanout_run, url, tmp, k, n=fanout, concurrency=concurrency,
                    timeout_s=fanout_timeout_s, progress=prog,
                ))  # fmt: skip
                rounds["fanout"].setdefault(fanout, []).append(fig)
        redis_version = f"{server.binary.origin} {server.binary.version_str}"
    out: dict[str, Any] = {
        "redis": redis_version,
        "cpus": os.cpu_count(),
        "concurrency": concurrency,
        "agent_processes": agent_processes,
        "inflight": STREAM_INFLIGHT,
        "repeat": repeat,
        # The 1-minute load average before and after: a loaded machine shows here.
        "load_avg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }
    for s in ("workers", "agents", "payloads"):
        if s in sets:
            values = {"workers": workers, "agents": agents, "payloads": payload_bytes}[s]
            out[s] = [_combine(rounds[s][v]) for v in values]
    if "fanout" in sets:
        runs = rounds["fanout"][fanout]
        fo = _combine(runs)
        ok = [r for r in runs if "error" not in r]
        if ok:  # connections: the most any round used, not a median
            for key in ("connections_peak", "connections_peak_lifetime", "connections_distinct"):
                fo[key] = max(r[key] for r in ok)
            fo["errors"] = dict(sum((Counter(r["errors"]) for r in ok), Counter()))
            fo["answered"] = min(r["answered"] for r in ok)
        out["fanout"] = fo
    if repeat > 1:
        out["rounds"] = {
            s: {str(v): [_drop(r) for r in runs] for v, runs in by_value.items()}
            for s, by_value in rounds.items()
        }
    return out


def _drop(fig: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fig.items() if k != "worker_stats"}


# -- the report ---------------------------------------------------------------------------


def _num(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f}"


def _rate(fig: dict[str, Any]) -> str:
    if "msgs_per_s" not in fig:
        return "failed: " + "; ".join(fig.get("errors_of_rounds", ["no figures"]))
    extra = ""
    if fig.get("processed", 0) != fig.get("messages"):
        extra += f" (processed {fig.get('processed')} of {fig.get('messages')})"
    if fig.get("send_errors"):
        extra += f" send errors {fig['send_errors']}"
    if fig.get("unacked"):
        extra += f" unacked {fig['unacked']}"
    cpu = fig.get("cpu_s") or {}
    if cpu:
        extra += (
            " (CPU s: "
            + ", ".join(f"{k} {v:.1f}" if v is not None else f"{k} ?" for k, v in cpu.items())
            + ")"
        )
    return f"{fig['msgs_per_s']:,.0f} msgs/s{extra}"


def format_report(out: dict[str, Any]) -> str:
    rounds = out["repeat"]
    med = f" (medians of {rounds} rounds)" if rounds > 1 else ""
    load = out["load_avg_1m"]
    lines = [
        (
            f"redis {out['redis']}, {out['cpus']} cpus, {out['concurrency']} handlers per "
            f"agent, load average {load[0]} -> {load[1]}{med}"
        ),
        (
            f"throughput: one caller (Client.send, {out['inflight']} in flight), processed = "
            "the inboxes drained"
        ),
    ]
    for fig in out.get("workers", []):
        n = fig.get("messages", "?")
        lines.append(
            f"  {fig.get('workers', '?')} worker process(es), one agent each, {n} msgs: "
            f"{_rate(fig)}"
        )
    for fig in out.get("agents", []):
        spread = ""
        if "per_agent_min" in fig:
            spread = f"; per agent {fig['per_agent_min']}-{fig['per_agent_max']} msgs"
        lines.append(
            f"  {fig.get('agents', '?')} agent(s) sharing {CAP} in "
            f"{fig.get('processes', '?')} process(es), {fig.get('messages', '?')} msgs: "
            f"{_rate(fig)}{spread}"
        )
    for fig in out.get("payloads", []):
        mb = f" = {fig['payload_mib_per_s']:,.1f} MiB/s" if "payload_mib_per_s" in fig else ""
        lines.append(
            f"  {fig.get('payload_bytes', '?')}-byte payloads, 1 worker process, "
            f"{fig.get('messages', '?')} msgs: {_rate(fig)}{mb}"
        )
    fo = out.get("fanout")
    if fo:
        if "seconds" not in fo:
            lines.append(
                "fan-out: failed: " + "; ".join(fo.get("errors_of_rounds", [fo.get("error", "")]))
            )
        else:
            errs = fo.get("errors") or {}
            lines += [
                (
                    f"fan-out: {fo['requests']:,} concurrent Client.request calls from one "
                    f"Client, 1 worker process: {fo['answered']:,} answered in "
                    f"{fo['seconds']:.2f}s ({fo['answered_per_s']:,.0f}/s); errors: "
                    + (", ".join(f"{k} x{v}" for k, v in errs.items()) if errs else "none")
                ),
                (
                    f"  caller connections (CLIENT LIST, by {fo['connections_counted_by']}): "
                    f"{fo['connections_peak']} at most at once during the fan-out (goal <= "
                    f"{FANOUT_CONNECTIONS_GOAL}), {fo['connections_distinct']} in all"
                ),
                (
                    f"  caller max RSS {fo['rss_max_mb']:.0f} MB ({fo['rss_before_mb']:.0f} MB "
                    f"before the fan-out); CPU s: caller {fo['caller_cpu_s']:.1f} (the "
                    f"fan-out), worker {_num(fo.get('worker_cpu_s'))}, redis "
                    f"{_num(fo.get('redis_cpu_s'))} (while the caller ran)"
                ),
            ]
            if fo.get("first_error"):
                lines.append(f"  first error: {fo['first_error']}")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _sizes(text: str) -> list[int]:
    """1024, 1k, 64K, 1m -> bytes."""
    out = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        mult = {"k": 1024, "m": 1024 * 1024}.get(part[-1:], 1)
        try:
            out.append(int(part.rstrip("km")) * mult)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected sizes like 1k,64k, got {text!r}") from None
    return out


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``python bench/scaling_bench.py`` and ``reach bench-scaling`` (plain progress lines
    on stderr)."""
    ap = argparse.ArgumentParser(
        prog=prog or "scaling_bench",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument(
        "--sets",
        default=",".join(SETS),
        help=f"figure sets to run, comma-separated (default: all: {','.join(SETS)})",
    )
    ap.add_argument("--workers", type=_ints, default=list(WORKERS), help="worker processes: 1,2,4")
    ap.add_argument("--agents", type=_ints, default=list(AGENTS), help="agents: 1,10,100")
    ap.add_argument(
        "--agent-processes", type=int, default=1, help="processes hosting the agents set's agents"
    )
    ap.add_argument(
        "--payloads", type=_sizes, default=list(PAYLOAD_BYTES), help="payload sizes: 1k,64k"
    )
    ap.add_argument("--messages", type=int, default=20_000, help="messages per throughput run")
    ap.add_argument(
        "--payload-mib", type=float, default=200.0, help="most MiB of payload sent per payload run"
    )
    ap.add_argument("--fanout", type=int, default=FANOUT, help="concurrent requests of the fan-out")
    ap.add_argument(
        "--fanout-timeout-s", type=float, default=120.0, help="timeout of each fan-out request"
    )
    ap.add_argument("--concurrency", type=int, default=64, help="handlers per agent")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; figures are medians")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    progress = progress_lines()

    try:
        out = run_scaling(
            sets=[s.strip() for s in a.sets.split(",") if s.strip()],
            workers=a.workers,
            agents=a.agents,
            payload_bytes=a.payloads,
            messages=a.messages,
            payload_mib=a.payload_mib,
            fanout=a.fanout,
            fanout_timeout_s=a.fanout_timeout_s,
            concurrency=a.concurrency,
            agent_processes=a.agent_processes,
            repeat=a.repeat,
            progress=progress,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2) if a.json else format_report(out))
    return 0


# -- the child processes ------------------------------------------------------------------


async def _host(url: str, ns: str, agent_ids: list[str], concurrency: int) -> None:
    """Run the agents side by side until SIGTERM/SIGINT, then drain them all."""
    agents = [make_agent(a) for a in agent_ids]
    gc.freeze()  # as `reach worker` does: the long-lived objects leave the collector's way

    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                async for _ in sigs:
                    for agent in agents:
                        agent.stop()
                    return

        tg.start_soon(on_signal)
        async with anyio.create_task_group() as runs:
            for agent in agents:
                runs.start_soon(
                    partial(
                        agent.run,
                        redis_url=url,
                        namespace=ns,
                        concurrency=concurrency,
                        handle_signals=False,
                    )
                )
        tg.cancel_scope.cancel()


def child_main(argv: Sequence[str] | None = None) -> int:
    """``python -m reach_cli.tools.scaling host|fanout ...``: the benchmark's own child
    processes (several agents in one process; the fan-out caller, which prints its figures
    as one JSON line on stdout)."""
    from reach import logs

    ap = argparse.ArgumentParser(prog="python -m reach_cli.tools.scaling")
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("host", help="run several agents of scaling.noop in this process")
    h.add_argument("--redis-url", required=True)
    h.add_argument("--namespace", required=True)
    h.add_argument("--agents", required=True, help="agent ids, comma-separated")
    h.add_argument("--concurrency", type=int, default=64)
    f = sub.add_parser("fanout", help="one Client, N concurrent requests; figures as JSON")
    f.add_argument("--redis-url", required=True)
    f.add_argument("--namespace", required=True)
    f.add_argument("--requests", type=int, required=True)
    f.add_argument("--client-id", required=True)
    f.add_argument("--timeout-s", type=float, default=120.0)
    a = ap.parse_args(argv)
    if a.cmd == "host":
        logs.setup_logging("info", "text")
        ids = [x for x in a.agents.split(",") if x]
        anyio.run(_host, a.redis_url, a.namespace, ids, a.concurrency)
        return 0
    logs.setup_logging("warning", "text")
    out = anyio.run(
        partial(
            fanout_caller,
            a.redis_url,
            a.namespace,
            a.requests,
            client_id=a.client_id,
            timeout_s=a.timeout_s,
        )
    )
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())

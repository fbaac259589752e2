"""reach next to the established Python Redis job queues (arq, dramatiq, taskiq), on this machine.

Every system gets the workload of ``reach bench`` (``reach_cli.tools.bench``, which runs the
reach rows itself): its own Redis (``reach.embedded.RedisServer`` on a free port), ONE worker
process started with the library's own worker CLI, and a handler that returns its input.

* throughput: the worker is started and proven to consume (one round trip), then SIGSTOPped;
  a backlog of ``--messages`` jobs is enqueued with the library's client API; the clock runs
  from SIGCONT until the library's own ack/completion state in Redis says all are done
  (polled every 5 ms as reach_cli.tools.bench does; see ``DONE_WHEN``). No handler-side
  counter: the reach rows come from reach_cli.tools.bench unchanged and their handler only
  returns its input;
* request/reply: one sequential caller, 200 warm-up requests, then ``--requests`` requests,
  each enqueue + wait for the result with the library's documented API; p50 / p99 (ms).

Each library runs with its fast documented settings (printed with the table, changeable
with the ``--arq-*`` / ``--dramatiq-*`` / ``--taskiq-*`` options). ``--repeat K`` runs the
systems round-robin K times and reports medians. Missing libraries are skipped:

    pip install arq 'dramatiq[redis]' taskiq taskiq-redis     # or: pip install -e '.[compare]'
    python bench/compare_queues.py                            # 5,000 msgs, 500 requests
    python bench/compare_queues.py --repeat 3 --systems reach,arq --json

arq 0.28 (the latest) pins redis-py < 6, so the ``compare`` extra installs redis-py 5.x with
taskiq-redis 1.0.x and taskiq 0.12.x (newer taskiq-redis needs redis-py >= 6). arq runs on
redis-py 8 despite its pin, but with ~30 % less throughput, and its worker then hangs on
SIGTERM. The versions used are printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.metadata
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reach_cli.tools import bench as reach_bench

from reach import __version__ as reach_version
from reach.embedded import RedisServer, _die_with_parent_hook

SYSTEMS = ("reach", "arq", "dramatiq", "taskiq")
# Import names that must all be present, and the hint printed when one is not.
NEEDS = {
    "arq": (("arq",), "pip install arq"),
    "dramatiq": (("dramatiq", "redis"), "pip install 'dramatiq[redis]'"),
    "taskiq": (("taskiq", "taskiq_redis"), "pip install taskiq taskiq-redis"),
}
DISTS = ("reach", "arq", "dramatiq", "taskiq", "taskiq-redis", "redis", "hiredis")
DONE_WHEN = {
    "reach": "inbox XLEN 0 (entries are XDELed after the fenced completion and XACK)",
    "arq": "ZCARD arq:queue 0 (a job leaves the queue in the same transaction as its result)",
    "dramatiq": "HLEN dramatiq:default.msgs 0 (the ack script deletes the message)",
    "taskiq": "consumer group pending 0 and lag 0 (XACK after the result is saved)",
}
WARMUP = 200  # requests before the measured ones, as in reach_cli.tools.bench
POLL_S = 0.005  # completion polling interval, as in reach_cli.tools.bench
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0

# The worker processes import this module (``bench.compare_queues``) and read their
# Redis URL and tunables from the environment.
URL_ENV = "COMPARE_QUEUES_REDIS_URL"
ARQ_MAX_JOBS_ENV = "COMPARE_QUEUES_ARQ_MAX_JOBS"
ARQ_POLL_ENV = "COMPARE_QUEUES_ARQ_POLL_DELAY"

# arq logs every job start and result at INFO by default: one stderr line per job is a cost
# none of the others pay, so its worker logs warnings only (reach, dramatiq and taskiq do not
# log per message; taskiq gets --log-level WARNING too).
ARQ_LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "loggers": {"arq": {"handlers": ["stderr"], "level": "WARNING"}},
}


@dataclass(frozen=True)
class Settings:
    """Per-library knobs: the fastest documented settings found by a sweep on a 2-core VM.

    Where a library polls (arq's worker and job.result, dramatiq's idle consumer, taskiq's
    wait_result), it polls every 1 ms: tighter was no faster (or is a busy spin), looser is
    slower. Their defaults (0.5 s, 0.5 s, up to 1 s, 0.2 s) would make latency a strawman.
    """

    reach_concurrency: int = 64  # reach_cli.tools.bench's default
    arq_max_jobs: int = 64  # 10 (default), 64 and 200 measured the same
    arq_poll_delay_s: float = 0.001
    arq_result_poll_s: float = 0.001
    dramatiq_threads: int = 8  # the default; 32 gave +0-15 % msgs/s but a worse p50/p99
    # Caps the idle backoff at int(2 * U(0.5, 1)) = 1 ms; 1 would make it sleep(0), a spin.
    dramatiq_worker_timeout_ms: int = 2
    taskiq_max_async_tasks: int = 64  # 16, 64 and 100 (default) measured the same
    taskiq_check_interval_s: float = 0.001


# -- handlers and app objects, shared by the bench process and the worker processes ------


async def echo(ctx: dict[str, Any], x: Any) -> Any:
    """arq's handler (arq passes a context dict first)."""
    return x


def _echo_sync(x: Any) -> Any:
    return x


async def _echo_async(x: Any) -> Any:
    return x


def _arq_worker_settings() -> type:
    from arq.connections import RedisSettings

    class ArqWorker:
        functions: ClassVar[list[Any]] = [echo]
        redis_settings = RedisSettings.from_dsn(os.environ[URL_ENV])
        max_jobs = int(os.environ[ARQ_MAX_JOBS_ENV])
        poll_delay = float(os.environ[ARQ_POLL_ENV])

    return ArqWorker


def _dramatiq_app(url: str) -> tuple[Any, Any]:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    broker = RedisBroker(url=url)
    broker.add_middleware(Results(backend=RedisBackend(url=url)))
    dramatiq.set_broker(broker)
    actor = dramatiq.actor(_echo_sync, actor_name="echo", broker=broker, store_results=True)
    return broker, actor


def dramatiq_setup() -> None:
    """The dramatiq CLI's broker callable (``dramatiq bench.compare_queues:dramatiq_setup``)."""
    _dramatiq_app(os.environ[URL_ENV])


def _taskiq_app(url: str) -> tuple[Any, Any]:
    from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

    # The stream broker: XREADGROUP + XACK, at-least-once like reach (ListQueueBroker is
    # BRPOP, at-most-once).
    broker = RedisStreamBroker(url).with_result_backend(
        RedisAsyncResultBackend(url, result_ex_time=3600)
    )
    task = broker.register_task(_echo_async, task_name="echo")
    return broker, task


@functools.cache
def _worker_attr(name: str) -> Any:
    if name == "ArqWorker":
        return _arq_worker_settings()
    return _taskiq_app(os.environ[URL_ENV])[0]


def __getattr__(name: str) -> Any:
    # Built on first access (``arq bench.compare_queues.ArqWorker``, ``taskiq worker
    # bench.compare_queues:taskiq_broker``) so that importing this module needs none of them.
    if name in ("ArqWorker", "taskiq_broker"):
        return _worker_attr(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- drivers: the client side of each library --------------------------------------------


class Driver(Protocol):
    def worker_cmd(self, s: Settings) -> tuple[list[str], dict[str, str]]: ...
    def describe(self, s: Settings) -> str: ...
    async def open(self, url: str, s: Settings) -> None: ...
    async def enqueue(self, payload: Any) -> None: ...
    async def call(self, payload: Any, timeout_s: float) -> Any: ...
    async def remaining(self, r: Any) -> int: ...
    async def close(self) -> None: ...


class ArqDriver:
    def worker_cmd(self, s: Settings) -> tuple[list[str], dict[str, str]]:
        cmd = [
            sys.executable,
            "-m",
            "arq",
            "bench.compare_queues.ArqWorker",
            "--custom-log-dict",
            "bench.compare_queues.ARQ_LOG_CONFIG",
        ]
        env = {ARQ_MAX_JOBS_ENV: str(s.arq_max_jobs), ARQ_POLL_ENV: str(s.arq_poll_delay_s)}
        return cmd, env

    def describe(self, s: Settings) -> str:
        return (
            f"`arq` CLI, max_jobs={s.arq_max_jobs}, poll_delay={s.arq_poll_delay_s}s, "
            f"job.result(poll_delay={s.arq_result_poll_s}s), log level WARNING"
        )

    async def open(self, url: str, s: Settings) -> None:
        from arq import create_pool
        from arq.connections import RedisSettings

        self.s = s
        self.pool = await create_pool(RedisSettings.from_dsn(url))

    async def enqueue(self, payload: Any) -> None:
        await self.pool.enqueue_job("echo", payload)

    async def call(self, payload: Any, timeout_s: float) -> Any:
        job = await self.pool.enqueue_job("echo", payload)
        if job is None:  # only when the job id exists already
            raise RuntimeError("arq did not enqueue the job")
        return await job.result(timeout=timeout_s, poll_delay=self.s.arq_result_poll_s)

    async def remaining(self, r: Any) -> int:
        return int(await r.zcard("arq:queue"))

    async def close(self) -> None:
        await self.pool.aclose()


class DramatiqDriver:
    # dramatiq's client API is synchronous; nothing else runs on the event loop, so calling
    # it inline costs no more than it would in a plain thread.
    def worker_cmd(self, s: Settings) -> tuple[list[str], dict[str, str]]:
        cmd = [
            sys.executable,
            "-m",
            "dramatiq",
            "bench.compare_queues:dramatiq_setup",
            "--processes",
            "1",
            "--threads",
            str(s.dramatiq_threads),
        ]
        # The idle consumer backs off from 5 ms up to this many ms (default 1000) between
        # fetches: the documented env var, and what bounds an idle worker's pickup delay.
        return cmd, {"dramatiq_worker_timeout": str(s.dramatiq_worker_timeout_ms)}

    def describe(self, s: Settings) -> str:
        return (
            f"`dramatiq` CLI, --processes 1 --threads {s.dramatiq_threads}, "
            f"dramatiq_worker_timeout={s.dramatiq_worker_timeout_ms} ms, Results middleware "
            "+ RedisBackend (store_results=True), get_result(block=True)"
        )

    async def open(self, url: str, s: Settings) -> None:
        self.broker, self.actor = _dramatiq_app(url)

    async def enqueue(self, payload: Any) -> None:
        self.actor.send(payload)

    async def call(self, payload: Any, timeout_s: float) -> Any:
        msg = self.actor.send(payload)
        return msg.get_result(block=True, timeout=int(timeout_s * 1000))

    async def remaining(self, r: Any) -> int:
        return int(await r.hlen("dramatiq:default.msgs"))

    async def close(self) -> None:
        self.broker.close()


class TaskiqDriver:
    def worker_cmd(self, s: Settings) -> tuple[list[str], dict[str, str]]:
        cmd = [
            sys.executable,
            "-m",
            "taskiq",
            "worker",
            "bench.compare_queues:taskiq_broker",
            "--workers",
            "1",
            "--max-async-tasks",
            str(s.taskiq_max_async_tasks),
            "--log-level",
            "WARNING",
        ]
        return cmd, {}

    def describe(self, s: Settings) -> str:
        return (
            f"`taskiq worker` CLI, --workers 1 --max-async-tasks {s.taskiq_max_async_tasks}, "
            "RedisStreamBroker + RedisAsyncResultBackend, ack when saved, "
            f"wait_result(check_interval={s.taskiq_check_interval_s}s)"
        )

    async def open(self, url: str, s: Settings) -> None:
        self.s = s
        self.broker, self.task = _taskiq_app(url)
        # Creates the consumer group ("$") now, so jobs sent before the worker is up are kept.
        await self.broker.startup()

    async def enqueue(self, payload: Any) -> None:
        await self.task.kiq(payload)

    async def call(self, payload: Any, timeout_s: float) -> Any:
        t = await self.task.kiq(payload)
        res = await t.wait_result(check_interval=self.s.taskiq_check_interval_s, timeout=timeout_s)
        if res.is_err:
            raise RuntimeError(f"taskiq task failed: {res.error}")
        return res.return_value

    async def remaining(self, r: Any) -> int:
        group = next(g for g in await r.xinfo_groups("taskiq") if g["name"] == b"taskiq")
        if group["lag"] is None:  # Redis cannot tell (entries deleted): don't guess
            raise RuntimeError("the taskiq consumer group has no lag to read")
        return int(group["pending"]) + int(group["lag"])

    async def close(self) -> None:
        await self.broker.shutdown()


DRIVERS: dict[str, Callable[[], Driver]] = {
    "arq": ArqDriver,
    "dramatiq": DramatiqDriver,
    "taskiq": TaskiqDriver,
}


# -- running one system once -------------------------------------------------------------


def _latency_figures(samples: list[float]) -> dict[str, float]:
    # The same definitions as reach_cli.tools.bench: median, nearest-rank p99.
    samples = sorted(samples)
    return {
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[max(0, int(len(samples) * 0.99) - 1)],
        "mean_ms": statistics.fmean(samples),
    }


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _start_worker(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    # The worker CLIs import ``bench.compare_queues`` from the repository root.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full_env = {**os.environ, **env, "PYTHONPATH": path}
    with open(log, "wb") as out:
        # Own session: dramatiq and taskiq fork their worker process from a supervisor, so
        # SIGSTOP/SIGCONT/SIGTERM go to the whole group. The hook SIGTERMs the supervisor if
        # this process dies without cleaning up.
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=_die_with_parent_hook(),  # noqa: PLW1509
        )


def _stop_worker(proc: subprocess.Popen[bytes]) -> None:
    _signal_group(proc, signal.SIGCONT)
    _signal_group(proc, signal.SIGTERM)
    try:
        # Not longer: arq 0.28 on redis-py 8 logs "shutdown on SIGTERM" and then hangs.
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    # Children left behind by a supervisor that exited (or hung) die here.
    _signal_group(proc, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(timeout=30)


async def _measure(
    d: Driver, url: str, s: Settings, worker: subprocess.Popen[bytes], n: int, reqs: int
) -> dict[str, Any]:
    import redis.asyncio

    r = redis.asyncio.Redis.from_url(url)
    await d.open(url, s)
    try:
        # Ready = one job went through the worker (jobs sent before it was up are kept).
        if await d.call("ready", READY_TIMEOUT_S) != "ready":
            raise RuntimeError("worker answered the readiness job wrongly")
        _signal_group(worker, signal.SIGSTOP)
        t_load = time.perf_counter()
        for i in range(n):
            await d.enqueue({"i": i})
        load_s = time.perf_counter() - t_load
        if await d.remaining(r) < n:
            raise RuntimeError("the backlog is not all queued: did the worker run while stopped?")
        t0 = time.perf_counter()
        _signal_group(worker, signal.SIGCONT)
        deadline = t0 + DRAIN_TIMEOUT_S
        while await d.remaining(r) > 0:
            if time.perf_counter() > deadline or worker.poll() is not None:
                raise RuntimeError("backlog not processed (worker died or timed out)")
            await asyncio.sleep(POLL_S)
        seconds = time.perf_counter() - t0

        for i in range(WARMUP):
            await d.call(i, CALL_TIMEOUT_S)
        samples = []
        for i in range(reqs):
            t = time.perf_counter()
            out = await d.call(i, CALL_TIMEOUT_S)
            samples.append((time.perf_counter() - t) * 1000)
            if out != i:
                raise RuntimeError(f"request {i} answered {out!r}")
    finally:
        await d.close()
        await r.aclose()
    return {
        "msgs_per_s": n / seconds,
        "seconds": seconds,
        "load_seconds": load_s,
        **_latency_figures(samples),
    }


def run_other(name: str, s: Settings, n: int, reqs: int) -> dict[str, Any]:
    """One run of a queue library: its own Redis, one worker process, both phases."""
    d = DRIVERS[name]()
    cmd, env = d.worker_cmd(s)
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="compare-queues-") as tmp:
        log = Path(tmp) / "worker.log"
        worker = _start_worker(cmd, {**env, URL_ENV: server.url}, log)
        try:
            return asyncio.run(_measure(d, server.url, s, worker, n, reqs))
        except Exception as e:
            tail = log.read_text(errors="replace").strip().splitlines()[-15:]
            raise RuntimeError(f"{name}: {e}; worker log tail:\n" + "\n".join(tail)) from e
        finally:
            _stop_worker(worker)


def run_reach(s: Settings, n: int, reqs: int) -> dict[str, Any]:
    """One run of reach: reach_cli.tools.bench itself (its own Redis and `reach worker`)."""
    out = reach_bench.run_bench(messages=n, requests=reqs, concurrency=s.reach_concurrency)
    tp, lat = out["throughput"], out["latency"]
    return {
        "msgs_per_s": tp["msgs_per_s"],
        "seconds": tp["seconds"],
        "load_seconds": tp["load_seconds"],
        "p50_ms": lat["p50_ms"],
        "p99_ms": lat["p99_ms"],
        "mean_ms": lat["mean_ms"],
    }


# -- the whole comparison ----------------------------------------------------------------


def _version(dist: str) -> str | None:
    if dist == "reach":  # also right when reach runs from a checkout on PYTHONPATH
        return reach_version
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def available(name: str) -> tuple[bool, str]:
    if name == "reach":
        return True, ""
    mods, hint = NEEDS[name]
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    return not missing, hint


def describe(name: str, s: Settings) -> str:
    if name == "reach":
        return f"`reach worker` (reach_cli.tools.bench), concurrency {s.reach_concurrency}"
    return DRIVERS[name]().describe(s)


def compare(
    systems: Sequence[str],
    s: Settings,
    n: int,
    reqs: int,
    repeat: int,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Run the systems round-robin ``repeat`` times; medians and ratios to reach."""
    runs: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, str] = {}
    errors: dict[str, list[str]] = {}
    for name in systems:
        ok, hint = available(name)
        if ok:
            runs[name] = []
        else:
            skipped[name] = f"not installed: {hint}"
            log(f"{name}: not installed: {hint}")
    # Round-robin, so that drift on a shared machine touches every system alike.
    for rep in range(repeat):
        for name, results in runs.items():
            log(f"[{rep + 1}/{repeat}] {name}: {n} msgs backlog, {reqs} requests ...")
            try:
                res = run_reach(s, n, reqs) if name == "reach" else run_other(name, s, n, reqs)
            except Exception as e:  # noqa: BLE001 - one broken library must not sink the rest
                errors.setdefault(name, []).append(str(e))
                log(f"[{rep + 1}/{repeat}] {name}: FAILED: {e}")
                continue
            results.append(res)
            log(
                f"[{rep + 1}/{repeat}] {name}: {res['msgs_per_s']:,.0f} msgs/s, "
                f"p50 {res['p50_ms']:.3f} ms, p99 {res['p99_ms']:.3f} ms"
            )
    median = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        for name, rs in runs.items()
        if rs
    }
    ratios: dict[str, dict[str, float]] = {}
    if "reach" in median:
        base = median["reach"]
        for name, m in median.items():
            # Each ratio > 1 means reach is better by that factor.
            ratios[name] = {
                "throughput_reach_over_x": base["msgs_per_s"] / m["msgs_per_s"],
                "p50_x_over_reach": m["p50_ms"] / base["p50_ms"],
                "p99_x_over_reach": m["p99_ms"] / base["p99_ms"],
            }
    binary = RedisServer().binary  # the same lookup every run above used
    return {
        "messages": n,
        "requests": reqs,
        "warmup": WARMUP,
        "repeat": repeat,
        "redis": f"{binary.origin} {binary.version_str}",
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "versions": {d: _version(d) for d in DISTS},
        "settings": {name: describe(name, s) for name in runs},
        "settings_raw": asdict(s),
        "done_when": {name: DONE_WHEN[name] for name in runs},
        "median": median,
        "ratios": ratios,
        "runs": runs,
        "skipped": skipped,
        "errors": errors,
    }


def format_report(out: dict[str, Any]) -> str:
    v = out["versions"]
    lines = [
        (
            f"redis {out['redis']}, {out['cpus']} cpus, python {out['python']}, redis-py "
            f"{v['redis']}, hiredis {v['hiredis']}; one worker process per system"
        ),
        (
            f"throughput: backlog of {out['messages']} msgs; request/reply: 1 sequential caller, "
            f"{out['requests']} requests after {out['warmup']} warm-up; "
            f"median of {out['repeat']} run(s)"
        ),
        "",
        (
            f"{'system':<10}{'version':<10}{'msgs/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'reach/x msgs/s':>16}{'x/reach p50':>13}{'x/reach p99':>13}"
        ),
    ]
    for name in SYSTEMS:
        if name in out["median"]:
            m, rt = out["median"][name], out["ratios"].get(name)
            ver = v["taskiq"] if name == "taskiq" else v[name]
            r = (
                (
                    f"{rt['throughput_reach_over_x']:>16.2f}{rt['p50_x_over_reach']:>13.2f}"
                    f"{rt['p99_x_over_reach']:>13.2f}"
                )
                if rt
                else ""
            )
            lines.append(
                f"{name:<10}{ver or '?':<10}{m['msgs_per_s']:>9,.0f}"
                f"{m['p50_ms']:>9.3f}{m['p99_ms']:>9.3f}{r}"
            )
    lines += ["", "ratios > 1 = reach better by that factor", "", "settings:"]
    lines += [f"  {k}: {d}" for k, d in out["settings"].items()]
    if "taskiq" in out["settings"]:
        lines.append(f"  (taskiq-redis {v['taskiq-redis']})")
    lines += ["backlog done when (each library's own ack state, polled every 5 ms):"]
    lines += [f"  {k}: {d}" for k, d in out["done_when"].items()]
    for name, msg in out["skipped"].items():
        lines.append(f"{name}: {msg}")
    for name, errs in out["errors"].items():
        lines.append(f"{name}: {len(errs)} failed run(s); first: {errs[0].splitlines()[0]}")
    return "\n".join(lines)


def _interrupt(signum: int, frame: Any) -> None:
    # Raise at once, wherever the main thread is, so that every finally block stops its
    # worker and Redis. asyncio's own SIGINT handling only cancels the main task, and a
    # cancellation can be lost inside a library (seen with arq on redis-py 8: the run went on).
    raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="compare_queues",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = Settings()
    ap.add_argument("--messages", type=int, default=5000, help="throughput backlog size")
    ap.add_argument("--requests", type=int, default=500, help="measured request/reply calls")
    ap.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)}",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per system; medians reported")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reach-concurrency", type=int, default=d.reach_concurrency)
    ap.add_argument("--arq-max-jobs", type=int, default=d.arq_max_jobs)
    ap.add_argument("--arq-poll-delay-s", type=float, default=d.arq_poll_delay_s)
    ap.add_argument("--arq-result-poll-s", type=float, default=d.arq_result_poll_s)
    ap.add_argument("--dramatiq-threads", type=int, default=d.dramatiq_threads)
    ap.add_argument("--dramatiq-worker-timeout-ms", type=int, default=d.dramatiq_worker_timeout_ms)
    ap.add_argument("--taskiq-max-async-tasks", type=int, default=d.taskiq_max_async_tasks)
    ap.add_argument("--taskiq-check-interval-s", type=float, default=d.taskiq_check_interval_s)
    a = ap.parse_args(argv)
    systems = [x.strip() for x in a.systems.split(",") if x.strip()]
    bad = [x for x in systems if x not in SYSTEMS]
    if bad or not systems:
        ap.error(f"--systems: unknown {bad}; choose from {','.join(SYSTEMS)}")
    if a.messages < 1 or a.requests < 1 or a.repeat < 1:
        ap.error("--messages, --requests and --repeat must be >= 1")
    s = Settings(**{k: getattr(a, k) for k in asdict(d)})
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        out = compare(systems, s, a.messages, a.requests, a.repeat)
    except KeyboardInterrupt:
        print("interrupted; workers and Redis servers stopped", file=sys.stderr)
        return 130
    print(json.dumps(out, indent=2) if a.json else format_report(out))
    return 0 if not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Liveness and connections of one process hosting N agents (issue 12, items 3 and 4).

For each ``--agents`` count, on a ``redis-server`` of its own (``reach.embedded``, a free
port; never a shared Redis), one **host** process runs N ``reach.Agent`` objects in one
event loop (each ``Agent.run()`` in one task group, as ``reach_cli.tools.scaling``'s host
and any application embedding several agents do). Once all are ready and settled:

1. **idle**, measured over ``--seconds``: Redis commands/s by command (``INFO
   commandstats`` deltas; the bench's own ``INFO``/``CLIENT LIST`` left out), the Redis
   time spent in scripts (``evalsha`` usec/s: heartbeats, and sweeps unless
   ``--no-sweeper``), Redis CPU and the host's CPU (``/proc`` utime + stime, % of a
   core), and the host's connections (``CLIENT LIST``: every connection not named
   ``bench-*``);
2. **busy** (``--requests``, default 2,000): a caller of its own (named ``bench-load``,
   so left out of the count) makes that many ``request()`` calls, ``--inflight`` at once,
   spread over the N agents; ``CLIENT LIST`` is read every 20 ms meanwhile and the host's
   largest connection count is kept.

``--repo DIR`` runs the host on the reach of another checkout (a ``git worktree`` of an
older commit) for a before/after comparison.

    python bench/liveness_bench.py                             # 1, 10, 100 agents
    python bench/liveness_bench.py --agents 1 100 --no-sweeper --json
    python bench/liveness_bench.py --repo /tmp/wt-before12     # the old code
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reach import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.registry import Registry

TICK = os.sysconf("SC_CLK_TCK")
CAP = "bench.live"
BENCH_NAME = "bench-"
SAMPLE_EVERY_S = 0.02

# The host: N agents in one event loop; SIGTERM drains them all.
HOST_MODULE = """
import signal, sys
from functools import partial

import anyio
from reach import Agent


async def main(url, ns, n, heartbeat_s, sweeper):
    agents = []
    for i in range(n):
        app = Agent(f"live-{i}", capabilities=["bench.live"])

        @app.handler("bench.live")
        async def echo(payload, ctx):
            return payload

        agents.append(app)
    kw = dict(redis_url=url, namespace=ns, heartbeat_s=heartbeat_s, lease_s=heartbeat_s * 3,
              evict_after_s=heartbeat_s * 6, sweeper=sweeper, handle_signals=False)

    async def stop_on_signal(scope):
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            async for _ in sigs:
                for a in agents:
                    a.stop()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_on_signal, tg.cancel_scope)
        async with anyio.create_task_group() as runs:
            for a in agents:
                runs.start_soon(partial(a.run, **kw))
        tg.cancel_scope.cancel()


anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
          sys.argv[5] == "1")
"""


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def command_stats(r: AnyRedis) -> dict[str, tuple[int, int]]:
    """calls and usec per command, without the bench's own."""
    stats = await r.info("commandstats")
    mine = ("cmdstat_info", "cmdstat_client|list")
    return {
        k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for k, v in stats.items()
        if k not in mine
    }


async def redis_cpu(r: AnyRedis) -> float:
    info = await r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def host_connections(r: AnyRedis) -> list[dict[str, Any]]:
    """The connections Redis holds that are not the bench's own (named ``bench-*``)."""
    return [
        c
        for c in await r.client_list()
        if not str(c.get("name", "")).startswith(BENCH_NAME) and c.get("flags") != "P"
    ]


def by_last_command(conns: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in conns:
        out[str(c.get("cmd", "?"))] = out.get(str(c.get("cmd", "?")), 0) + 1
    return dict(sorted(out.items(), key=lambda x: -x[1]))


async def measure_idle(r: AnyRedis, pid: int, seconds: float) -> dict[str, Any]:
    c0, cpu0, rcpu0, t0 = await command_stats(r), cpu_s(pid), await redis_cpu(r), time.time()
    await anyio.sleep(seconds)
    c1, cpu1, rcpu1, t1 = await command_stats(r), cpu_s(pid), await redis_cpu(r), time.time()
    wall = t1 - t0

    def rate(k: str, i: int) -> float:
        return (c1[k][i] - c0.get(k, (0, 0))[i]) / wall

    per_cmd = {k: rate(k, 0) for k in c1 if c1[k][0] != c0.get(k, (0, 0))[0]}
    conns = await host_connections(r)
    return {
        "commands_per_s": round(sum(per_cmd.values()), 1),
        "by_command": {k: round(v, 1) for k, v in sorted(per_cmd.items(), key=lambda x: -x[1])},
        "evalsha_per_s": round(per_cmd.get("evalsha", 0.0), 1),
        "script_usec_per_s": round(rate("evalsha", 1), 0) if "evalsha" in c1 else 0,
        "redis_cpu_pct": round(100 * (rcpu1 - rcpu0) / wall, 2),
        "host_cpu_pct": round(100 * (cpu1 - cpu0) / wall, 2),
        "connections": len(conns),
        "connections_by_last_command": by_last_command(conns),
    }


async def measure_busy(
    r: AnyRedis, url: str, ns: str, requests: int, inflight: int
) -> dict[str, Any]:
    """``requests`` request() calls, ``inflight`` at once, while the host's connections are
    sampled; returns the most seen at once and the calls' wall time."""
    most, samples = 0, 0
    done = anyio.Event()

    async def sample() -> None:
        nonlocal most, samples
        while not done.is_set():
            most = max(most, len(await host_connections(r)))
            samples += 1
            await anyio.sleep(SAMPLE_EVERY_S)

    load_redis = await connect(url, client_name=f"{BENCH_NAME}load")
    started = time.perf_counter()
    try:
        async with Client(redis=load_redis, namespace=ns, client_id="bench-load") as c:
            sem = anyio.Semaphore(inflight)

            async def one(i: int) -> None:
                async with sem:
                    await c.request(CAP, {"i": i}, timeout_s=60)

            async with anyio.create_task_group() as tg:
                tg.start_soon(sample)
                async with anyio.create_task_group() as calls:
                    for i in range(requests):
                        calls.start_soon(one, i)
                took = time.perf_counter() - started
                done.set()
    finally:
        await load_redis.aclose()
    return {
        "requests": requests,
        "inflight": inflight,
        "seconds": round(took, 2),
        "max_connections": most,
        "samples": samples,
    }


def child_env(repo: Path, modules: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(modules), str(repo), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("REACH_REDIS_URL", None)
    return env


def spawn(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, env=env, cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def one_size(args: argparse.Namespace, n: int, modules: Path) -> dict[str, Any]:
    with RedisServer() as srv:
        r = await connect(srv.url, client_name=f"{BENCH_NAME}probe")
        try:
            ns = f"live{uuid.uuid4().hex[:6]}"
            env = child_env(args.repo, modules)
            cmd = [sys.executable, str(modules / "live_host.py"), srv.url, ns, str(n)]
            cmd += [str(args.heartbeat_s), "1" if args.sweeper else "0"]
            host = spawn(cmd, env, modules)
            try:
                reg = Registry(r, ns)
                deadline = time.monotonic() + 120
                while True:
                    ready = [a for a in await reg.agents() if a.ready]
                    if len(ready) >= n:
                        break
                    if host.poll() is not None or time.monotonic() > deadline:
                        err = host.stderr.read().decode() if host.stderr else ""
                        raise SystemExit(
                            f"the host did not become ready ({len(ready)}/{n}):\n{err}"
                        )
                    await anyio.sleep(0.2)
                await anyio.sleep(args.settle_s)
                out: dict[str, Any] = {"agents": n}
                out["idle"] = await measure_idle(r, host.pid, args.seconds)
                if args.requests:
                    out["busy"] = await measure_busy(r, srv.url, ns, args.requests, args.inflight)
                states = {a.state for a in await reg.agents()}
                out["states_after"] = sorted(states)
                return out
            finally:
                stop(host)
        finally:
            await r.aclose()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        modules = Path(tmp)
        (modules / "live_host.py").write_text(HOST_MODULE)
        rows = []
        for n in args.agents:
            row = await one_size(args, n, modules)
            rows.append(row)
            if not args.json:
                i = row["idle"]
                top = ", ".join(f"{k} {v}" for k, v in list(i["by_command"].items())[:6])
                print(
                    f"{n:>5} agents idle: {i['commands_per_s']:>8.1f} cmd/s  "
                    f"evalsha {i['evalsha_per_s']:>7.1f}/s ({i['script_usec_per_s']:.0f} us/s)  "
                    f"redis cpu {i['redis_cpu_pct']:>5.2f} %  host cpu {i['host_cpu_pct']:>6.2f} %"
                    f"  conns {i['connections']} {i['connections_by_last_command']}  ({top})",
                    flush=True,
                )
                if "busy" in row:
                    b = row["busy"]
                    print(
                        f"{n:>5} agents busy: {b['requests']} requests, {b['inflight']} in flight,"
                        f" {b['seconds']} s, at most {b['max_connections']} host connections"
                        f" ({b['samples']} samples); states after: {row['states_after']}",
                        flush=True,
                    )
        if args.json:
            print(
                json.dumps(
                    {
                        "repo": str(args.repo),
                        "args": vars(args) | {"repo": str(args.repo)},
                        "rows": rows,
                    },
                    indent=2,
                )
            )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, nargs="+", default=[1, 10, 100])
    p.add_argument("--heartbeat-s", type=float, default=3.0, help="lease 3x, eviction 6x")
    p.add_argument("--sweeper", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seconds", type=float, default=10.0, help="idle, measured")
    p.add_argument("--settle-s", type=float, default=4.0, help="after ready, before measuring")
    p.add_argument("--requests", type=int, default=2000, help="busy phase (0: none)")
    p.add_argument("--inflight", type=int, default=200)
    p.add_argument("--repo", type=Path, default=ROOT, help="checkout whose reach is measured")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    anyio.run(main, parse())

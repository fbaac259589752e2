"""Idle cost of a process: Redis commands/s and CPU of one idle ``reach worker`` (and of an
idle caller) as the number of registered agents grows (issue 12, items 1 and 6).

For each ``--agents`` count, on a ``redis-server`` of its own (``reach.embedded``, a free
port; never a shared Redis):

1. registers that many simulated agents (pipelined ``register.lua``; leases of a day, so
   nothing heartbeats, expires or emits events while measuring), spread over
   ``--capabilities`` capabilities, plus ``--called-agents`` agents of ``bench.called``;
2. **caller**: starts a process that opens a ``reach.Client``, routes to ``bench.called``
   once a second (``Client.eligible``, no message) and nothing else, and measures it
   alone; then stops it;
3. **worker**: starts one real ``reach worker`` process (default settings: heartbeat 3 s,
   sweep every 1 s), waits until it is ready, lets it settle, and measures it alone.

Measured over ``--seconds`` per process: Redis commands/s (``INFO commandstats`` deltas;
the simulated agents send nothing, the bench's own ``INFO`` calls are left out), the
process's CPU (``/proc/<pid>/stat`` utime + stime) as % of one core, and Redis's own CPU.

``--repo DIR`` runs the measured processes on the reach of another checkout (e.g. a
``git worktree`` of an older commit) for a before/after comparison; the registration is
this checkout's (the registry scripts are the same).

    python bench/idle_cost.py                                   # 100 and 10,000 agents
    python bench/idle_cost.py --agents 100 10000 100000 --json
    python bench/idle_cost.py --repo /tmp/wt-before             # the old code
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

from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.registry import Registry
from reach.scripts import run_calls

CALLED = "bench.called"
DAY_MS = 86_400_000
BATCH = 2_000
TICK = os.sysconf("SC_CLK_TCK")

# The measured processes, as modules of their own (so ``--repo`` can run them on another
# checkout's reach): the worker's agent, and the caller.
AGENT_MODULE = """
from reach import Agent

app = Agent("idle-worker", capabilities=["bench.idle"])


@app.handler("bench.idle")
def idle(payload, ctx):
    return payload
"""

CALLER_MODULE = """
import sys, anyio
from reach import Client


async def main(url, ns, cap):
    async with Client(redis_url=url, namespace=ns, client_id="idle-caller") as c:
        print("ready", len(await c.eligible(cap)), flush=True)
        while True:
            await anyio.sleep(1.0)
            await c.eligible(cap)


anyio.run(main, *sys.argv[1:4])
"""


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def command_calls(r: AnyRedis) -> dict[str, int]:
    stats = await r.info("commandstats")
    return {
        k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"
    }


async def redis_cpu(r: AnyRedis) -> float:
    info = await r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def register_fleet(r: AnyRedis, ns: str, agents: int, caps: int, called: int) -> float:
    reg = Registry(r, ns)
    started = time.perf_counter()
    version = time.time_ns() // 1000
    specs = [(f"sim-{i}", [f"bench.cap{i % caps}"]) for i in range(agents)]
    specs += [(f"called-{i}", [CALLED]) for i in range(called)]
    for at in range(0, len(specs), BATCH):
        calls = [
            reg.register_call(
                agent_id,
                instance_id="sim",
                version=version,
                capabilities=cap,
                lease_ms=DAY_MS,
                evict_after_ms=DAY_MS,
                ready=True,
            )
            for agent_id, cap in specs[at : at + BATCH]
        ]
        for res in await run_calls(r, calls):
            if isinstance(res, Exception):
                raise res
    return time.perf_counter() - started


def child_env(repo: Path, modules: Path) -> dict[str, str]:
    """The measured processes import the bench's modules and ``repo``'s reach."""
    env = dict(os.environ)
    paths = [str(modules), str(repo), str(repo / "cli"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("REACH_REDIS_URL", None)
    return env


async def measure(r: AnyRedis, pid: int, seconds: float) -> dict[str, Any]:
    c0, cpu0, rcpu0, t0 = await command_calls(r), cpu_s(pid), await redis_cpu(r), time.time()
    await anyio.sleep(seconds)
    c1, cpu1, rcpu1, t1 = await command_calls(r), cpu_s(pid), await redis_cpu(r), time.time()
    wall = t1 - t0
    per_cmd = {k: (n - c0.get(k, 0)) / wall for k, n in c1.items() if n != c0.get(k, 0)}
    return {
        "commands_per_s": round(sum(per_cmd.values()), 2),
        "by_command": {k: round(v, 2) for k, v in sorted(per_cmd.items(), key=lambda x: -x[1])},
        "cpu_pct": round(100 * (cpu1 - cpu0) / wall, 3),
        "redis_cpu_pct": round(100 * (rcpu1 - rcpu0) / wall, 3),
    }


def spawn(cmd: list[str], env: dict[str, str], pipe: bool) -> subprocess.Popen[bytes]:
    """Start a measured process (``pipe``: its stdout is read, else dropped)."""
    out = subprocess.PIPE if pipe else subprocess.DEVNULL
    # cwd: the modules' directory (``python -m`` puts the cwd first on sys.path, so this
    # checkout's reach must not be the cwd when another's is measured)
    cwd = env["PYTHONPATH"].split(os.pathsep)[0]
    return subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=out, stderr=None if pipe else subprocess.DEVNULL
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def one_size(args: argparse.Namespace, agents: int, modules: Path) -> dict[str, Any]:
    with RedisServer() as srv:
        r = await connect(srv.url)
        try:
            ns = f"idle{uuid.uuid4().hex[:6]}"
            took = await register_fleet(r, ns, agents, args.capabilities, args.called_agents)
            env = child_env(args.repo, modules)
            out: dict[str, Any] = {"agents": agents, "register_s": round(took, 2)}

            caller = spawn(
                [sys.executable, str(modules / "idle_caller.py"), srv.url, ns, CALLED], env, True
            )
            try:
                assert caller.stdout is not None
                line = await anyio.to_thread.run_sync(caller.stdout.readline)
                if not line.startswith(b"ready"):
                    raise SystemExit(f"the caller did not start: {line!r}")
                await anyio.sleep(args.settle_s)
                out["caller"] = await measure(r, caller.pid, args.seconds)
            finally:
                stop(caller)

            worker = spawn(
                [sys.executable, "-m", "reach_cli.app", "worker", "idle_agent:app"]
                + ["--redis-url", srv.url, "--namespace", ns],
                env,
                False,
            )
            try:
                reg = Registry(r, ns)
                deadline = time.monotonic() + 60
                while not ((a := await reg.get("idle-worker")) and a.ready):
                    if worker.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("the worker did not become ready")
                    await anyio.sleep(0.1)
                await anyio.sleep(args.settle_s)
                out["worker"] = await measure(r, worker.pid, args.seconds)
            finally:
                stop(worker)
            return out
        finally:
            await r.aclose()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        modules = Path(tmp)
        (modules / "idle_agent.py").write_text(AGENT_MODULE)
        (modules / "idle_caller.py").write_text(CALLER_MODULE)
        rows = []
        for n in args.agents:
            row = await one_size(args, n, modules)
            rows.append(row)
            if not args.json:
                for who in ("worker", "caller"):
                    m = row[who]
                    top = ", ".join(f"{k} {v}" for k, v in list(m["by_command"].items())[:5])
                    print(
                        f"{n:>7} agents  {who:<6}  {m['commands_per_s']:>9.1f} cmd/s  "
                        f"cpu {m['cpu_pct']:>6.2f} %  redis cpu {m['redis_cpu_pct']:>6.2f} %"
                        f"  ({top})",
                        flush=True,
                    )
        if args.json:
            print(json.dumps({"repo": str(args.repo), "rows": rows}, indent=2))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, nargs="+", default=[100, 10_000])
    p.add_argument("--capabilities", type=int, default=100, help="over which the fleet spreads")
    p.add_argument("--called-agents", type=int, default=10, help="agents of bench.called")
    p.add_argument("--seconds", type=float, default=10.0, help="measured per process")
    p.add_argument("--settle-s", type=float, default=4.0, help="after start, before measuring")
    p.add_argument("--repo", type=Path, default=ROOT, help="checkout whose reach is measured")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    anyio.run(main, parse())

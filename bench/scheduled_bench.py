"""How late scheduled sends are delivered: ``--messages`` sends (10,000) scheduled with
``Client.send(at=...)`` due evenly over ``--window-s`` (10 s) starting ``--lead-s`` (8 s)
after the first is scheduled, one ``reach worker`` process (default settings: a 1 s sweep
interval; its runtime holds the namespace's chores and moves due sends as they come due).

    .venv/bin/python bench/scheduled_bench.py [--messages 10000] [--window-s 10] [--lead-s 8]
        [--rounds 3] [--mode placed|ran] [--json]

``--mode placed`` (the default): the sends go to an agent registered with no process
reading its inbox (the worker process serves another capability and moves the sends);
the delay is the inbox entry's id (the Redis server's ms at the XADD) minus the due time
kept in the message's task record (``due_ms``): the scheduler's own lateness, one clock.
``--mode ran``: the worker's own handler takes them and notes the wall-clock ms it
started each (one machine, one clock): the inbox read and the claim are in the delay too.
Prints per round the time to schedule them all, then p50 / p99 / max of the delay (ms),
how many were more than 100 ms late, and that every send was delivered exactly once. An
embedded Redis; nothing else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from reach import Agent, Client, Context
from reach.embedded import RedisServer
from reach.envelope import decode_envelope
from reach.keys import Keys
from reach.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
CAP = "bench.scheduled"
RAN = "bench:scheduled:ran"  # msg_id -> the ms its handler started (HSETNX: the first run)
RUNS = "bench:scheduled:runs"  # msg_id -> how many times its handler ran
SCHEDULING = 64  # sends scheduled side by side


OTHER = "bench.other"  # what the worker serves in --mode placed (it only moves the sends)
SILENT = "silent-1"  # --mode placed: the agent the sends go to, no process behind it


def other_agent() -> Agent:
    """The worker's agent in ``--mode placed``: it serves another capability."""
    app = Agent("scheduled-bench-mover", capabilities=[OTHER])

    @app.handler(OTHER)
    async def nothing(payload: Any, ctx: Context) -> None:
        return None

    return app


def agent() -> Agent:
    """The worker's agent: a handler that notes when it started each message."""
    app = Agent("scheduled-bench-1", capabilities=[CAP])

    @app.handler(CAP)
    async def note(payload: Any, ctx: Context) -> None:
        started = int(time.time() * 1000)
        await ctx.redis.hsetnx(RAN, ctx.msg_id, started)
        await ctx.redis.hincrby(RUNS, ctx.msg_id, 1)

    return app


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _worker(url: str, ns: str, factory: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    cmd = [sys.executable, "-m", "reach_cli.app", "worker", f"bench.scheduled_bench:{factory}"]
    cmd += ["--redis-url", url, "--namespace", ns, "--log-level", "warning"]
    cmd += ["--concurrency", "64"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)


async def _placed(r: Any, keys: Keys, n: int) -> tuple[dict[str, int], dict[str, int]]:
    """--mode placed: msg_id -> the server ms its inbox entry was added, and how many times."""
    inbox = keys.inbox(SILENT, "normal")
    while await r.xlen(inbox) < n:
        await anyio.sleep(0.2)
    at: dict[str, int] = {}
    count: dict[str, int] = {}
    for entry_id, fields in await r.xrange(inbox):
        m = decode_envelope(fields[b"e"]).msg_id
        at.setdefault(m, int(entry_id.split(b"-")[0]))
        count[m] = count.get(m, 0) + 1
    return at, count


async def _round(
    url: str, ns: str, n: int, window_s: float, lead_s: float, mode: str
) -> dict[str, float]:
    async with Client(redis_url=url, namespace=ns) as client:
        r = client.redis
        if mode == "placed":
            await Registry(r, ns).register(
                SILENT,
                instance_id="i",
                version=1,
                capabilities=[CAP],
                lease_ms=600_000,
                evict_after_ms=600_000,
                ready=True,
            )
        with anyio.fail_after(60):
            while True:
                try:
                    await client.eligible(CAP)
                    await client.eligible(OTHER if mode == "placed" else CAP)
                    break
                except Exception:  # noqa: BLE001 - not registered yet
                    client.invalidate()
                    await anyio.sleep(0.1)
        await r.delete(RAN, RUNS)
        start = time.time() + lead_s
        ids: list[str] = []
        t0 = time.perf_counter()
        sem = anyio.Semaphore(SCHEDULING)

        async def one(i: int) -> None:
            async with sem:
                ids.append(await client.send(CAP, i, at=start + window_s * i / n))

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        scheduling_s = time.perf_counter() - t0
        if time.time() > start:
            print(f"warning: scheduling took {scheduling_s:.1f}s, past --lead-s {lead_s}")
        keys = Keys(ns)
        with anyio.fail_after(lead_s + window_s + 120):
            if mode == "placed":
                ran, runs = await _placed(r, keys, n)
            else:
                while await r.hlen(RAN) < n:
                    await anyio.sleep(0.2)
                ran = {k.decode(): int(v) for k, v in (await r.hgetall(RAN)).items()}
                runs = {k.decode(): int(v) for k, v in (await r.hgetall(RUNS)).items()}
        async with r.pipeline(transaction=False) as p:
            for m in ids:
                p.hget(keys.idem(m), "due_ms")
            dues = [int(x) for x in await p.execute()]
    delays = [ran[m] - due for m, due in zip(ids, dues, strict=True)]
    return {
        "scheduling_s": scheduling_s,
        "delay_p50_ms": statistics.median(delays),
        "delay_p99_ms": _pct(delays, 0.99),
        "delay_max_ms": max(delays),
        "early": sum(d < 0 for d in delays),
        "over_100ms": sum(d > 100 for d in delays),
        "once": sum(runs.get(m) == 1 for m in ids),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--lead-s", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mode", choices=("placed", "ran"), default="placed")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rounds: list[dict[str, float]] = []
    with RedisServer() as server:
        for k in range(a.rounds):
            ns = f"schedbench{k}"
            proc = _worker(server.url, ns, "other_agent" if a.mode == "placed" else "agent")
            try:
                res = anyio.run(_round, server.url, ns, a.messages, a.window_s, a.lead_s, a.mode)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            rounds.append(res)
            if not a.json:
                print(f"round {k + 1}: " + ", ".join(f"{n} {v:g}" for n, v in res.items()))
    med = {n: statistics.median(r[n] for r in rounds) for n in rounds[0]}
    if a.json:
        print(json.dumps({"rounds": rounds, "median": med}))
    else:
        print(
            f"{a.messages} sends due over {a.window_s}s ({a.mode}), median of {a.rounds} rounds: "
            + ", ".join(f"{n} {v:g}" for n, v in med.items())
        )


if __name__ == "__main__":
    main()

"""Where a worker's time goes: the benchmark's backlog workload, the worker in this process.

An embedded Redis (a free port) gets N no-op messages in the benchmark agent's inbox (as
``reach bench`` loads its backlog: send.lua, pipelined); then ``bench_agent()`` of
``reach_cli.tools.bench`` runs here until the inbox is empty, under cProfile
(``--profile cprofile``, the default), or bare (``--profile none``: throughput only).
Printed: messages/s of the drain, Redis commands and round trips per message, the worker's
own round-trip count, and the top entries of the profile by own time (``--top``) and by
cumulative time for the worker's parts.

Run:  python bench/profile_worker.py [--messages 20000] [--concurrency 64]
          [--batch 64] [--profile cprofile|none] [--top 25] [--out worker.prof]

cProfile slows every Python call down by a similar factor, so compare its figures with
each other (what share of the worker's time a function takes), not with an unprofiled run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import threading
import time
from typing import Any

import anyio
from reach_cli.tools.bench import AGENT_ID, CAP, NS, bench_agent, load_backlog

from reach import Client, admin
from reach.connection import connect
from reach.embedded import RedisServer
from reach.keys import Keys


async def _load(url: str, n: int) -> None:
    keys = Keys(NS)
    r = await connect(url)
    try:
        async with Client(redis=r, namespace=NS) as c:
            envs = [c.build(CAP, {"i": i}, reply=False) for i in range(n)]
            await load_backlog(r, keys, envs)
    finally:
        await r.aclose()


async def _stats(url: str) -> tuple[dict[str, int], int]:
    """Calls per command (INFO commandstats; those inside scripts included), and the
    requests or pipelines Redis has read (INFO stats)."""
    r = await connect(url)
    try:
        info = await r.info("commandstats")
        cmds = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}
        # The Redis server's CPU time so far (µs), as the pseudo-command "µs".
        cpu = await r.info("cpu")
        cmds["µs"] = int(1e6 * (float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])))
        reads = int((await r.info("stats"))["total_reads_processed"])
        return cmds, reads
    finally:
        await r.aclose()


async def _drain(
    url: str, n: int, concurrency: int, batch: int, prof: cProfile.Profile | None
) -> dict[str, Any]:
    keys = Keys(NS)
    agent = bench_agent()
    ready = threading.Event()
    cmds0, reads0 = await _stats(url)
    t: dict[str, float] = {}
    poll = await connect(url)
    polls = 0
    running: list[Any] = []  # the runtime, for its round-trip count

    async def watch() -> None:
        nonlocal polls
        while not ready.is_set():
            await anyio.sleep(0.001)
        t["t0"] = time.perf_counter()
        running.append(agent.runtime)
        while True:
            depth = sum((await admin.queue_depths(poll, keys, [AGENT_ID]))[AGENT_ID].values())
            polls += 1
            if depth == 0:
                break
            await anyio.sleep(0.005)
        t["t1"] = time.perf_counter()
        agent.stop()

    try:
        if prof is not None:
            prof.enable()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await agent.run(
                redis_url=url,
                namespace=NS,
                concurrency=concurrency,
                batch=batch,
                handle_signals=False,
                ready_event=ready,
            )
        if prof is not None:
            prof.disable()
    finally:
        await poll.aclose()
    cmds1, reads1 = await _stats(url)
    seconds = t["t1"] - t["t0"]
    # The polling (a pipeline of XLEN) and INFO are the profiler's, not the worker's.
    redis_us = (cmds1.pop("µs") - cmds0.pop("µs")) / n
    per_cmd = {
        k: (v - cmds0.get(k, 0)) / n
        for k, v in cmds1.items()
        if k not in ("info", "xlen") and v > cmds0.get(k, 0)
    }
    rt = running[0].stats.counts["round_trips"] if running and running[0] else 0
    return {
        "messages": n,
        "seconds": seconds,
        "msgs_per_s": n / seconds,
        # Startup, polling and the stop included: a little above the drain's own figures.
        "redis_commands_per_msg": sum(per_cmd.values()),
        "round_trips_per_msg": (reads1 - reads0 - polls) / n,
        "worker_round_trips_per_msg": rt / n,
        "redis_cpu_us_per_msg": redis_us,
        **{f"  {k}": v for k, v in sorted(per_cmd.items(), key=lambda kv: -kv[1])},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch", type=int, default=64, help="most inbox entries read at once")
    p.add_argument("--profile", choices=("cprofile", "none"), default="cprofile")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default="", help="also write the raw profile (pstats) here")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with RedisServer() as server:
        anyio.run(_load, server.url, a.messages)
        prof = cProfile.Profile() if a.profile == "cprofile" else None
        res = anyio.run(_drain, server.url, a.messages, a.concurrency, a.batch, prof)
    for k, v in res.items():
        print(f"{k:28} {v:.3f}" if isinstance(v, float) else f"{k:28} {v}")
    if prof is None:
        return
    if a.out:
        prof.dump_stats(a.out)
    for order in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(order).print_stats(a.top)
        print(s.getvalue())


if __name__ == "__main__":
    main()

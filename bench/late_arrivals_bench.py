"""What the sweeper's reroute chore costs a pass while many agents are in their grace (a
deploy that stopped them all within the last 30 s): N agents registered and deregistered
directly (no worker process), then passes of :func:`reach.sweeper.reroute_evicted`
timed, with none of their inboxes holding anything, and with ``--late`` of them holding
one late message each (moved to the one live agent, registered with a long lease; the
moved messages are deleted again before the next pass, so each pass moves as many).

    .venv/bin/python bench/late_arrivals_bench.py [--agents 0 100 1000] [--passes 20] [--late 10]
        [--unfiltered]

An embedded Redis, one Client. Prints per N the median and p95 (ms) of a pass and its
Redis commands (``INFO commandstats`` calls, counted around the quiet passes).
``--unfiltered`` turns off the pipelined filter of agents with nothing to move, so every
listed agent is read one by one (its record, its leave time, its inbox): what a pass
would cost without it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time

from reach.client import Client
from reach.connection import connect
from reach.embedded import RedisServer
from reach.envelope import encode
from reach.keys import Keys
from reach.registry import Registry
from reach.sweeper import _Chores, reroute_evicted

NS = "bench"


async def _calls(r: object) -> int:
    stats = await r.info("commandstats")  # type: ignore[attr-defined]
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


async def run(agents: int, passes: int, late: int) -> None:
    with RedisServer() as srv:
        r = await connect(srv.url)
        try:
            reg, keys = Registry(r, NS), Keys(NS)
            await reg.register(
                "live-1",
                instance_id="i",
                version=1,
                capabilities=["bench.work"],
                lease_ms=600_000,
                evict_after_ms=600_000,
                ready=True,
            )
            for i in range(agents):
                await reg.register(
                    f"a-{i}",
                    instance_id="i",
                    version=1,
                    capabilities=["bench.work"],
                    lease_ms=600_000,
                    evict_after_ms=600_000,
                    ready=True,
                )
                await reg.deregister(f"a-{i}")
            async with Client(redis_url=srv.url, namespace=NS, slow_start_s=0) as c:
                quiet: list[float] = []
                before = await _calls(r)
                for _ in range(passes):
                    t = time.perf_counter()
                    await reroute_evicted(r, keys, c, reg)
                    quiet.append(time.perf_counter() - t)
                per_pass = (await _calls(r) - before) / passes
                busy: list[float] = []
                for _ in range(passes if late else 0):
                    for i in range(min(late, agents)):
                        env = c.build("bench.work", {}, reply=False)
                        await r.xadd(keys.inbox(f"a-{i}", "normal"), {"e": encode(env)})
                    t = time.perf_counter()
                    moved = await reroute_evicted(r, keys, c, reg)
                    busy.append(time.perf_counter() - t)
                    assert moved.rerouted == min(late, agents), moved
                    for k in keys.inboxes("live-1"):
                        await r.delete(k)
            listed = await r.scard(reg.keys.reroute)
            line = (
                f"{agents} agents in their grace ({listed} listed): quiet pass median "
                f"{statistics.median(quiet) * 1e3:.2f} ms, p95 {_p95(quiet) * 1e3:.2f} ms, "
                f"{per_pass:.0f} Redis commands"
            )
            if busy:
                line += (
                    f"; with {min(late, agents)} late messages: median "
                    f"{statistics.median(busy) * 1e3:.2f} ms, p95 {_p95(busy) * 1e3:.2f} ms"
                )
            print(line)
        finally:
            await r.aclose()


def _p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, int(len(s) * 0.95) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[0, 100, 1000])
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--late", type=int, default=10)
    ap.add_argument("--unfiltered", action="store_true")
    args = ap.parse_args()
    logging.getLogger("reach.sweeper").setLevel(logging.ERROR)  # a line per moved inbox
    if args.unfiltered:

        async def none(self: _Chores, members: object, left: str) -> set[str]:
            return set()

        _Chores._quiet = none  # type: ignore[method-assign]
    for n in args.agents:
        asyncio.run(run(n, args.passes, args.late))


if __name__ == "__main__":
    main()

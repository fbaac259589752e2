"""What a send to a capability no agent declares costs the caller, with N agents
registered: the ``NoAgentAvailable`` it raises counts the registry's live agents and
capabilities (to say so, and to suggest a close name), which is a read of up to 1,000
records; the client reuses those figures for a second while its registry view is unchanged.

    .venv/bin/python bench/no_agent_bench.py [--agents 10 1000] [--sends 200]

An embedded Redis, N agents registered directly (no worker process: nothing handles
anything), 50 capabilities among them, one Client; ``--sends`` sends to a misspelt name,
one at a time. Prints the median and p95 (ms) of the time each takes to fail, and the
error's text.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from reach.client import Client
from reach.connection import connect
from reach.embedded import RedisServer
from reach.errors import NoAgentAvailable
from reach.registry import Registry


async def run(agents: int, sends: int) -> None:
    with RedisServer() as srv:
        r = await connect(srv.url)
        try:
            reg = Registry(r, "bench")
            for i in range(agents):
                await reg.register(
                    f"a-{i}",
                    instance_id="i",
                    version=1,
                    capabilities=[f"cap.c{i % 50}"],
                    lease_ms=600_000,
                    evict_after_ms=600_000,
                    ready=True,
                )
            async with Client(redis_url=srv.url, namespace="bench") as c:
                times: list[float] = []
                text = ""
                for _ in range(sends):
                    t = time.perf_counter()
                    try:
                        await c.send("cap.c7x", 1)
                    except NoAgentAvailable as e:
                        text = str(e)
                    times.append(time.perf_counter() - t)
            times.sort()
            p95 = times[int(len(times) * 0.95) - 1]
            print(
                f"{agents} agents: median {statistics.median(times) * 1e3:.2f} ms, "
                f"p95 {p95 * 1e3:.2f} ms; {text}"
            )
        finally:
            await r.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[10, 1000])
    ap.add_argument("--sends", type=int, default=200)
    args = ap.parse_args()
    for n in args.agents:
        asyncio.run(run(n, args.sends))


if __name__ == "__main__":
    main()

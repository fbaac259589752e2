"""The cost of per-tenant quotas (reach.quotas) at the caller's send: ``Client.send``
latency (one send at a time) and throughput (``--concurrency`` sends in flight), with no
quota, with a ``max_inbox`` quota only, and with a send-rate quota too (set high enough to
refuse nothing: what is measured is the bucket's extra script call).

    .venv/bin/python bench/quota_bench.py [--sends 2000] [--rounds 5] [--concurrency 50]

On a ``redis-server`` of its own (reach.embedded). An agent is registered but never reads:
what is measured is the send path only (routing, the quota check, the inbox write); the
inbox is emptied between runs. The three settings are alternated ``--rounds`` times;
medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.keys import Keys
from reach.limits import parse_limit
from reach.quotas import clear_quotas, set_quotas
from reach.registry import Registry

NS = "quotabench"
CAP = "bench.quota"
SETTINGS = ("off", "max_inbox", "max_inbox+send_rate")


async def setting(r: AnyRedis, keys: Keys, name: str) -> None:
    await clear_quotas(r, keys)
    if name == "max_inbox":
        await set_quotas(r, keys, max_inbox=10_000_000)
    elif name == "max_inbox+send_rate":
        await set_quotas(
            r, keys, max_inbox=10_000_000, send_rate=parse_limit("1000000/s", burst=1_000_000)
        )


async def one_run(
    url: str, r: AnyRedis, keys: Keys, sends: int, concurrency: int
) -> tuple[float, float]:
    """(median µs of a lone send, sends/s with ``concurrency`` in flight)."""
    await r.delete(*keys.inboxes("qb-1"))
    async with Client(redis_url=url, namespace=NS) as c:
        await c.send(CAP, 0)  # the view, the scripts and the quotas loaded
        lat = []
        for i in range(sends):
            t = time.perf_counter()
            await c.send(CAP, i)
            lat.append(time.perf_counter() - t)
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                await c.send(CAP, i)

        t = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(sends)))
        rate = sends / (time.perf_counter() - t)
    return statistics.median(lat) * 1e6, rate


async def main(sends: int, rounds: int, concurrency: int) -> dict[str, dict[str, float]]:
    with RedisServer() as srv:
        r = await connect(srv.url)
        keys = Keys(NS)
        reg = Registry(r, NS)
        await reg.register(
            "qb-1",
            instance_id="qb",
            version=time.time_ns() // 1000,
            capabilities=[CAP],
            lease_ms=600_000,
            evict_after_ms=1_200_000,
            ready=True,
        )
        out: dict[str, dict[str, list[float]]] = {s: {"lat": [], "rate": []} for s in SETTINGS}
        for _ in range(rounds):
            for name in SETTINGS:
                await setting(r, keys, name)
                lat, rate = await one_run(srv.url, r, keys, sends, concurrency)
                out[name]["lat"].append(lat)
                out[name]["rate"].append(rate)
        await r.aclose()
    return {
        name: {
            "lone_send_p50_us": round(statistics.median(v["lat"]), 1),
            "sends_per_s": round(statistics.median(v["rate"])),
        }
        for name, v in out.items()
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sends", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=50)
    a = p.parse_args()
    print(json.dumps(asyncio.run(main(a.sends, a.rounds, a.concurrency)), indent=2))

"""One stream read's cost in the reading process: through redis-py's client against the
same read on a connection held for it (``reach._blocking.HeldReads``, as a client's reply
reader and a worker's inbox reader read).

An embedded Redis (a free port) holds a stream of one entry; ``--reads`` reads of it
(``XREAD COUNT 1 STREAMS s 0``: answered at once, so the figure is the reader's own work
and one round trip) each way, alternated over ``--rounds``. Printed: wall and CPU
microseconds per read, medians of the rounds.

Run:  python bench/read_cost.py [--reads 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from reach._blocking import HeldReads, stream_reply
from reach.connection import connect
from reach.embedded import RedisServer


async def _time(read: Callable[[], Awaitable[Any]], n: int) -> tuple[float, float]:
    for _ in range(100):  # warm
        await read()
    w, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        await read()
    return (time.perf_counter() - w) / n * 1e6, (time.process_time() - c) / n * 1e6


async def _main(url: str, args: argparse.Namespace) -> None:
    r: Any = await connect(url)
    held = HeldReads(r)
    try:
        await r.xadd("s", {"a": "1"})

        async def client_read() -> Any:
            return await r.xread({"s": "0"}, count=1)

        async def held_read() -> Any:
            return stream_reply(
                await held.call("XREAD", "COUNT", 1, "STREAMS", "s", "0", timeout_s=10)
            )

        def same(res: Any) -> list[Any]:
            return [[k, [list(e) for e in es]] for k, es in res]

        assert same(await client_read()) == same(await held_read())
        rows: dict[str, list[tuple[float, float]]] = {"client": [], "held": []}
        for _ in range(args.rounds):
            rows["client"].append(await _time(client_read, args.reads))
            rows["held"].append(await _time(held_read, args.reads))
    finally:
        await held.aclose()
        await r.aclose()
    print(f"one XREAD answered at once, medians of {args.rounds} rounds of {args.reads}:")
    for name, label in (("client", "redis-py client"), ("held", "held connection")):
        wall = statistics.median(x[0] for x in rows[name])
        cpu = statistics.median(x[1] for x in rows[name])
        print(f"  {label:16s} {wall:6.1f} µs wall, {cpu:6.1f} µs CPU per read")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reads", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with RedisServer() as srv:
        anyio.run(_main, srv.url, args)


if __name__ == "__main__":
    main()

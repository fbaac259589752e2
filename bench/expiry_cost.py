"""What a time limit around one await costs: ``asyncio.timeout``, ``anyio.move_on_after``
and reach's :class:`reach._expiry.expire_after`, each around ``await asyncio.sleep(0)``
(an await that yields to the loop once, as a socket read that finds its reply does), less
that await alone.

A lone request passes such a limit at each bound read or write on its path: in the
caller the reply of its send (the multiplexed connection's reader), the reply reader's
blocking read and its write, and the wait for the reply; in the worker its blocking read
and write and the reply of its settle. Each was an ``asyncio.timeout`` or an anyio scope;
``expire_after`` notes the limit in a heap of its event loop with one timer for all.

Printed: microseconds per use, the medians of ``--repeat`` rounds of ``--uses`` each.

Run:  python bench/expiry_cost.py [--uses 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio

from reach._expiry import expire_after


async def _bare(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _asyncio_timeout(n: int) -> None:
    for _ in range(n):
        async with asyncio.timeout(10):
            await asyncio.sleep(0)


async def _anyio_move_on_after(n: int) -> None:
    for _ in range(n):
        with anyio.move_on_after(10):
            await asyncio.sleep(0)


async def _expire_after(n: int) -> None:
    for _ in range(n):
        with expire_after(10):
            await asyncio.sleep(0)


FORMS: dict[str, Callable[[int], Awaitable[None]]] = {
    "asyncio.timeout": _asyncio_timeout,
    "anyio.move_on_after": _anyio_move_on_after,
    "reach expire_after": _expire_after,
}


async def _measure(uses: int, repeat: int) -> dict[str, float]:
    rounds: dict[str, list[float]] = {name: [] for name in ("bare", *FORMS)}
    for _ in range(repeat):  # the forms alternate within each round: a drift hits all
        for name, form in (("bare", _bare), *FORMS.items()):
            t0 = time.perf_counter()
            await form(uses)
            rounds[name].append((time.perf_counter() - t0) / uses * 1e6)
    return {name: statistics.median(v) for name, v in rounds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uses", type=int, default=50_000, help="limits per form and round")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (medians are printed)")
    a = ap.parse_args()
    if a.uses < 1 or a.repeat < 1:
        raise SystemExit("--uses and --repeat must be >= 1.")
    got = anyio.run(_measure, a.uses, a.repeat)
    bare = got.pop("bare")
    print(f"an await alone (asyncio.sleep(0)): {bare:.2f} µs; a limit around it adds:")
    for name, us in got.items():
        print(f"  {name:22s} {us - bare:5.2f} µs")


if __name__ == "__main__":
    main()

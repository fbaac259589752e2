"""A worker's Python function calls per handled message, counted (cProfile) rather than
timed: the worker-side twin of ``bench/redis_instructions.py``.

On this VM a worker's CPU per message moves by a fifth between runs of the same code
(``bench/worker_cost.py``), so a change worth a few per cent cannot be told from the noise
by timing. The function calls the worker makes per message barely move: this counts them.

Two runs, each with one ``reach worker`` process of the benchmark agent
(``reach_cli.tools.bench:bench_agent``, ``--concurrency 64``) started under ``python -m
cProfile`` on an embedded Redis: the worker is stopped (SIGSTOP), ``--messages`` no-op
messages go to its inbox through ``Client.send_many`` (claimed at send for it, as
``Client.send`` claims them; the second run sends ``2 × --messages``), it is continued,
drains its inbox and is stopped with SIGTERM, writing its profile. The difference between
the two runs, divided by the difference in messages, is what one more message costs:
its start-up, imports and idle work cancel out. Five runs of the same code agreed within
2 % here (147.9–150.2 calls at the default size, where ``bench/worker_cost.py``'s CPU
figure moved by a fifth); compare runs of the same ``--messages`` only: the batches a drain
forms, and so the per-batch share of each message, depend on its size (137–140 calls at
2,000).

Printed: function calls per message (Python functions and the built-ins they call, as
cProfile counts them), and the ``--top`` functions by calls per message. Calls weigh
unequally (a msgspec decode is one call), so compare code with it, and quote
``reach bench`` or ``bench/worker_cost.py`` for time. ``PYTHONPATH=<other checkout>``
counts that checkout's worker.

Run:  python bench/worker_calls.py [--messages 4000] [--top 25]
"""

from __future__ import annotations

import argparse
import pstats
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis
from reach_cli.tools import bench as b
from reach_cli.tools import floor

from reach import Client
from reach.embedded import RedisServer
from reach.keys import Keys
from reach.scripts.delivery import GROUP

Counts = dict[tuple[str, int, str], int]


async def _drain(url: str, worker: Any, n: int) -> None:
    """Stop ``worker``, fill its inbox with ``n`` messages, continue it, wait for the drain."""
    r: Any = aredis.Redis.from_url(url)
    inbox = Keys(b.NS).inbox(b.AGENT_ID, "normal")
    try:
        async with Client(redis_url=url, namespace=b.NS) as c:
            await c.eligible(b.CAP)
            await b.send_stopped(c, worker, n)
            worker.send_signal(signal.SIGCONT)
            with anyio.fail_after(300):
                while await floor.remaining(r, inbox, GROUP):
                    await anyio.sleep(0.02)
    finally:
        await r.aclose()


def _counted_run(url: str, n: int, tmp: Path) -> Counts:
    """Calls per function of one worker process that handled ``n`` messages."""
    out = tmp / f"worker-{n}.prof"
    profiled = ("-m", "cProfile", "-o", str(out))
    with b.reach_worker(url, tmp / f"worker-{n}.log", python_args=profiled) as w:
        anyio.run(_drain, url, w, n)
    if not out.exists():
        log = (tmp / f"worker-{n}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the worker wrote no profile; its log ends:\n{log}")
    stats: Any = pstats.Stats(str(out)).stats
    return {func: row[1] for func, row in stats.items()}  # row[1]: calls, recursive ones too


def _name(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":  # a built-in
        return name
    short = "/".join(Path(path).parts[-2:])
    return f"{short}:{line} {name}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=4000, help="messages of the first run")
    ap.add_argument("--top", type=int, default=25, help="functions listed")
    a = ap.parse_args()
    if a.messages < 500:
        sys.exit("--messages must be >= 500: fewer leave the clock's share too large.")
    n1, n2 = a.messages, 2 * a.messages
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        first = _counted_run(server.url, n1, Path(tmp))
        second = _counted_run(server.url, n2, Path(tmp))
    per = {f: (second.get(f, 0) - first.get(f, 0)) / (n2 - n1) for f in set(first) | set(second)}
    total = sum(per.values())
    print(f"function calls per handled message: {total:.1f} (runs of {n1:,} and {n2:,})")
    for f, v in sorted(per.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"  {v:6.2f}  {_name(f)}")


if __name__ == "__main__":
    main()

"""A Client through a Redis outage: what holding a send costs, and how fast the held
sends go out once Redis is back.

    .venv/bin/python bench/buffer_bench.py [--messages 5000] [--rounds 5] [--json]

One embedded Redis with AOF (``appendfsync always``) and one agent in this process (long
leases: it stays live through the outage). Each round: SIGKILL Redis, send ``--messages``
messages (the first finds Redis unreachable; the others join the buffer), start Redis
again on the same port, and time until ``client.pending_local()`` is empty (every held
message written to an inbox). Printed: medians over the rounds of the first send's time
(it meets the outage), µs per further held send, the flush time and messages/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import anyio

from reach import Agent, Client, Context, NoAgentAvailable
from reach.embedded import RedisServer

CAP = "bench.held"


async def run(messages: int, rounds: int) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="reach-buffer-bench-")
    server = RedisServer(data_dir=tmp, persistent=True, extra_args=("--appendfsync", "always"))
    server.start()
    agent = Agent("bench-held-1", capabilities=[CAP])
    handled = 0

    @agent.handler(CAP)
    async def handle(payload: Any, ctx: Context) -> None:
        nonlocal handled
        handled += 1

    opts = {"heartbeat_s": 1.0, "lease_s": 60.0, "evict_after_s": 120.0, "handle_signals": False}
    first_s: list[float] = []
    held_us: list[float] = []
    flush_s: list[float] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: agent.run(redis_url=server.url, namespace="bench", **opts))
            async with Client(
                redis_url=server.url, namespace="bench", buffer_max_messages=messages + 1
            ) as c:
                with anyio.fail_after(60):
                    while True:
                        c.invalidate()
                        try:
                            await c.eligible(CAP)
                            break
                        except NoAgentAvailable:
                            await anyio.sleep(0.05)
                for _ in range(rounds):
                    await anyio.to_thread.run_sync(server.kill)
                    t = time.perf_counter()
                    await c.send(CAP, 0)
                    first_s.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    for i in range(1, messages):
                        await c.send(CAP, i)
                    held_us.append((time.perf_counter() - t) / max(1, messages - 1) * 1e6)
                    assert len(c.pending_local()) == messages
                    await anyio.to_thread.run_sync(server.start)
                    t = time.perf_counter()
                    while c.pending_local():
                        await anyio.sleep(0.001)
                    flush_s.append(time.perf_counter() - t)
            agent.stop()
    finally:
        server.stop()
    flush = statistics.median(flush_s)
    return {
        "messages": messages,
        "rounds": rounds,
        "first_send_s": round(statistics.median(first_s), 4),
        "held_send_us": round(statistics.median(held_us), 1),
        "flush_s": round(flush, 3),
        "flush_msgs_per_s": round(messages / flush),
        "handled": handled,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = anyio.run(run, a.messages, a.rounds)
    if a.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:>18}: {v}")


if __name__ == "__main__":
    main()

"""A handler that blocks its worker's event loop: how often it runs, and how it ends.

Three real ``reach worker`` processes (``tests.support.agents_hostile:b1..b3``, sub-second
leases, ``--stall-s 0.3``) on a ``redis-server`` of its own; one message to
``hostile.block``, whose handler calls ``time.sleep(6)`` inside an async handler. Each run
stalls its agent, which is evicted; the message is taken over by the next agent. After
``--seconds`` it prints how many times the handler started (counted per key by the
handler), the task status and attempt, and the dead letters of the capability.

``--repo DIR`` runs the workers on the reach of another checkout (e.g. ``git archive`` of
an older commit unpacked in DIR, with this checkout's tests/support/agents_hostile.py
copied there) for a before/after comparison.

    python bench/blocking_handler.py
    python bench/blocking_handler.py --repo /tmp/reach-before
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import anyio

from reach.client import Client
from reach.embedded import RedisServer, find_server_binary
from reach.keys import Keys
from reach.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
FAST = [
    *("--heartbeat-s", "0.1", "--lease-s", "0.3", "--evict-after-s", "0.6"),
    *("--sweep-interval-s", "0.1", "--retry-base-s", "0.02", "--stall-s", "0.3"),
]


async def measure(seconds: float, repo: Path) -> None:
    env = dict(os.environ)
    if repo != ROOT:
        env["PYTHONPATH"] = f"{repo}{os.pathsep}{repo / 'cli'}"
    with RedisServer(binary=find_server_binary()) as srv:
        url, ns = srv.url, "blocking"
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - long-lived workers, killed at the end
                [sys.executable, "-m", "reach_cli.app", "worker"]
                + [f"tests.support.agents_hostile:{n}", "--redis-url", url, "--namespace", ns]
                + ["--log-level", "error", *FAST],
                cwd=repo,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            for n in ("b1", "b2", "b3")
        ]
        try:
            async with Client(redis_url=url, namespace=ns, slow_start_s=0) as c:
                reg = Registry(c.redis, ns)
                with anyio.fail_after(60):
                    while len(await reg.agents("hostile.block", ready=True, state="active")) < 3:
                        await anyio.sleep(0.1)
                msg_id = await c.send(
                    "hostile.block", {"sleep_s": 6}, idempotency_key="k", max_attempts=3
                )
                await anyio.sleep(seconds)
                starts = int(await c.redis.hget(Keys(ns).effects("hostile"), "k") or 0)
                st = await c.task(msg_id)
                letters = await c.redis.xrange(Keys(ns).dlq("hostile.block"))
                reasons = [f[b"reason"].decode() for _, f in letters]
                print(
                    f"after {seconds:g} s: handler started {starts} times, status {st.status}, "
                    f"attempt {st.attempt}, dead letters {reasons or 'none'}"
                )
        finally:
            for p in procs:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--repo", type=Path, default=ROOT)
    args = ap.parse_args()
    anyio.run(measure, args.seconds, args.repo.resolve())


if __name__ == "__main__":
    main()

"""A live worker for the fuzzing suite: one `reach worker` process per test module,
and the synchronous probes the hypothesis tests use between examples."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import redis

from reach.client import Client
from reach.errors import NoAgentAvailable
from reach.keys import GROUP, Keys
from tests.support.workers import Workers


def poll(probe: Callable[[], Any], *, timeout_s: float = 30.0, what: str = "condition") -> Any:
    """Call ``probe`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s (last: {value!r})")
        time.sleep(0.01)


def pending(r: redis.Redis, ns: str, agent_id: str) -> int:
    total = 0
    for key in Keys(ns).inboxes(agent_id):
        if r.exists(key):
            total += int(r.xpending(key, GROUP)["pending"])
    return total


def inbox_len(r: redis.Redis, ns: str, agent_id: str) -> int:
    return sum(int(r.xlen(k)) for k in Keys(ns).inboxes(agent_id))


def wait_settled(r: redis.Redis, ns: str, agent_id: str) -> None:
    """Every entry of the agent's inbox is gone: handled, dead-lettered or moved."""
    poll(
        lambda: inbox_len(r, ns, agent_id) == 0 and pending(r, ns, agent_id) == 0,
        what=f"inbox of {agent_id} settled",
    )


def assert_serving(workers: Workers, url: str, ns: str, *names: str) -> None:
    """Each named worker process is alive and answers a request addressed to it."""
    for n in names:
        p = workers.procs[n]
        assert p.poll() is None, f"worker {n} exited with {p.returncode}"

    async def ask() -> None:
        async with Client(redis_url=url, namespace=ns, slow_start_s=0) as c:
            for n in names:
                with anyio.fail_after(30):
                    while True:
                        try:
                            out = await c.request("hard.echo", {"ping": n}, target=n, timeout_s=20)
                            break
                        except NoAgentAvailable:  # not (yet) in this fresh client's view
                            c.invalidate()
                            await anyio.sleep(0.05)
                assert out["agent"] == n

    anyio.run(ask)


def start_ready(workers: Workers, url: str, ns: str, *names: str) -> None:
    for n in names:
        workers.start(n)
    assert_serving(workers, url, ns, *names)

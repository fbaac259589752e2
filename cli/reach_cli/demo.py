"""`reach demo`: a tour of reach with real worker processes on an embedded Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from functools import partial
import anyio

from reach.client import Client
from reach.connection import connect
from reach.embedded import resolve_url
from reach.errors import NoAgentAvailable, ReachError
from reach.keys import Keys
from reach.registry import Registry

from .common import console

NS = "demo"
TIMING = ["--heartbeat-s", "0.2", "--lease-s", "0.6", "--evict-after-s", "1.2",
          "--sweep-interval-s", "0.2", "--retry-base-s", "0.05"]  # fmt: skip


def _step(title: str) -> None:
    console.rule(f"[bold cyan]{title}")


def _cli(*args: str, url: str) -> None:
    """Run a `reach` command in-process, as an operator would type it."""
    from .app import app

    console.print(f"[dim]$ reach {' '.join(args)}[/dim]")
    try:
        app([*args, "--redis-url", url, "--namespace", NS], standalone_mode=False)
    except SystemExit:
        pass


def _worker(target: str, url: str, concurrency: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "reach_cli.app", "worker", target, "--redis-url", url,
           "--namespace", NS, "--log-level", "warning", "--concurrency", str(concurrency),
           *TIMING]  # fmt: skip
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)


def run_demo(*, fast: bool = False) -> None:
    pause = 0.0 if fast else 1.0
    url, server = resolve_url(None)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        if server is not None:
            console.print(f"embedded {server.binary.origin} server {server.binary.version_str} "
                          f"at {url} (stopped when the demo ends)")  # fmt: skip
        _step("1. three agents start as separate `reach worker` processes")
        for name, target, conc in [("summarizer-1", "reach_cli.demo_agents:summarizer_1", 1),
                                   ("summarizer-2", "reach_cli.demo_agents:summarizer_2", 4),
                                   ("reviewer-1", "reach_cli.demo_agents:reviewer", 4)]:  # fmt: skip
            procs[name] = _worker(target, url, conc)
        anyio.run(_wait_ready, url, 3)
        _cli("caps", url=url)
        _cli("agents", url=url)
        time.sleep(pause)
        anyio.run(_messaging, url, pause)
        _cli("dlq", "list", url=url)
        _step("5b. the operator repairs the downstream service and replays the dead letter")
        anyio.run(_repair, url)
        _cli("dlq", "replay", "--all", url=url)
        anyio.run(_wait_dlq_empty, url)
        _cli("dlq", "list", url=url)
        _step("6. summarizer-2 is killed (SIGKILL): probation, then evicted")
        procs["summarizer-2"].send_signal(signal.SIGKILL)
        procs["summarizer-2"].wait()
        anyio.run(_wait_state, url, "summarizer-2", "evicted")
        _cli("events", "--count", "12", url=url)
        _cli("agents", url=url)
        anyio.run(_after_kill, url)
        _step("7. the others get SIGTERM: they drain and deregister")
        for name, p in procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(timeout=30)
        _cli("agents", url=url)
        console.print("[bold green]demo finished[/bold green]")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if server is not None:
            server.stop()


async def _wait_ready(url: str, n: int, timeout_s: float = 30.0) -> None:
    r = await connect(url)
    try:
        reg = Registry(r, NS)
        with anyio.fail_after(timeout_s):
            while len(await reg.agents(ready=True, state="active")) < n:
                await anyio.sleep(0.05)
    finally:
        await r.aclose()


async def _wait_state(url: str, agent_id: str, state: str, timeout_s: float = 30.0) -> None:
    r = await connect(url)
    try:
        reg = Registry(r, NS)
        seen = ""
        with anyio.fail_after(timeout_s):
            while True:
                a = await reg.get(agent_id)
                now = a.state if a else "gone"
                if now != seen:
                    console.print(f"  {agent_id}: {now}")
                    seen = now
                if now == state:
                    return
                await anyio.sleep(0.05)
    finally:
        await r.aclose()


async def _messaging(url: str, pause: float) -> None:
    async with Client(redis_url=url, namespace=NS, default_timeout_s=10, slow_start_s=0) as c:
        _step("2. request/reply by capability (weighted round-robin, weights 2:1)")
        by: Counter[str] = Counter()
        for i in range(30):
            res = await c.request("text.summarize", {"text": f"message {i} " + "word " * 8})
            by[res["by"]] += 1
        console.print(f"  30 requests answered by: {dict(by)}")
        res = await c.request("code.review", {"code": "print('hi')\n"})
        console.print(f"  code.review -> {res}")
        res = await c.request("text.summarize", {"text": "only eu please"}, where={"region": "eu"})
        console.print(f"  where region=eu -> answered by {res['by']}")
        await anyio.sleep(pause)

        _step("3. priorities: a busy agent (concurrency 1) serves high, then normal, then low")
        order: list[str] = []

        async def one(prio: str) -> None:
            r = await c.request("text.summarize", {"text": prio, "work_s": 0.05},
                                priority=prio, target="summarizer-1")  # fmt: skip
            order.append(r["priority"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(c.request, "text.summarize", {"text": "busy", "work_s": 0.3},
                                  target="summarizer-1"))  # fmt: skip
            await anyio.sleep(0.1)  # the agent is now busy: the next ones queue up
            for prio in ["low"] * 6 + ["normal"] * 3 + ["high"] * 3:
                tg.start_soon(one, prio)
        console.print(f"  completion order: {' '.join(order)}")
        await anyio.sleep(pause)

        _step("4. failures: retried with backoff, then dead-lettered")
        try:
            await c.request("text.flaky", {"job": 42}, max_attempts=3)
        except ReachError as e:
            console.print(f"  caller got {type(e).__name__}: {e}")

        _step("5. a missing capability is a clear error")
        try:
            await c.request("image.generate", {})
        except NoAgentAvailable as e:
            console.print(f"  caller got NoAgentAvailable ({e.reason}): {e}")


async def _repair(url: str) -> None:
    r = await connect(url)
    try:
        await r.hset(Keys(NS).effects("demo"), "repaired", "1")
    finally:
        await r.aclose()


async def _wait_dlq_empty(url: str, timeout_s: float = 30.0) -> None:
    r = await connect(url)
    try:
        with anyio.fail_after(timeout_s):
            while await r.xlen(Keys(NS).dlq("text.flaky")) or await r.zcard(Keys(NS).delayed):
                await anyio.sleep(0.05)
    finally:
        await r.aclose()


async def _after_kill(url: str) -> None:
    async with Client(redis_url=url, namespace=NS, default_timeout_s=10, slow_start_s=0) as c:
        by: Counter[str] = Counter()
        for i in range(6):
            res = await c.request("text.summarize", {"text": f"after the kill {i}"})
            by[res["by"]] += 1
        console.print(f"  traffic goes on, answered by: {dict(by)}")


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_demo()

"""`reach demo`: a tour of reach with real worker processes on an embedded Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path

import anyio
from rich.table import Table

from reach.breaker import Breakers
from reach.client import Client
from reach.connection import connect
from reach.embedded import resolve_url
from reach.envelope import Envelope
from reach.errors import Cancelled, LoopDetected, NoAgentAvailable, ReachError
from reach.gather import vote
from reach.keys import Keys
from reach.registry import Registry

from .common import console

NS = "demo"
TIMING = [
    "--heartbeat-s",
    "0.2",
    "--lease-s",
    "0.6",
    "--evict-after-s",
    "1.2",
    "--sweep-interval-s",
    "0.2",
    "--retry-base-s",
    "0.05",
]


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
    cmd = [
        sys.executable,
        "-m",
        "reach_cli.app",
        "worker",
        target,
        "--redis-url",
        url,
        "--namespace",
        NS,
        "--log-level",
        "warning",
        "--concurrency",
        str(concurrency),
        *TIMING,
    ]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)


def run_demo(*, fast: bool = False) -> None:
    pause = 0.0 if fast else 1.0
    url, server = resolve_url(None)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        if server is not None:
            console.print(
                f"embedded {server.binary.origin} server {server.binary.version_str} "
                f"at {url} (stopped when the demo ends)"
            )
        _step("1. three agents start as separate `reach worker` processes")
        for name, target, conc in [
            ("summarizer-1", "reach_cli.demo_agents:summarizer_1", 1),
            ("summarizer-2", "reach_cli.demo_agents:summarizer_2", 4),
            ("reviewer-1", "reach_cli.demo_agents:reviewer", 4),
        ]:
            procs[name] = _worker(target, url, conc)
        anyio.run(_wait_ready, url, 3)
        _cli("caps", url=url)
        _cli("agents", url=url)
        time.sleep(pause)
        owners = anyio.run(_messaging, url, pause)
        _cli("dlq", "list", url=url)
        _step("6. the operator repairs the downstream service and replays the dead letter")
        anyio.run(_repair, url)
        _cli("dlq", "replay", "--all", url=url)
        anyio.run(_wait_dlq_empty, url)
        _cli("dlq", "list", url=url)
        _step("7. a broken summarizer joins: the circuit breaker opens and routes around it")
        procs["summarizer-3"] = _worker("reach_cli.demo_agents:broken", url, 4)
        anyio.run(_wait_ready, url, 4)
        anyio.run(_breaker, url)
        procs["summarizer-3"].send_signal(signal.SIGTERM)
        procs["summarizer-3"].wait(timeout=30)
        _step("7b. a caller gives up on a long summary: its handler is told and stops")
        cancelled = anyio.run(_cancel_long, url)
        _cli("task", cancelled, url=url)
        _step("7c. an audit is cancelled: the sub-task it started is cancelled with it")
        child = anyio.run(_cancel_subtask, url)
        _cli("task", child, url=url)
        _step("8. summarizer-2 is killed (SIGKILL): probation, then evicted; its sessions move")
        procs["summarizer-2"].send_signal(signal.SIGKILL)
        procs["summarizer-2"].wait()
        anyio.run(_wait_state, url, "summarizer-2", "evicted")
        _cli("events", "--count", "8", url=url)
        _cli("agents", url=url)
        anyio.run(_after_kill, url, owners)
        _step("9. the others get SIGTERM: they drain and deregister")
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(timeout=30)
        _cli("agents", url=url)
        _examples(url)
        console.print("[bold green]demo finished[/bold green]")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if server is not None:
            server.stop()


def _examples(url: str) -> None:
    """Step 10, from a source checkout: the agents of examples/ working together."""
    if (Path.cwd() / "examples" / "run_all.py").is_file() and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # the demo runs from the repository root
    try:
        from examples import run_all
    except ImportError:
        console.print(
            "[dim](examples/ is not importable from here: run the demo from the "
            "repository root to see the example agents)[/dim]"
        )
        return
    _step("10. examples/: a planner calls a summariser and a reviewer, keeping a session")
    procs = run_all.start_workers(url)
    try:
        anyio.run(run_all.wait_ready, url)
        if anyio.run(run_all.conversation, url) != 0:
            raise ReachError("the example conversation did not go as expected")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)


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


SESSIONS = [f"user-{i}" for i in range(12)]


async def _messaging(url: str, pause: float) -> dict[str, str]:
    """Steps 2-5; returns which agent owns each demo session (consistent hashing)."""
    async with Client(redis_url=url, namespace=NS, default_timeout_s=10, slow_start_s=0) as c:
        _step("2. request/reply by capability, under each routing policy")
        res = await c.request("code.review", {"code": "print('hi')\n"})
        console.print(f"  code.review -> {res}")
        res = await c.request("text.summarize", {"text": "only eu please"}, where={"region": "eu"})
        console.print(f"  where region=eu -> answered by {res['by']}")
        rows = []
        wrr: Counter[str] = Counter()
        for i in range(30):
            wrr[(await c.request("text.summarize", {"text": f"msg {i}"}))["by"]] += 1
        rows.append(("weighted_rr (weights 2:1)", "30 sequential", wrr))
        lc: Counter[str] = Counter()

        async def lc_caller() -> None:
            for i in range(5):
                r = await c.request(
                    "text.summarize", {"text": "x", "work_s": 0.02}, policy="least_conn"
                )
                lc[r["by"]] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(lc_caller)
        rows.append(("least_conn (summarizer-1: weight 2, one at a time)", "6 callers x 5", lc))
        owners: dict[str, str] = {}
        sticky = True
        for s in SESSIONS:
            seen = {
                (
                    await c.request(
                        "text.summarize", {"text": "turn"}, session_id=s, policy="consistent_hash"
                    )
                )["by"]
                for _ in range(3)
            }
            sticky = sticky and len(seen) == 1
            owners[s] = seen.pop()
        rows.append(
            (
                "consistent_hash (by session)",
                f"{len(SESSIONS)} sessions x 3",
                Counter(owners.values()),
            )
        )
        t = Table(title="which agent answered", title_justify="left", header_style="bold")
        for col in ("policy", "traffic", "summarizer-1", "summarizer-2"):
            t.add_column(col)
        for name, traffic, cnt in rows:
            t.add_row(name, traffic, str(cnt["summarizer-1"]), str(cnt["summarizer-2"]))
        console.print(t)
        console.print(
            f"  every session stayed on one agent: {sticky}; "
            f"user-0 -> {owners['user-0']}, user-1 -> {owners['user-1']}"
        )
        await anyio.sleep(pause)

        _step("3. priorities: a busy agent (concurrency 1) serves high, then normal, then low")
        order: list[str] = []

        async def one(prio: str) -> None:
            r = await c.request(
                "text.summarize",
                {"text": prio, "work_s": 0.05},
                priority=prio,
                target="summarizer-1",
            )
            order.append(r["priority"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(
                    c.request,
                    "text.summarize",
                    {"text": "busy", "work_s": 0.3},
                    target="summarizer-1",
                )
            )
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

        _step("5b. a streaming summariser: each word reaches the caller as it is produced")
        await _stream(c)

        _step("5c. agents calling agents: a loop (A -> B -> A) is refused, not waited for")
        t0 = time.perf_counter()
        try:
            await c.request("code.explain", {"text": "def f(): ...", "explain_first": True})
        except LoopDetected as e:
            console.print(
                f"  caller got LoopDetected after {time.perf_counter() - t0:.3f} s "
                f"(its deadline: 30 s)\n  the path: {e.path}"
            )

        _step("5d. a gather: every summarizer asked at once (quorum: all), the answers voted on")
        g = await c.gather(
            "text.summarize", {"text": "agents reach each other by capability"}, quorum="all"
        )
        for a in g.answers:
            console.print(f"  {a.agent_id} answered {a.result['summary']!r}")
        v = vote(g, key=lambda r: r["summary"])
        console.print(
            f"  vote: {v.value['summary']!r}, {v.support} of {v.total}"
            + (" (a majority)" if v.majority else "")
        )

        _step("5e. human input: the reviewer asks before it merges; the demo answers")
        await _ask_and_answer(c)
    return owners


async def _ask_and_answer(c: Client) -> None:
    msg_id = await c.send("code.merge", {"change": "PR-42"}, timeout_s=60)
    async for change in c.watch(msg_id, timeout_s=30):
        if change.status == "input_required":
            console.print(f"  task {msg_id} is input_required: {change.question!r}")
            break
    console.print(f"  answering: reach task answer {msg_id} '{{\"merge\": true}}'")
    await c.answer(msg_id, {"merge": True})
    result = await c.result(msg_id, timeout_s=30)
    console.print(f"  the handler went on: {result}")


async def _breaker(url: str) -> None:
    breakers = Breakers(min_requests=3, error_rate=0.5, cooldown_s=30)
    async with Client(
        redis_url=url, namespace=NS, default_timeout_s=10, slow_start_s=0, breakers=breakers
    ) as c:
        by: Counter[str] = Counter()
        for i in range(24):
            try:
                by[
                    (await c.request("text.summarize", {"text": f"m{i}"}, max_attempts=1))["by"]
                ] += 1
            except ReachError:
                by["error (summarizer-3)"] += 1
        console.print(f"  24 requests: {dict(by)}")
        console.print(
            f"  breaker of summarizer-3: {breakers.state('summarizer-3')} "
            "(skipped until a half-open probe after the cool-down)"
        )


async def _stream(c: Client) -> None:
    """A streaming summariser: chunks printed as they arrive, then the final result."""
    t0 = time.perf_counter()
    firsts: list[float] = []
    words: list[str] = []
    async with c.stream(
        "text.stream", {"text": "reach streams a handler's chunks to its caller as they come"}
    ) as s:
        async for chunk in s:
            firsts.append(time.perf_counter() - t0)
            words.append(str(chunk))
            console.print(f"  +{firsts[-1] * 1000:5.0f} ms  chunk {len(words)}: {chunk}")
    console.print(
        f"  first chunk after {firsts[0] * 1000:.0f} ms, last after {firsts[-1] * 1000:.0f} ms; "
        f"final result {s.result}"
    )


async def _call_noting_cancel(c: Client, env: Envelope, outcome: list[str]) -> None:
    """Call ``env``; note in ``outcome`` how it ended (the demo expects Cancelled)."""
    try:
        await c.call(env)
        outcome.append("finished (not cancelled?)")
    except Cancelled as e:
        outcome.append(f"Cancelled: {e}")


async def _cancel_subtask(url: str) -> str:
    """A parent (code.audit) whose handler started a 60 s summary through ctx.client is
    cancelled: its caller gets Cancelled and the child is cancelled too; returns the
    child's msg_id."""
    async with Client(redis_url=url, namespace=NS) as c:
        env = c.build("code.audit", {"module": "billing"}, timeout_s=90)
        outcome: list[str] = []
        fx = Keys(NS).effects("demo")
        async with anyio.create_task_group() as tg:
            tg.start_soon(_call_noting_cancel, c, env, outcome)
            with anyio.fail_after(30):
                while True:
                    child = await c.redis.hget(fx, "audit_child")
                    if child and (await c.task(child.decode())).status == "running":
                        break
                    await anyio.sleep(0.05)
            child_id: str = child.decode()
            console.print(f"  audit {env.msg_id} runs; its sub-task {child_id} runs")
            res = await c.cancel(env.msg_id, by="the demo")
            console.print(f"  cancel the audit: {res.outcome} (it was {res.status})")
        console.print(f"  the audit's caller got {outcome[0]}")
        with anyio.fail_after(30):
            while (st := await c.task(child_id)).status != "cancelled":
                await anyio.sleep(0.05)
        console.print(f"  the sub-task is {st.status} too")
        return child_id


async def _cancel_long(url: str) -> str:
    """A 60 s summary, cancelled while it runs (client.cancel): the caller gets
    reach.Cancelled, the handler sees ctx.cancelled; returns its msg_id."""
    async with Client(redis_url=url, namespace=NS) as c:
        env = c.build("text.summarize", {"text": "a very long report", "work_s": 60}, timeout_s=90)
        outcome: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(_call_noting_cancel, c, env, outcome)
            with anyio.fail_after(30):
                while (await c.task(env.msg_id)).status != "running":
                    await anyio.sleep(0.05)
            t0 = time.perf_counter()
            res = await c.cancel(env.msg_id, by="the demo")
            console.print(f"  cancel {env.msg_id}: {res.outcome} (it was {res.status})")
        console.print(f"  the caller got {outcome[0]} after {time.perf_counter() - t0:.3f} s")
        r = c.redis
        saw = await r.hget(Keys(NS).effects("demo"), "saw_cancel")
        seen = saw is not None and saw.decode() == env.msg_id
        console.print(f"  the handler saw ctx.cancelled: {seen}")
        return env.msg_id


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


async def _after_kill(url: str, owners: dict[str, str]) -> None:
    async with Client(redis_url=url, namespace=NS, default_timeout_s=10, slow_start_s=0) as c:
        now = {
            s: (
                await c.request(
                    "text.summarize", {"text": "again"}, session_id=s, policy="consistent_hash"
                )
            )["by"]
            for s in SESSIONS
        }
    moved = [s for s in SESSIONS if now[s] != owners[s]]
    stayed = [s for s in SESSIONS if now[s] == owners[s]]
    console.print(
        f"  sessions that were on summarizer-2 moved: {len(moved)} "
        f"({', '.join(moved) or '-'}); the other {len(stayed)} stayed where they were"
    )


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_demo()

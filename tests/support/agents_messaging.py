"""Agents and helpers for the messaging tests (issue 3).

The factories (``crash_agent``, ``echo_agent``) are what ``reach worker
tests.support.agents_messaging:NAME`` runs in a child process; they take no arguments and read
``REACH_TEST_*`` environment variables instead. The helpers serve in-process agents
(:func:`serving`), wait for readiness by polling the registry, and count side effects in
Redis: every handler that "does something" increments ``Keys(ns).effects(name)`` with the
message's idempotency key as the field, so a test can tell how often it really ran.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio

from reach import Agent, Context
from reach.client import Client
from reach.connection import AnyRedis
from reach.errors import NoAgentAvailable
from reach.keys import Keys
from tests.support.waiting import wait_until

T = TypeVar("T")

# Sub-second leases, fast sweeps and retries: what every in-process agent of these tests uses.
FAST: dict[str, Any] = {
    "heartbeat_s": 0.1,
    "lease_s": 0.3,
    "evict_after_s": 0.6,
    "sweep_interval_s": 0.1,
    "handle_signals": False,
    "retry_base_s": 0.05,
    "block_ms": 200,
    "drain_timeout_s": 2.0,
}

# The same settings on the `reach worker` command line.
FAST_CLI = [
    "--heartbeat-s",
    "0.1",
    "--lease-s",
    "0.3",
    "--evict-after-s",
    "0.6",
    "--sweep-interval-s",
    "0.1",
    "--retry-base-s",
    "0.05",
    "--drain-timeout-s",
    "2",
    "--log-level",
    "warning",
]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- side effects ----------------------------------------------------------------------
async def bump(ctx: Context, name: str) -> int:
    """Record one side effect of ``name`` for this message (field = idempotency key)."""
    return int(await ctx.redis.hincrby(ctx.keys.effects(name), ctx.idempotency_key, 1))


async def bump_agent(ctx: Context, name: str) -> None:
    """Count one message of ``name`` handled by this agent (field = agent id)."""
    await ctx.redis.hincrby(ctx.keys.effects(f"{name}.by-agent"), ctx.agent_id, 1)


async def handled_by_agent(r: AnyRedis, ns: str, name: str) -> dict[str, int]:
    """How many messages of ``name`` each agent handled (what :func:`bump_agent` counted)."""
    return await effects(r, ns, f"{name}.by-agent")


async def effects(r: AnyRedis, ns: str, name: str) -> dict[str, int]:
    """All side effects of ``name``: idempotency key -> how many times it happened."""
    raw = await r.hgetall(Keys(ns).effects(name))
    return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}


@dataclass
class Burst:
    """What :func:`echo_burst` saw: each request's answer by index, the sends' msg_ids, and
    the seconds until every call returned and until every message was handled."""

    answers: dict[int, Any]
    sent: list[str]
    t_calls: float
    t_all: float


async def echo_burst(
    client: Client, r: AnyRedis, ns: str, n: int, *, while_running: Callable[[], Awaitable[None]]
) -> Burst:
    """Start ``n`` requests and ``n`` sends of ``test.echo`` at once on ``client``
    (alternating), run ``while_running`` beside them (it is cancelled once all is done) and
    wait until the echo agents have handled all ``2 * n`` messages."""
    answers: dict[int, Any] = {}
    sent: list[str] = []

    async def ask(i: int) -> None:
        answers[i] = await client.request("test.echo", i, timeout_s=120)

    async def tell(i: int) -> None:
        sent.append(await client.send("test.echo", -i))

    async def all_handled() -> bool:
        return sum((await effects(r, ns, "echo")).values()) >= 2 * n

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(while_running)
        async with anyio.create_task_group() as calls:
            for i in range(n):
                calls.start_soon(ask, i)
                calls.start_soon(tell, i)
        t_calls = time.perf_counter() - t0
        with anyio.fail_after(120):
            while not await all_handled():
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    return Burst(answers, sent, t_calls, time.perf_counter() - t0)


# -- waiting -------------------------------------------------------------------------------
async def wait_eligible(
    client: Client,
    capability: str,
    agent_ids: Iterable[str],
    *,
    timeout: float = 20.0,
    instance_of: dict[str, str] | None = None,
) -> None:
    """Wait until every one of ``agent_ids`` is eligible for ``capability``.

    ``instance_of`` (agent_id -> instance id to avoid) waits for a *new* instance, e.g. a
    worker restarted under the same agent_id.
    """
    want = set(agent_ids)

    async def ready() -> bool:
        client.invalidate()
        try:
            agents = await client.eligible(capability)
        except NoAgentAvailable:
            return False
        got = {a.agent_id: a.instance_id for a in agents}
        if not want <= set(got):
            return False
        return all(got[a] != old for a, old in (instance_of or {}).items())

    await wait_until(
        ready, timeout_s=timeout, what=f"agents {sorted(want)} eligible for {capability}"
    )


async def wait_status(client: Client, msg_id: str, *statuses: str, timeout: float = 15.0) -> Any:
    """Poll ``client.task(msg_id)`` until its status is one of ``statuses``."""

    async def check() -> Any:
        st = await client.task(msg_id)
        return st if st.status in statuses else None

    return await wait_until(check, timeout_s=timeout, what=f"task {msg_id} in {statuses}")


# -- serving in-process agents ---------------------------------------------------------
@asynccontextmanager
async def serving(
    redis_url: str, ns: str, *agents: Agent, client_id: str | None = None, **options: Any
) -> AsyncIterator[Client]:
    """Run ``agents`` in this event loop (FAST settings, overridable) and yield a Client
    once every agent is eligible for each of its capabilities; stop them on exit."""
    opts = {**FAST, **options}
    async with anyio.create_task_group() as tg:
        for a in agents:
            tg.start_soon(partial(a.run, redis_url=redis_url, namespace=ns, **opts))
        try:
            async with Client(redis_url=redis_url, namespace=ns, client_id=client_id) as client:
                for a in agents:
                    for cap in a.capabilities:
                        await wait_eligible(client, cap, [a.agent_id])
                yield client
        finally:
            for a in agents:
                a.stop()


class Gate:
    """An in-process handler that holds its slot until :meth:`open` (priority/deadline tests)."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self._open = anyio.Event()

    def open(self) -> None:
        self._open.set()

    async def hold(self) -> None:
        self.entered.set()
        await self._open.wait()


# -- factories for `reach worker` processes --------------------------------------------
def crash_agent() -> Agent:
    """``test.crash``: the first run of a message sleeps (long) before its side effect, so a
    test can SIGKILL the worker in that window; any later run does the effect at once."""
    agent_id = os.environ.get("REACH_TEST_AGENT_ID", "crash-1")
    first_sleep = float(os.environ.get("REACH_TEST_SLEEP_S", "30"))
    app = Agent(agent_id, capabilities=["test.crash"])

    @app.handler("test.crash")
    async def crash(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        starts = await bump(ctx, "crash.started")
        if starts == 1:
            await anyio.sleep(first_sleep)
        n = await bump(ctx, "crash")
        return {"echo": payload, "effects": n, "starts": starts, "pid": os.getpid()}

    return app


def echo_agent(agent_id: str | None = None) -> Agent:
    """``test.echo``: returns the payload, counts one side effect per message and one
    message handled per agent."""
    agent_id = agent_id or os.environ.get("REACH_TEST_AGENT_ID", "echo-1")
    app = Agent(agent_id, capabilities=["test.echo"])

    @app.handler("test.echo")
    async def echo(payload: Any, ctx: Context) -> dict[str, Any]:
        await bump_agent(ctx, "echo")  # first: once "echo" counts a message, both are done
        await bump(ctx, "echo")
        return {"echo": payload, "agent": ctx.agent_id}

    return app


def worker_cmd(target: str, redis_url: str, ns: str, *extra: str) -> list[str]:
    """The command line of a real ``reach worker`` process for ``tests.support.agents_messaging:target``."""
    return [
        sys.executable,
        "-m",
        "reach_cli.app",
        "worker",
        f"tests.support.agents_messaging:{target}",
        "--redis-url",
        redis_url,
        "--namespace",
        ns,
        *FAST_CLI,
        *extra,
    ]

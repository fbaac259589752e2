"""What the drain tests share (tests/integration/test_drain*.py): starting the sleepers of
tests.support.agents_lifecycle as `reach worker` processes, finding the message running,
and the checks every drain must pass."""

from __future__ import annotations

import subprocess

from reach.connection import AnyRedis
from reach.keys import Keys
from reach.registry import Registry
from tests.support.agents_messaging import effects
from tests.support.waiting import wait_until
from tests.support.workers import Workers

FACTORY = {"sleeper-a": "sleeper_a", "sleeper-b": "sleeper_b"}


async def start(
    workers: Workers, reg: Registry, agent_ids: list[str], *extra: str
) -> dict[str, subprocess.Popen[bytes]]:
    procs = {a: workers.start(FACTORY[a], *extra) for a in agent_ids}

    async def ready() -> bool:
        infos = [await reg.get(a) for a in agent_ids]
        return all(i is not None and i.ready for i in infos)

    await wait_until(ready, what="workers ready")
    return procs


async def running(r: AnyRedis, ns: str, name: str) -> tuple[str, str]:
    """The one message of handler ``name`` once it started: (its key, the agent running it)."""

    async def probe() -> tuple[str, str] | None:
        agents = await effects_text(r, ns, f"{name}.agent")
        return next(iter(agents.items()), None)

    return await wait_until(probe, what=f"{name} started")


async def effects_text(r: AnyRedis, ns: str, name: str) -> dict[str, str]:
    raw = await r.hgetall(Keys(ns).effects(name))
    return {k.decode(): v.decode() for k, v in raw.items()}


async def assert_ran_once(r: AnyRedis, ns: str, name: str, key: str) -> None:
    assert await effects(r, ns, f"{name}.started") == {key: 1}, "the handler started once"
    assert await effects(r, ns, f"{name}.finished") == {key: 1}
    assert await effects(r, ns, "drain.overlap") == {}, "no message ran on two agents at once"


async def assert_left_clean(r: AnyRedis, reg: Registry, agent_id: str) -> None:
    """Deregistered, and nothing left in its inbox for anyone to run again."""
    assert await reg.get(agent_id) is None, f"{agent_id} deregistered"
    for stream in reg.keys.inboxes(agent_id):
        assert not await r.exists(stream), f"{stream}: settled and dropped, nothing pending"

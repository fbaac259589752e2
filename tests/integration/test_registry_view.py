"""The client's registry view: one reload for many callers on a stale view, and per-agent
state dropped when an agent's record leaves the registry."""

from __future__ import annotations

import anyio
import pytest

from reach.breaker import Breakers
from reach.connection import AnyRedis
from reach.registry import Registry
from reach.view import RegistryView
from tests.registry_helpers import register

pytestmark = pytest.mark.anyio

CAP = "text.summarize"


async def test_callers_on_a_stale_view_share_one_reload(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    await register(reg, "a1", [CAP])
    view = RegistryView(reg, refresh_s=60.0)
    reloads = 0
    real = view._reload

    async def counting() -> None:
        nonlocal reloads
        reloads += 1
        await real()

    view._reload = counting  # type: ignore[method-assign]
    got: list[list[str]] = []

    async def one() -> None:
        agents, _ = await view.candidates(CAP)
        got.append([a.agent_id for a in agents])

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(one)
    assert got == [["a1"]] * 20
    assert reloads == 1


async def test_a_deregistered_agent_loses_its_breaker(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    _, inst, _ = await register(reg, "a1", [CAP])
    await register(reg, "a2", [CAP])
    breakers = Breakers(min_requests=1)
    view = RegistryView(reg, on_gone=breakers.forget)
    await view.refresh()
    for agent_id in ("a1", "a2"):
        breakers.record(agent_id, ok=False)
    assert breakers.is_open("a1") and breakers.is_open("a2")
    assert await reg.deregister("a1", instance_id=inst) == 1
    await view.refresh()
    assert not breakers.is_open("a1") and breakers.counts("a1") == (0, 0)
    assert breakers.is_open("a2")  # still registered: its breaker stays

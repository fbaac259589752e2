"""200 concurrent register/heartbeat/deregister calls from 4 OS processes keep the registry
consistent: every live agent is in exactly the capability sets it declares, no set names a
deleted or evicted agent, and the ``caps`` zset counts equal the set cardinalities.
"""

from __future__ import annotations

import multiprocessing as mp
import random
from collections import Counter
from typing import Any

import anyio
import pytest

import reach
from reach.connection import connect
from reach.registry import Registry
from tests.support.registry_helpers import assert_consistent, new_instance, new_version

PROCESSES = 4
OPS_PER_PROCESS = 50  # 200 in all
TASKS_PER_PROCESS = 5  # concurrent calls in flight per process
AGENTS = [f"ag{i:02}" for i in range(12)]
CAPS = ["cap.a", "cap.b", "cap.c", "cap.d", "cap.e", "cap.f"]
SHADOW_TTL_MS = 60_000


async def _work(url: str, ns: str, seed: int, barrier: Any) -> Counter[str]:
    rnd = random.Random(seed)
    counts: Counter[str] = Counter()
    mine: dict[str, tuple[str, int]] = {}  # agent_id -> (instance, version) registered here
    clients = [await connect(url) for _ in range(TASKS_PER_PROCESS)]
    # every process starts its calls at the same moment
    await anyio.to_thread.run_sync(barrier.wait, 60)

    async def one(reg: Registry) -> None:
        op = rnd.choices(["register", "heartbeat", "deregister", "sweep"], [5, 4, 2, 1])[0]
        agent = rnd.choice(AGENTS)
        if op == "register":
            caps = rnd.sample(CAPS, rnd.randint(1, 4))
            # some registrations get a tiny lease so the concurrent sweeps evict them
            short = rnd.random() < 0.25
            inst, version = new_instance(), new_version()
            try:
                code = await reg.register(
                    agent,
                    instance_id=inst,
                    version=version,
                    capabilities=caps,
                    lease_ms=5 if short else 60_000,
                    evict_after_ms=10 if short else 120_000,
                    metadata={"seed": seed},
                )
            except reach.StaleRegistration:
                counts["register:stale"] += 1
            else:
                mine[agent] = (inst, version)
                counts[f"register:{code}"] += 1
        elif op == "heartbeat":
            inst, version = mine.get(agent, (new_instance(), new_version()))
            code, _ = await reg.heartbeat(agent, instance_id=inst, version=version)
            counts[f"heartbeat:{code}"] += 1
        elif op == "deregister":
            inst = mine[agent][0] if agent in mine and rnd.random() < 0.5 else ""
            code = await reg.deregister(agent, instance_id=inst)
            counts[f"deregister:{code}"] += 1
        else:
            res = await reg.sweep(owner=f"p{seed}", lock_ms=0, shadow_ttl_ms=SHADOW_TTL_MS)
            counts["sweep"] += 1
            counts["evicted"] += len(res.evicted)

    async def task(i: int, n: int) -> None:
        reg = Registry(clients[i], ns)
        for _ in range(n):
            await one(reg)
            if rnd.random() < 0.3:
                await anyio.sleep(rnd.random() * 0.02)

    per_task = [OPS_PER_PROCESS // TASKS_PER_PROCESS] * TASKS_PER_PROCESS
    per_task[0] += OPS_PER_PROCESS - sum(per_task)
    try:
        async with anyio.create_task_group() as tg:
            for i, n in enumerate(per_task):
                tg.start_soon(task, i, n)
    finally:
        for c in clients:
            await c.aclose()
    counts["ops"] = sum(v for k, v in counts.items() if ":" in k or k == "sweep")
    return counts


def _process(url: str, ns: str, seed: int, barrier: Any, results: Any) -> None:
    try:
        results.put((seed, dict(anyio.run(_work, url, ns, seed, barrier))))
    except BaseException as e:  # report, never hang the parent
        results.put((seed, {"error": repr(e)}))
        raise


def test_concurrent_calls_from_processes_leave_registry_consistent(redis_url: str, ns: str) -> None:
    ctx = mp.get_context("spawn")  # no inherited event loop or sockets
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_process, args=(redis_url, ns, seed, barrier, results), daemon=True)
        for seed in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=90) for _ in procs]
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    errors = [c["error"] for _, c in got if "error" in c]
    assert not errors, errors
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    total: Counter[str] = Counter()
    for _, c in got:
        total.update(c)
    assert total["ops"] == PROCESSES * OPS_PER_PROCESS
    # the calls really interleaved: every kind of outcome showed up
    assert total["register:1"] + total["register:2"] > 0
    assert total["heartbeat:1"] + total["heartbeat:2"] + total["heartbeat:0"] > 0
    assert total["deregister:1"] > 0

    async def check() -> None:
        client = await connect(redis_url)
        try:
            reg = Registry(client, ns)
            snap = await assert_consistent(reg)
            assert snap["hashes"], "no agent left to check"
            # let the short leases run out, sweep them all, and check again
            await anyio.sleep(0.1)
            await reg.sweep(shadow_ttl_ms=SHADOW_TTL_MS)
            snap = await assert_consistent(reg)
            for agent_id, h in snap["hashes"].items():
                if h["lease_ms"] == "5":
                    assert h["state"] == "evicted", (agent_id, h)
            # what the registry API reports agrees with the raw keys
            for cap, n in await reg.capabilities():
                assert len(await reg.agents(cap)) == n
        finally:
            await client.aclose()

    anyio.run(check)


@pytest.mark.anyio
async def test_concurrent_reregistration_of_one_agent_in_one_process(
    redis_url: str, ns: str
) -> None:
    """Many tasks fighting over one agent_id: the newest version wins, sets stay exact."""
    client = await connect(redis_url)
    try:
        reg = Registry(client, ns)
        rnd = random.Random(7)
        versions = sorted(new_version() for _ in range(60))
        order = versions[:]
        rnd.shuffle(order)
        outcomes: list[int | str] = []

        async def reg_one(v: int) -> None:
            caps = rnd.sample(CAPS, rnd.randint(1, 3))
            try:
                outcomes.append(
                    await reg.register(
                        "contested",
                        instance_id=f"i{v}",
                        version=v,
                        capabilities=caps,
                        lease_ms=60_000,
                        evict_after_ms=120_000,
                    )
                )
            except reach.StaleRegistration:
                outcomes.append("stale")

        async with anyio.create_task_group() as tg:
            for v in order:
                tg.start_soon(reg_one, v)
        a = await reg.get("contested")
        assert a is not None and a.version == versions[-1]
        assert "stale" in outcomes or order == versions
        await assert_consistent(reg)
    finally:
        await client.aclose()

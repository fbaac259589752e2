"""The client's registry view: one reload for many callers on a stale view, per-agent
state dropped when an agent's record leaves the registry, and records and events written
behind the scripts' back (skipped and reported, never a crash)."""

from __future__ import annotations

import logging

import anyio
import pytest

from reach.breaker import Breakers
from reach.client import Client
from reach.connection import AnyRedis
from reach.registry import Registry, records
from reach.registry.records import _Reporter
from reach.view import RegistryView
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until

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
    assert len((await view.candidates(CAP))[0]) == 2  # the view holds what it was asked for
    for agent_id in ("a1", "a2"):
        breakers.record(agent_id, ok=False)
    assert breakers.is_open("a1") and breakers.is_open("a2")
    assert await reg.deregister("a1", instance_id=inst) == 1
    await view.refresh()
    assert not breakers.is_open("a1") and breakers.counts("a1") == (0, 0)
    assert breakers.is_open("a2")  # still registered: its breaker stays


# -- records and events written behind the scripts' back (issue 9, items 10 and 11) --------

HOSTILE_FIELDS: list[dict[str | bytes, str | bytes]] = [
    {"weight": "abc"},
    {"weight": "nan"},
    {"weight": "inf"},
    {"weight": "-1"},
    {"weight": "1e9"},
    {"metadata": "not json"},
    {"metadata": "[1, 2]"},
    {"metadata": "[" * 100_000},
    {"metadata": b'{"a": "\xff"}'},
    {"card": "{"},
    {"card": "[]"},
    {"last_heartbeat_ms": "abc"},
    {"last_heartbeat_ms": "1.5"},
    {"last_heartbeat_ms": "-1"},
    {"version": "1e309"},
    {"queue_depth": "nan"},
    {"inflight": ""},
    {"max_queue": "x"},
    {"ready_ms": "9" * 40},
    {"ready": "yes"},
    {"draining": "2"},
    {"state": "zombie"},
    {"caps": "Bad Name"},
    {"agent_id": "someone-else"},
    {"agent_id": b"\xff"},
    {"instance_id": b"\xc3\x28"},
]


def _hostile_id(i: int) -> str:
    return f"bad{i}"


async def _write_hostile(
    r: AnyRedis, reg: Registry, i: int, fields: dict[str | bytes, str | bytes]
) -> str:
    """A properly registered agent whose record then gets one bad field."""
    agent_id = _hostile_id(i)
    await register(reg, agent_id, [CAP], ready=True)
    await r.hset(reg.keys.agent(agent_id), mapping=fields)  # type: ignore[arg-type]
    return agent_id


async def test_bad_records_are_skipped_and_reported_once(
    r: AnyRedis, ns: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One bad field used to make every reload raise (every worker of the namespace died,
    a new Client failed on its first request): now the agent is skipped, logged once."""
    monkeypatch.setattr(records, "_reporter", _Reporter())  # a budget of its own
    reg = Registry(r, ns)
    await register(reg, "good", [CAP], ready=True)
    bad = [await _write_hostile(r, reg, i, f) for i, f in enumerate(HOSTILE_FIELDS)]
    # a non-UTF-8 id in the agents zset, a capability set and the caps zset; a bad score
    await r.zadd(reg.keys.agents, {b"\xff\xfe": 1e18})
    await r.sadd(reg.keys.cap(CAP), b"\xff\xfe")
    await r.zadd(reg.keys.caps, {b"\xc1": 1, "inf.cap": float("inf")})
    caplog.set_level(logging.WARNING, logger="reach.registry")

    def reported() -> list[str]:
        return [m for m in caplog.messages if "cannot be read" in m or "not UTF-8" in m]

    view = RegistryView(reg, refresh_s=60.0)
    await view.refresh()
    assert [a.agent_id for a in (await view.candidates(CAP))[0]] == ["good"]
    first = reported()
    # one line per bad record or id, and at most 20 a minute (there are 29 problems here)
    assert len(first) == 20 and len(set(first)) == 20, first
    assert any("weight: 'abc' is not a finite number" in m for m in first)
    for _ in range(3):  # reloads report nothing again
        await view.refresh()
        agents, _ = await view.candidates(CAP)
        assert [a.agent_id for a in agents] == ["good"]
    assert [a.agent_id for a in await reg.agents(CAP)] == ["good"]
    assert [a.agent_id for a in await reg.agents()] == ["good"]
    assert await reg.agent_ids(CAP) == sorted(["good", *bad])
    assert await reg.capabilities() == [(CAP, len(bad) + 1)]
    for agent_id in bad:
        assert await reg.get(agent_id) is None
        await view.recheck(agent_id)
    assert (await reg.get("good")) is not None
    assert reported() == first

    async with Client(redis=r, namespace=ns) as c:
        assert [a.agent_id for a in await c.eligible(CAP)] == ["good"]


def test_reporter_logs_each_problem_once_and_caps_the_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rep = _Reporter(keep=3, per_minute=2)
    caplog.set_level(logging.WARNING, logger="reach.registry")
    for key in ("a", "a", "b", "a", "c", "d"):
        rep.report(key, "problem %s", key)
    assert caplog.messages == ["problem a", "problem b"]


async def test_a_bad_record_is_routable_again_once_re_registered(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    _, inst, version = await register(reg, "a1", [CAP], ready=True)
    await r.hset(reg.keys.agent("a1"), "weight", "abc")
    view = RegistryView(reg)
    await view.refresh()
    assert (await view.candidates(CAP))[0] == []
    await register(reg, "a1", [CAP], ready=True, instance_id=inst, version=version)
    await view.refresh()
    assert [a.agent_id for a in (await view.candidates(CAP))[0]] == ["a1"]


HOSTILE_EVENTS: list[dict[str | bytes, str | bytes]] = [
    {"type": "registered", "agent_id": b"\xff\xfe", "ts": "1"},
    {"type": b"\xff", "agent_id": "x", "instance_id": b"\x80", "ts": "abc"},
    {"agent_id": "nobody", "ts": "1e309"},
    {"junk": b"\xc1"},
    {b"\xff": b"\xff"},
    {"type": "registered", "agent_id": "", "ts": "-5"},
    {"agent_id": "bad0", "ts": "9" * 30},
]


async def test_event_tail_survives_bad_events(r: AnyRedis, ns: str) -> None:
    """Non-UTF-8 bytes in the events stream used to raise UnicodeDecodeError in the view's
    tail and kill every worker; now the bad entries are passed over and the tail goes on."""
    reg = Registry(r, ns)
    await register(reg, "good", [CAP], ready=True)
    view = RegistryView(reg, refresh_s=60.0, max_staleness_s=60.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(view.run)

        async def loaded() -> bool:
            return [a.agent_id for a in (await view.candidates(CAP))[0]] == ["good"]

        await wait_until(loaded, what="initial load")
        for fields in HOSTILE_EVENTS:
            await r.xadd(reg.keys.events, fields)  # type: ignore[arg-type]
        await register(reg, "late", [CAP], ready=True)  # seen through the tail only

        async def late_seen() -> bool:
            return [a.agent_id for a in (await view.candidates(CAP))[0]] == ["good", "late"]

        await wait_until(late_seen, what="the tail to go past the bad events")
        tg.cancel_scope.cancel()


async def test_reading_bad_events_never_fails(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    for fields in HOSTILE_EVENTS:
        await r.xadd(reg.keys.events, fields)  # type: ignore[arg-type]
    events = await reg.events()
    assert len(events) == len(HOSTILE_EVENTS)
    assert events[0].agent_id == "\ufffd\ufffd"
    assert events[1].ts == 0 and events[1].type == "\ufffd"
    assert [e.ts for e in events[2:]] == [0, 0, 0, 0, 0]
    assert len(await reg.recent_events(100)) == len(HOSTILE_EVENTS)
    assert len(await reg.tail_events(last_id="0", block_ms=10)) == len(HOSTILE_EVENTS)

"""Fuzz the registry: its scripts' arguments, and records and events written behind them.

(a) Each registry script (register, heartbeat, deregister, drain, mark_ready, sweep) is
called through ``reach.scripts.call`` with a valid call, as :class:`reach.Registry` makes
it, mutated a few times (an argument replaced by a hostile value, removed, inserted; the
list cut short; a key dropped, added or replaced by a key of another type), or with
arguments drawn at random. Prefix KEYS and the role of each key are the caller's contract
and are not fuzzed (at most one KEYS edit per call). Whatever the call:

* the script succeeds with a well-formed answer, or refuses with its documented error
  (``ERR reach: bad ...``) and changed nothing (every key of the namespace, DUMPed before
  and after); an unmutated call is never refused;
* the registry is consistent: every agent hash has its agents-zset entry and the other
  way round, capability sets hold exactly the live agents that declare them and the caps
  zset counts them, and every record reads back (:meth:`AgentInfo.from_hash`, strict);
* the agents registered properly before the call stay live and routable (a fresh
  :class:`RegistryView` and a :class:`Client`'s ``eligible()`` return them).

(b) Hostile agent records (fields HSET to anything, non-UTF-8 bytes included; ids that are
not UTF-8 in the agents zset, a capability set and the caps zset) and hostile events
(any fields, any bytes) are written straight into Redis while a view tails the events:
the view's reload and tail, a Client's ``eligible()``, every read of :class:`Registry`
and a sweep keep working and still route to the good agents; registering over a hostile
record either works or is refused with a documented error.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import redis.exceptions as rexc
from hypothesis import event, given
from hypothesis import strategies as st

import reach
from reach import scripts
from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.registry import AgentInfo, Registry
from reach.view import RegistryView
from tests.fuzz.registry_strategies import FUZZ_ARG, hostile_events, hostile_records
from tests.lua.snapshot import assert_unchanged, snapshot
from tests.support.registry_helpers import assert_consistent, new_instance, new_version
from tests.support.waiting import wait_until

CAP_A, CAP_B = "fz.a", "fz.b"
GOOD = {"g1": [CAP_A], "g2": [CAP_A, CAP_B]}
LONG_MS = 600_000
MAXLEN = 1000


@dataclass
class World:
    """One example's namespace: good agents (protected), a target agent ``t1`` registered
    with a 1 ms lease (the calls act on it), and keys of the wrong type."""

    ns: str
    reg: Registry
    t1_instance: str
    t1_version: int
    wrong: list[str] = field(default_factory=list)

    @property
    def k(self) -> Any:
        return self.reg.keys


async def build_world(r: AnyRedis, shards: int = 1) -> World:
    ns = f"fr{uuid.uuid4().hex[:10]}"
    reg = Registry(r, ns, events_maxlen=MAXLEN, shards=shards)
    for agent_id, caps in GOOD.items():
        inst = new_instance()
        await reg.register(
            agent_id,
            instance_id=inst,
            version=new_version(),
            capabilities=caps,
            lease_ms=LONG_MS,
            evict_after_ms=LONG_MS,
            metadata={"good": 1},
        )
        await reg.mark_ready(agent_id, instance_id=inst)
    inst, version = new_instance(), new_version()
    await reg.register(
        "t1",
        instance_id=inst,
        version=version,
        capabilities=[CAP_A, "fz.c"],
        lease_ms=1,
        evict_after_ms=LONG_MS,
        ready=True,
    )
    k = reg.keys
    # outside the agent and capability prefixes: readers scan those for hashes and sets
    wrong = [k.idem("wrong-string"), k.idem("wrong-list")]
    await r.set(wrong[0], "x")
    await r.rpush(wrong[1], "x")
    return World(ns, reg, inst, version, wrong)


async def drop_world(r: AnyRedis, w: World) -> None:
    keys = [key async for key in r.scan_iter(match=f"*{w.ns}*", count=1000)]
    if keys:
        await r.delete(*keys)


@pytest.fixture(scope="module")
def runner(redis_server: RedisServer) -> Iterator[tuple[asyncio.Runner, AnyRedis]]:
    """One event loop and one client for every example of the module."""
    with asyncio.Runner() as run:
        client = run.run(connect(redis_server.url))
        yield run, client
        run.run(client.aclose())


# -- valid calls, as Registry makes them ----------------------------------------------------


def _target(data: st.DataObject) -> str:
    return data.draw(st.sampled_from(["t1", "t1", "t2"]), label="target")


def register_call(data: st.DataObject, w: World) -> tuple[list[Any], list[Any]]:
    agent_id = _target(data)
    same = agent_id == "t1" and data.draw(st.booleans(), label="same process")
    c = w.reg.register_call(
        agent_id,
        instance_id=w.t1_instance if same else new_instance(),
        version=w.t1_version if same else data.draw(st.sampled_from([new_version(), 1])),
        capabilities=data.draw(
            st.lists(st.sampled_from([CAP_A, CAP_B, "fz.c", "x.y_z"]), min_size=1, max_size=3)
        ),
        weight=data.draw(st.sampled_from([0.001, 1, 2.5, 1000])),
        metadata=data.draw(st.sampled_from([{}, {"region": "eu"}, {"n": [1, {"x": None}]}])),
        lease_ms=data.draw(st.sampled_from([1, 1000, LONG_MS])),
        evict_after_ms=data.draw(st.sampled_from([1, LONG_MS])),
        card=data.draw(st.sampled_from([None, {"name": "T"}])),
        ready=data.draw(st.booleans()),
        max_queue=data.draw(st.sampled_from([0, 10])),
    )
    return list(c.keys), list(c.args)


def heartbeat_call(data: st.DataObject, w: World) -> tuple[list[Any], list[Any]]:
    c = w.reg.heartbeat_call(
        _target(data),
        instance_id=data.draw(st.sampled_from([w.t1_instance, "other"])),
        version=data.draw(st.sampled_from([w.t1_version, w.t1_version + 1, 1])),
        queue_depth=data.draw(st.sampled_from([0, 5, 2**53 - 1])),
        inflight=data.draw(st.sampled_from([0, 3])),
    )
    return list(c.keys), list(c.args)


def deregister_call(data: st.DataObject, w: World) -> tuple[list[Any], list[Any]]:
    t, k = _target(data), w.k
    inst = data.draw(st.sampled_from([w.t1_instance, "", "other"]))
    keys = [k.agents, k.agent(t), k.caps, k.events, k.cap_prefix, k.agent_prefix]
    return [*keys, k.reroute, k.left_of(0)], [t, inst, MAXLEN]


def drain_call(data: st.DataObject, w: World) -> tuple[list[Any], list[Any]]:
    t, k = _target(data), w.k
    extra = data.draw(st.sampled_from([[], [""], [w.t1_instance], ["other"]]))
    return [k.agent(t), k.events], [t, MAXLEN, *extra]


def mark_ready_call(data: st.DataObject, w: World) -> tuple[list[Any], list[Any]]:
    t, k = _target(data), w.k
    inst = data.draw(st.sampled_from([w.t1_instance, "other"]))
    return [k.agent(t), k.events], [t, inst, data.draw(st.sampled_from(["0", "1"])), MAXLEN]


def sweep_call(data: st.DataObject, w: World) -> tuple[list[Any], list[Any]]:
    k = w.k
    keys = [k.agents, k.caps, k.events, k.sweeper_lock, k.cap_prefix, k.agent_prefix, k.reroute]
    args = [
        data.draw(st.sampled_from(["fz", "other"])),
        data.draw(st.sampled_from([0, 1000])),
        data.draw(st.sampled_from([1, 60_000])),
        data.draw(st.sampled_from([1, 100])),
        MAXLEN,
    ]
    return keys, args


VALID = {
    "register": register_call,
    "heartbeat": heartbeat_call,
    "deregister": deregister_call,
    "drain": drain_call,
    "mark_ready": mark_ready_call,
    "sweep": sweep_call,
}
# KEYS positions that name a key (the others are prefixes): the ones a type swap may hit.
REAL_KEYS = {
    "register": [0, 1, 2, 3],
    "heartbeat": [0, 1, 2],
    "deregister": [0, 1, 2, 3, 6, 7],
    "drain": [0, 1],
    "mark_ready": [0, 1],
    "sweep": [0, 1, 2, 3, 6],
}


def mutate(
    data: st.DataObject, name: str, w: World, keys: list[Any], args: list[Any]
) -> tuple[list[Any], list[Any], int]:
    """Apply 0..3 random edits to a call; returns the call and the number of edits.

    At most one edit touches KEYS: a key dropped or added changes their number (refused),
    a swap puts a key of the wrong type at a real key's place. Two edits could restore the
    number with a prefix replaced, which no script can tell from a real prefix: that is
    the caller's contract, not fuzzed.
    """
    keys, args = list(keys), list(args)
    keys_edited = False
    n = data.draw(st.integers(0, 3), label="edits")
    for _ in range(n):
        op = data.draw(
            st.sampled_from(
                ["replace", "replace", "replace", "replace", "delete", "insert", "truncate", "keys"]
            )
        )
        if op in ("replace", "delete") and args:
            i = data.draw(st.integers(0, len(args) - 1))
            if op == "delete":
                del args[i]
            else:
                args[i] = data.draw(FUZZ_ARG)
        elif op == "insert":
            args.insert(data.draw(st.integers(0, len(args))), data.draw(FUZZ_ARG))
        elif op == "truncate":
            args = args[: data.draw(st.integers(0, len(args)))]
        elif not keys_edited:
            keys_edited = True
            how = data.draw(st.sampled_from(["drop", "add", "wrong"]))
            if how == "drop" and keys:
                del keys[data.draw(st.integers(0, len(keys) - 1))]
            elif how == "add":
                keys.insert(
                    data.draw(st.integers(0, len(keys))), data.draw(st.sampled_from(w.wrong))
                )
            elif how == "wrong":
                keys[data.draw(st.sampled_from(REAL_KEYS[name]))] = data.draw(
                    st.sampled_from(w.wrong)
                )
    return keys, args, n


# -- checks ------------------------------------------------------------------------------


def check_answer(name: str, res: Any) -> None:
    if name == "register":
        # REPLACED of another instance also names it: instance, host, pid, live
        assert isinstance(res, list) and res[0] in (1, 2, -1), res
        assert len(res) == 2 or (res[0] == 2 and len(res) == 6), res
    elif name == "heartbeat":
        assert isinstance(res, list) and res[0] in (-1, 0, 1, 2) and res[1] in (0, 1), res
    elif name in ("deregister", "mark_ready"):
        assert res in (-1, 0, 1), res
    elif name == "drain":
        assert res in (-1, 0, 1, 2), res
    else:
        assert isinstance(res, list) and (res == [-1] or len(res) >= 4), res


async def assert_records_readable(w: World) -> None:
    """Every record a script wrote reads back strictly: no script stores a value a reader
    would have to skip."""
    r, k = w.reg.redis, w.k
    async for key in r.scan_iter(match=f"{k.agent_prefix}*", count=1000):
        if await r.type(key) != b"hash":
            continue  # the wrong-type keys of the world
        agent_id = key.decode()[len(k.agent_prefix) :]
        AgentInfo.from_hash(await r.hgetall(key), agent_id=agent_id)


async def assert_good_routable(
    w: World, r: AnyRedis, *, also: frozenset[str] = frozenset()
) -> None:
    """The good agents are live and routable for a fresh view and a Client."""
    for agent_id in GOOD:
        a = await w.reg.get(agent_id)
        assert a is not None and a.routable, (agent_id, a)
    view = RegistryView(w.reg)
    await view.refresh()
    ids = {a.agent_id for a in (await view.candidates(CAP_A))[0] if a.routable}
    assert set(GOOD) | also <= ids, ids
    if w.reg.shards != 1:
        return  # a Client derives its shards from the Redis (one on a standalone server)
    async with Client(redis=r, namespace=w.ns) as c:
        eligible = {a.agent_id for a in await c.eligible(CAP_A)}
    assert set(GOOD) | also <= eligible, eligible


async def run_call(
    r: AnyRedis, name: str, w: World, keys: list[Any], args: list[Any], *, must_succeed: bool
) -> None:
    before = await snapshot(r, w.ns)
    try:
        res = await scripts.call(r, name, keys, args)
    except rexc.ResponseError as e:
        msg = str(e)
        where = f"\nKEYS={keys!r}\nARGV={[a if len(str(a)) < 80 else str(a)[:80] for a in args]!r}"
        assert msg.startswith("reach: bad "), f"{name}.lua: undocumented error {msg!r}{where}"
        assert not must_succeed, f"{name}.lua refused a valid call: {msg}{where}"
        assert_unchanged(before, await snapshot(r, w.ns))
        event(f"{name}: refused ({msg.removeprefix('reach: bad ').split(':')[0].split()[0]})")
    else:
        check_answer(name, res)
        event(f"{name}: answered {res[0] if isinstance(res, list) else res}")
    await assert_consistent(w.reg, allow_expired_shadows=True)
    await assert_records_readable(w)
    await assert_good_routable(w, r)


def _script_example(
    runner: tuple[asyncio.Runner, AnyRedis], name: str, data: st.DataObject, *, random: bool
) -> None:
    run, r = runner

    async def go() -> None:
        w = await build_world(r)
        try:
            if random:
                valid = VALID[name](data, w)[0]
                pool = [valid[i] for i in REAL_KEYS[name]] + w.wrong
                keys = data.draw(st.lists(st.sampled_from(pool), max_size=8), label="keys")
                if len(keys) == len(valid):  # prefixes are the caller's contract: kept
                    keys = [k if i in REAL_KEYS[name] else valid[i] for i, k in enumerate(keys)]
                args = data.draw(st.lists(FUZZ_ARG, max_size=14), label="args")
                await run_call(r, name, w, keys, args, must_succeed=False)
            else:
                keys, args = VALID[name](data, w)
                keys, args, edits = mutate(data, name, w, keys, args)
                await run_call(r, name, w, keys, args, must_succeed=edits == 0)
        finally:
            await drop_world(r, w)

    run.run(go())


SCRIPTS = sorted(VALID)


@pytest.mark.parametrize("name", SCRIPTS)
@given(data=st.data())
def test_mutated_calls_keep_the_registry_consistent(
    runner: tuple[asyncio.Runner, AnyRedis], name: str, data: st.DataObject
) -> None:
    _script_example(runner, name, data, random=False)


@pytest.mark.parametrize("name", SCRIPTS)
@given(data=st.data())
def test_random_arguments_keep_the_registry_consistent(
    runner: tuple[asyncio.Runner, AnyRedis], name: str, data: st.DataObject
) -> None:
    _script_example(runner, name, data, random=True)


# -- (b) hostile records and events ---------------------------------------------------------


@st.composite
def hostile_worlds(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "records": draw(st.lists(hostile_records(), min_size=1, max_size=4)),
        "raw": draw(st.lists(hostile_records(), max_size=2)),  # hashes no script wrote
        "bad_ids": draw(st.lists(st.sampled_from([b"\xff", b"\xfe\xff", b"a\xc0"]), max_size=2)),
        "events": draw(st.lists(hostile_events(), min_size=1, max_size=8)),
    }


@pytest.mark.parametrize("shards", [1, 4])
@given(hostile=hostile_worlds())
def test_hostile_records_and_events_never_stop_readers(
    runner: tuple[asyncio.Runner, AnyRedis], shards: int, hostile: dict[str, Any]
) -> None:
    """With one registry shard, and with several (hostile keys in shard 0 and the others,
    the view polling every shard's events)."""
    run, r = runner

    async def go() -> None:
        w = await build_world(r, shards)
        reg, k = w.reg, w.k
        hostile_ids: list[tuple[str, str, int]] = []
        try:
            view = RegistryView(reg, refresh_s=60.0, max_staleness_s=60.0, poll_s=0.01)
            async with anyio.create_task_group() as tg:
                tg.start_soon(view.run)

                async def loaded() -> bool:
                    ids = {a.agent_id for a in (await view.candidates(CAP_A))[0]}
                    return set(GOOD) <= ids

                await wait_until(loaded, what="the view's first load")
                for i, fields in enumerate(hostile["records"]):
                    agent_id, inst, version = f"h{i}", new_instance(), new_version()
                    await reg.register(
                        agent_id,
                        instance_id=inst,
                        version=version,
                        capabilities=[CAP_A],
                        lease_ms=LONG_MS,
                        evict_after_ms=LONG_MS,
                        ready=True,
                    )
                    await r.hset(k.agent(agent_id), mapping=fields)
                    hostile_ids.append((agent_id, inst, version))
                for i, fields in enumerate(hostile["raw"]):
                    await r.hset(k.agent(f"raw{i}"), mapping=fields)
                    await r.zadd(k.agents, {f"raw{i}": 1})
                    await r.sadd(k.cap(CAP_A), f"raw{i}")
                for bad in hostile["bad_ids"]:
                    await r.zadd(k.agents, {bad: 1})
                    await r.sadd(k.cap(CAP_A), bad)
                    await r.zadd(k.caps, {bad: float("inf")})
                for i, fields in enumerate(hostile["events"]):
                    await r.xadd(k.events_of(i % shards), fields)
                # a registration the view can only learn of through the tail, past the bad events
                inst = new_instance()
                await reg.register(
                    "late",
                    instance_id=inst,
                    version=new_version(),
                    capabilities=[CAP_A],
                    lease_ms=LONG_MS,
                    evict_after_ms=LONG_MS,
                )
                await reg.mark_ready("late", instance_id=inst)

                async def late_seen() -> bool:
                    return any(
                        a.agent_id == "late" and a.ready for a in (await view.candidates(CAP_A))[0]
                    )

                await wait_until(late_seen, what="the event tail past the hostile events")
                await view.refresh()
                ids = {a.agent_id for a in (await view.candidates(CAP_A))[0] if a.routable}
                assert set(GOOD) | {"late"} <= ids, ids
                tg.cancel_scope.cancel()

            # every read of the registry works and still finds the good agents
            assert set(GOOD) <= {a.agent_id for a in await reg.agents(CAP_A)}
            assert set(GOOD) <= {a.agent_id for a in await reg.agents()}
            await reg.agent_ids()
            await reg.agent_ids(CAP_A)
            await reg.capabilities()
            await reg.events(count=1000)
            await reg.recent_events(1000)
            for agent_id, _, _ in hostile_ids:
                await reg.get(agent_id)
            await assert_good_routable(w, r, also=frozenset({"late"}))
            # a sweep goes through the hostile records without failing
            await reg.sweep(owner="fz", lock_ms=0, shadow_ttl_ms=60_000)
            # the scripts on a hostile record: work, or a documented answer
            for agent_id, inst, version in hostile_ids:
                try:
                    await reg.heartbeat(agent_id, instance_id=inst, version=version)
                    await reg.register(
                        agent_id,
                        instance_id=inst,
                        version=version,
                        capabilities=[CAP_A],
                        lease_ms=LONG_MS,
                        evict_after_ms=LONG_MS,
                        ready=True,
                    )
                except reach.StaleRegistration:
                    continue  # a hostile version above this one fences it, as it should
                except reach.ConfigError as e:
                    assert "holds a" in str(e), e  # a key of another type
                    continue
                a = await reg.get(agent_id)
                assert a is not None and a.routable, (agent_id, a)
            await assert_good_routable(w, r, also=frozenset({"late"}))
        finally:
            await drop_world(r, w)

    run.run(go())

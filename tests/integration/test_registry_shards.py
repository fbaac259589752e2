"""The registry spread over shards (issue 12, deliverable 2): a namespace's registry is
partitioned by agent id into shards, each its own hash slot; heartbeats, sweeps and
lookups work per shard, and whole-namespace reads (agents, capabilities, events, counts)
read every shard. On a standalone Redis the shard count is set by hand (the default there
is one: today's keys); on the 3-master test cluster the default (16) spreads the shards
over every master."""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import AsyncIterator

import anyio
import pytest
from redis.crc import key_slot

from reach._worker.liveness import run_sync
from reach._worker.sweeping import shards_to_try
from reach.connection import AnyRedis, connect, connect_sync, is_cluster
from reach.errors import ConfigError
from reach.keys import CLUSTER_SHARDS, SLOTS, Keys, shard_of, shard_tags, slot_of_tag
from reach.registry import Registry, default_shards
from reach.scripts.agents import Beat
from reach.view import RegistryView
from tests.support.cluster import RedisTestCluster
from tests.support.registry_helpers import assert_consistent, new_version, register
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

SHARDS = 4
CAP = "text.summarize"


def ids_in_every_shard(shards: int, per_shard: int = 2) -> list[str]:
    """Agent ids, ``per_shard`` of them in each of ``shards`` shards."""
    found: dict[int, list[str]] = {}
    i = 0
    while any(len(found.get(k, [])) < per_shard for k in range(shards)):
        aid = f"agent-{i}"
        bucket = found.setdefault(shard_of(aid, shards), [])
        if len(bucket) < per_shard:
            bucket.append(aid)
        i += 1
    return sorted(a for b in found.values() for a in b)


# -- the key scheme ------------------------------------------------------------------------
def test_shard_of_is_crc32_of_the_cleaned_id() -> None:
    for aid in ("a", "agent-7", "ünïcode", "x" * 256):
        want = zlib.crc32(aid.encode()) % 16
        assert shard_of(aid, 16) == want
        assert shard_of("{" + aid + "}", 16) == want  # braces never reach a key
    assert shard_of("anything", 1) == 0


def test_shard_zero_keeps_the_one_slot_keys_and_the_others_have_their_own() -> None:
    one, many = Keys("prod"), Keys("prod", 16)
    assert one.agent("a") == "reach:{prod}:agent:a"
    assert one.agents == many.agents_of(0) == "reach:{prod}:agents"
    tags = shard_tags("prod", 16)
    assert tags[0] == "prod" and all(re.fullmatch(r"prod:r[0-9]+", t) for t in tags[1:])
    assert many.events_of(3) == f"reach:{{{tags[3]}}}:events"
    aid = next(f"x{i}" for i in range(100) if shard_of(f"x{i}", 16) == 5)
    assert many.agent(aid) == f"reach:{{{tags[5]}}}:agent:{aid}"
    # every key of one shard in one slot, shards in different slots
    for k in range(16):
        shard_keys = {
            many.agents_of(k),
            many.agent_prefix_of(k) + "a",
            many.cap_of(CAP, k),
            many.caps_of(k),
            many.events_of(k),
            many.sweeper_lock_of(k),
            many.reroute_of(k),
        }
        assert {key_slot(x.encode()) for x in shard_keys} == {slot_of_tag(tags[k])}
    assert len({key_slot(many.agents_of(k).encode()) for k in range(16)}) == 16
    # what is not the registry stays in the namespace's slot
    assert key_slot(many.delayed.encode()) == key_slot(many.agents_of(0).encode())
    with pytest.raises(ValueError, match="shard 16"):
        many.agents_of(16)


@pytest.mark.parametrize("shards", [2, 3, 16, 64])
def test_shards_fall_in_different_bands_of_the_slot_space(shards: int) -> None:
    """So masters holding contiguous slot ranges each get about shards / masters."""
    for i in range(50):
        tags = shard_tags(f"team-{i}", shards)
        bands = {slot_of_tag(t) * shards // SLOTS for t in tags}
        assert len(bands) == shards
        if shards == 16:
            per_master = Counter(min(slot_of_tag(t) // (SLOTS // 3), 2) for t in tags)
            assert sorted(per_master.values()) in ([5, 5, 6], [4, 6, 6])


@pytest.mark.parametrize("bad", [0, -1, 1025, True, 2.0])
def test_shard_count_out_of_range_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="registry shards"):
        Keys("prod", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("ns", ["prod:r3", "a:r0"])
def test_a_namespace_that_looks_like_a_shard_is_refused(ns: str) -> None:
    # shard k of namespace 'x' is tagged {x:r<k>}: no namespace may hold a ':'
    with pytest.raises(ConfigError, match="Invalid namespace"):
        Keys(ns)


async def test_standalone_defaults_to_one_shard(r: AnyRedis, ns: str) -> None:
    assert default_shards(r) == 1
    reg = Registry(r, ns)
    assert reg.shards == 1
    await register(reg, "a1", [CAP])
    assert await r.exists(f"reach:{{{ns}}}:agent:a1") == 1  # today's key


# -- a sharded registry on one server ----------------------------------------------------------
async def test_lookups_read_every_shard(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns, shards=SHARDS)
    agents = ids_in_every_shard(SHARDS)
    for i, aid in enumerate(agents):
        caps = [CAP, "code.review"] if i % 2 else [CAP]
        await register(reg, aid, caps, metadata={"n": i})
    odd = sorted(a for i, a in enumerate(agents) if i % 2)
    assert await reg.agent_ids(CAP) == agents
    assert await reg.agent_ids("code.review") == odd
    assert await reg.agent_ids() == agents
    assert await reg.capabilities() == [("code.review", len(odd)), (CAP, len(agents))]
    assert [a.agent_id for a in await reg.agents(CAP, where={"n": 3})] == [agents[3]]
    for aid in agents:
        assert await r.exists(reg.keys.agent(aid)) == 1
        assert await r.zscore(reg.keys.agents_of(reg.shard_of(aid)), aid) is not None
    snap = await assert_consistent(reg)
    assert all(len(part["hashes"]) == 2 for part in snap["shards"])
    # the events of every shard, merged by (entry id, shard): ids carry their shard, as
    # entries of two shards written in the same millisecond can have the same id
    events = await reg.events(count=100)
    assert sorted((e.type, e.agent_id) for e in events) == [("registered", a) for a in agents]
    order = [(int(e.id.split("-")[0]), int(e.id.split("-")[1].split("@")[0])) for e in events]
    assert order == sorted(order)
    assert {int(e.id.split("@")[1]) for e in events} == set(range(SHARDS))
    assert await reg.recent_events(3) == events[-3:]
    for n in range(len(events)):  # resuming after any of them misses none and repeats none
        assert await reg.events(after=events[n].id, count=100) == events[n + 1 :]
    assert await reg.events(after=events[2].id, count=2) == events[3:5]


async def test_heartbeats_of_several_shards(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns, shards=SHARDS)
    agents = ids_in_every_shard(SHARDS)
    creds = {aid: (await register(reg, aid, [CAP]))[1:] for aid in agents}
    beats = [Beat(a, creds[a][0], creds[a][1], queue_depth=i) for i, a in enumerate(agents)]
    beats.append(Beat("ghost", "i", new_version()))
    answers = await reg.heartbeat_many(beats)
    assert [code for code, _ in answers] == [1] * len(agents) + [0]
    assert [a.queue_depth for a in await reg.agents(CAP)] == list(range(len(agents)))
    # one call is one slot: agents of two shards are refused before anything is sent
    two = [b for b in beats if reg.shard_of(b.agent_id) in (0, 1)]
    with pytest.raises(ConfigError, match="one registry shard"):
        reg.heartbeat_many_call(two)
    one = [b for b in beats if reg.shard_of(b.agent_id) == 2]
    assert [h.code for h in await reg.heartbeat_many_call(one).run(r)] == [1] * len(one)


async def test_sweeping_is_per_shard(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns, shards=SHARDS)
    agents = ids_in_every_shard(SHARDS)
    for aid in agents:
        await register(reg, aid, [CAP], lease_ms=1, evict_after_ms=1)
    # another runtime holds shard 2's lock: this one sweeps the others, and does the chores
    # (it holds shard 0's)
    await r.set(reg.keys.sweeper_lock_of(2), "other", px=60_000)
    await anyio.sleep(0.01)
    res = await reg.sweep(owner="me", lock_ms=60_000)
    in_2 = sorted(a for a in agents if reg.shard_of(a) == 2)
    assert sorted(res.evicted) == sorted(set(agents) - set(in_2))
    assert (res.swept, res.chores, res.locked) == (SHARDS - 1, True, False)
    for k in range(SHARDS):
        members = {m.decode() for m in await r.smembers(reg.keys.reroute_of(k))}
        assert members == ({a for a in res.evicted if reg.shard_of(a) == k})
    assert await reg.agent_ids(CAP) == in_2
    # the other runtime: only shard 2 is free for it, and it does no chores
    await r.delete(reg.keys.sweeper_lock_of(2))
    other = await reg.sweep(owner="other", lock_ms=60_000)
    assert sorted(other.evicted) == in_2
    assert (other.swept, other.chores, other.locked) == (1, False, False)
    assert (await reg.sweep(owner="third", lock_ms=60_000)).locked
    await assert_consistent(reg)
    counts, routable = await reg.count_states()
    assert counts == {"active": 0, "probation": 0, "evicted": len(agents)} and routable == 0


async def test_counts_sum_the_shards(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns, shards=SHARDS)
    agents = ids_in_every_shard(SHARDS, per_shard=3)
    for i, aid in enumerate(agents):
        await register(reg, aid, [CAP], ready=i % 3 == 0)
    counted = await reg.count_agents()
    assert (counted.total, counted.looked, counted.active) == (len(agents),) * 3
    assert counted.routable == len(agents[::3])
    assert await reg.count_states() == (
        {"active": len(agents), "probation": 0, "evicted": 0},
        len(agents[::3]),
    )
    # a sample smaller than the fleet: each shard read in part, scaled by its own ratio
    sampled = await reg.count_shards(sample=SHARDS)
    assert [(p.total, p.looked) for p in sampled] == [(3, 1)] * SHARDS
    states, _ = await reg.count_states(sample=SHARDS)
    assert states["active"] == len(agents)


async def test_the_view_follows_every_shard(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns, shards=SHARDS)
    agents = ids_in_every_shard(SHARDS, per_shard=1)
    creds = {aid: (await register(reg, aid, [CAP], ready=True))[1:] for aid in agents[:2]}
    view = RegistryView(reg, refresh_s=0.1, poll_s=0.02, max_staleness_s=60.0)
    async with anyio.create_task_group() as tg:
        view.attach(tg)
        found, _ = await view.candidates(CAP)
        assert sorted(a.agent_id for a in found) == agents[:2]
        for aid in agents[2:]:  # registrations in the other shards reach the view by events
            await register(reg, aid, [CAP], ready=True)

        async def has(want: list[str]) -> bool:
            return sorted(a.agent_id for a in (await view.candidates(CAP))[0]) == want

        await wait_until(lambda: has(agents), what="registrations in every shard")
        gone = agents[1]
        await reg.deregister(gone, instance_id=creds[gone][0])
        await wait_until(lambda: has([a for a in agents if a != gone]), what="a deregistration")
        # events lost in one shard (trimmed before the view read them): the check re-reads
        resyncs = view.resyncs
        last = agents[-1]
        k = reg.shard_of(last)
        async with view._lock:  # the tail reads nothing meanwhile
            await reg.drain(last)
            await r.execute_command("XTRIM", reg.keys.events_of(k), "MAXLEN", 0)
            await r.xadd(reg.keys.events_of(k), {"type": "noise", "agent_id": "nobody"})
            await r.execute_command("XTRIM", reg.keys.events_of(k), "MAXLEN", 0)

        async def resynced() -> bool:
            held = {a.agent_id: a for a in (await view.candidates(CAP))[0]}
            return view.resyncs > resyncs and held[last].draining

        await wait_until(resynced, what="a resync after lost events")
        tg.cancel_scope.cancel()


# -- the 3-master test cluster -----------------------------------------------------------------
@pytest.fixture
async def rc(redis_cluster: RedisTestCluster) -> AsyncIterator[AnyRedis]:
    client = await connect(redis_cluster.url)
    assert is_cluster(client)
    yield client
    await client.aclose()


@pytest.mark.cluster
async def test_on_a_cluster_the_shards_spread_over_every_master(rc: AnyRedis, ns: str) -> None:
    reg = Registry(rc, ns)
    assert reg.shards == default_shards(rc) == CLUSTER_SHARDS
    masters = {min(key_slot(reg.keys.agents_of(k).encode()) // (SLOTS // 3), 2) for k in range(16)}
    assert masters == {0, 1, 2}
    agents = ids_in_every_shard(CLUSTER_SHARDS, per_shard=1)
    creds = {aid: (await register(reg, aid, [CAP], lease_ms=60_000))[1:] for aid in agents}
    answers = await reg.heartbeat_many(Beat(a, *creds[a]) for a in agents)
    assert [code for code, _ in answers] == [1] * len(agents)
    assert await reg.agent_ids(CAP) == agents
    assert await reg.capabilities() == [(CAP, len(agents))]
    assert len(await reg.events(count=1000)) == len(agents)
    res = await reg.sweep(owner="me", lock_ms=10_000)
    assert (res.swept, res.chores) == (CLUSTER_SHARDS, True)
    await assert_consistent(reg)
    counts, _ = await reg.count_states()
    assert counts["active"] == len(agents)


@pytest.mark.cluster
async def test_the_heartbeat_thread_renews_every_shard_in_one_pipeline(
    rc: AnyRedis, redis_cluster: RedisTestCluster, ns: str
) -> None:
    """The heartbeat thread's round on a Cluster: one heartbeat_many call per shard, sent in
    one cluster pipeline; a script cache flushed on every master is loaded again."""
    reg = Registry(rc, ns)
    agents = ids_in_every_shard(CLUSTER_SHARDS, per_shard=2)
    creds = {aid: (await register(reg, aid, [CAP]))[1:] for aid in agents}
    sync_r = connect_sync(redis_cluster.url)
    try:
        sync_reg = Registry(sync_r, ns)
        groups: dict[int, list[Beat]] = {}
        for i, aid in enumerate(agents):
            groups.setdefault(sync_reg.shard_of(aid), []).append(Beat(aid, *creds[aid], i))
        calls = [sync_reg.heartbeat_many_call(g) for g in groups.values()]
        assert len(calls) == CLUSTER_SHARDS
        for _ in range(2):
            sync_r.script_flush()
            answers = await anyio.to_thread.run_sync(run_sync, sync_r, calls)
            assert [h.code for a in answers for h in a] == [1] * len(agents)
    finally:
        sync_r.close()
    depths = {a.agent_id: a.queue_depth for a in await reg.agents(CAP)}
    assert depths == {aid: i for i, aid in enumerate(agents)}


def test_a_sweeper_tries_its_shards_and_a_quarter_of_the_others_in_turn() -> None:
    assert shards_to_try(1, set(), 7) == [0]
    turns = [shards_to_try(16, set(), t) for t in range(4)]
    assert [len(t) for t in turns] == [4] * 4 and sorted(k for t in turns for k in t) == list(
        range(16)
    )
    assert shards_to_try(16, {0, 9}, 0) == [0, 1, 2, 3, 4, 9]
    assert shards_to_try(16, set(range(16)), 3) == list(range(16))
    # a holder that died: its shards are tried within 4 passes by any other process
    for start in range(16):
        seen = set().union(*(shards_to_try(16, {5}, start + t) for t in range(4)))
        assert seen == set(range(16))


async def test_following_the_events_of_every_shard(r: AnyRedis, ns: str) -> None:
    """What `reach events --follow` does: the last events, then the new ones of any shard."""
    reg = Registry(r, ns, shards=SHARDS)
    agents = ids_in_every_shard(SHARDS, per_shard=1)
    await register(reg, agents[0], [CAP])
    last = (await reg.recent_events(1))[-1].id
    assert await reg.tail_events(last_id=last, block_ms=10) == []
    for aid in agents[1:]:
        await register(reg, aid, [CAP])
    seen: list[str] = []
    while len(seen) < len(agents) - 1:
        new = await reg.tail_events(last_id=last, block_ms=500)
        assert new, seen
        seen += [e.agent_id for e in new]
        last = new[-1].id
    assert sorted(seen) == agents[1:]
    assert await reg.tail_events(last_id="$", block_ms=10) == []

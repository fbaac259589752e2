"""reach.admin against a real Redis: dead letters (list, find, replay, purge), inbox
statistics (the one queue depth), and one sweep pass."""

from __future__ import annotations

import anyio
import msgspec
import pytest
import redis

from reach import admin, scripts
from reach.client import Client
from reach.connection import AnyRedis
from reach.envelope import (
    Envelope,
    Reply,
    decode_envelope,
    decode_reply,
    encode,
    encode_payload,
    now_ms,
)
from reach.errors import AmbiguousDeadLetterId, InvalidCapability, ReachError
from reach.keys import GROUP, Keys
from reach.registry import Registry
from reach.sweeper import expire
from reach.tasks import dead_letter_op, get_status, raw_dead_letter_op

pytestmark = pytest.mark.anyio

CAP = "adm.work"


async def register(r: AnyRedis, ns: str, agent_id: str, *, lease_ms: int = 60_000) -> None:
    await Registry(r, ns).register(
        agent_id,
        instance_id=f"i-{agent_id}",
        version=1,
        capabilities=[CAP],
        ready=True,
        lease_ms=lease_ms,
        evict_after_ms=2 * lease_ms,
    )


async def envelope(
    r: AnyRedis, ns: str, payload: object = "x", *, cap: str = CAP, **kw: object
) -> Envelope:
    async with Client(redis=r, namespace=ns) as c:
        return c.build(cap, payload, reply=False, **kw)  # type: ignore[arg-type]


async def file_letter(r: AnyRedis, keys: Keys, env: Envelope, reason: str = "rejected") -> None:
    op = dead_letter_op(
        keys,
        capability=env.capability,
        reason=reason,
        data=encode(env),
        error="refused",
        error_type="Rejected",
        attempts=3,
        msg_id=env.msg_id,
    )
    await scripts.run_pipeline(r, [op])


async def inbox_envelopes(r: AnyRedis, keys: Keys, agent_id: str) -> list[Envelope]:
    out = []
    for stream in keys.inboxes(agent_id):
        out += [decode_envelope(f[b"e"]) for _, f in await r.xrange(stream)]
    return out


# -- dead letters -------------------------------------------------------------------------
async def test_list_find_and_purge_dead_letters(r: AnyRedis, ns: str) -> None:
    keys = Keys(ns)
    envs = [await envelope(r, ns, i) for i in range(3)]
    for env in envs:
        await file_letter(r, keys, env)
    other = await envelope(r, ns)
    await scripts.run_pipeline(
        r,
        [
            dead_letter_op(keys, capability="adm.other", reason="expired", data=encode(other)),
            raw_dead_letter_op(keys, reason="malformed", data=b"\xc1junk", error="not msgpack"),
        ],
    )

    everything = await admin.list_dead_letters(r, keys)
    assert len(everything) == 5
    by_cap = [e.letter.capability for e in everything]
    assert by_cap == sorted(by_cap)  # the streams in order, each oldest first
    mine = await admin.list_dead_letters(r, keys, capability=" ADM.work ")  # normalised
    assert [e.letter.msg_id for e in mine] == [e.msg_id for e in envs]
    assert all(e.stream == keys.dlq(CAP) for e in mine)
    first = mine[0].letter
    assert (first.reason, first.error, first.attempts) == ("rejected", "refused", 3)
    assert first.envelope is not None and first.envelope.msg_id == envs[0].msg_id
    assert len(await admin.list_dead_letters(r, keys, capability=CAP, limit=2)) == 2
    [raw] = await admin.list_dead_letters(r, keys, capability="_malformed")
    assert raw.letter.envelope is None and raw.letter.raw == b"\xc1junk"
    with pytest.raises(InvalidCapability):
        await admin.list_dead_letters(r, keys, capability="no such*cap")

    # (Letters written in one pipeline may share their entry id across streams: see the
    # test of ambiguous ids below.)
    found = await admin.find_dead_letter(r, keys, first.id, capability=CAP)
    assert found.letter.msg_id == first.msg_id and found.stream == keys.dlq(CAP)
    # An id of CAP's letters that adm.other's stream does not also have (ids are per
    # stream: letters written in one millisecond share them).
    other_ids = {
        e.letter.id for e in await admin.list_dead_letters(r, keys, capability="adm.other")
    }
    only_cap = next(e.letter.id for e in mine if e.letter.id not in other_ids)
    with pytest.raises(admin.DeadLetterNotFound, match="No dead letter"):
        await admin.find_dead_letter(r, keys, only_cap, capability="adm.other")
    with pytest.raises(admin.DeadLetterNotFound):
        await admin.find_dead_letter(r, keys, "0-1")
    with pytest.raises(admin.BadDeadLetterId, match="1717171717171-0"):
        await admin.find_dead_letter(r, keys, "12-x")
    assert issubclass(admin.BadDeadLetterId, ReachError)

    counts = {c.capability: c for c in await admin.dead_letter_counts(r, keys)}
    assert {k: c.count for k, c in counts.items()} == {CAP: 3, "adm.other": 1, "_malformed": 1}
    assert counts[CAP].added == 3

    assert await admin.purge_dead_letters(r, keys, capability=CAP) == 3
    assert await r.exists(keys.dlq(CAP)) == 0
    assert len(await admin.list_dead_letters(r, keys)) == 2
    assert await admin.purge_dead_letters(r, keys) == 2
    assert await admin.list_dead_letters(r, keys) == []
    assert await admin.dead_letter_counts(r, keys) == []


async def test_replay_sends_again_and_keeps_what_it_cannot_send(r: AnyRedis, ns: str) -> None:
    keys = Keys(ns)
    await register(r, ns, "adm-1")
    env = await envelope(r, ns, {"n": 1}, idempotency_key="key-1", timeout_s=0.001)
    env = msgspec.structs.replace(env, attempt=3)
    await file_letter(r, keys, env)
    await scripts.run_pipeline(
        r, [raw_dead_letter_op(keys, reason="malformed", data=b"junk", error="not msgpack")]
    )
    nobody = await envelope(r, ns, cap="adm.none")  # no agent has it
    await scripts.run_pipeline(
        r, [dead_letter_op(keys, capability="adm.none", reason="expired", data=encode(nobody))]
    )
    entries = await admin.list_dead_letters(r, keys, limit=None)
    assert len(entries) == 3
    steps: list[int] = []

    res = await admin.replay_dead_letters(r, keys, entries, on_each=lambda: steps.append(1))

    assert res.replayed == 1 and len(steps) == 3
    # Two letters in different streams may share an entry id (same millisecond): compare
    # the failures as a list, not keyed by id.
    assert len(res.failed) == 2
    why = " ".join(f.error for f in res.failed)
    assert "not a valid envelope" in why
    assert "adm.none" in why  # no agent: the router's error
    # The replayed letter left its stream and reached the agent: same ids, attempts from
    # 1, no deadline any more. The other two stay for another try.
    assert await r.xlen(keys.dlq(CAP)) == 0
    [sent] = await inbox_envelopes(r, keys, "adm-1")
    assert (sent.msg_id, sent.idempotency_key) == (env.msg_id, "key-1")
    assert (sent.attempt, sent.deadline_ms) == (1, 0)
    left = await admin.list_dead_letters(r, keys)
    assert sorted(e.letter.id for e in left) == sorted(f.id for f in res.failed)


# -- inboxes -------------------------------------------------------------------------------
async def test_inbox_stats_and_the_one_queue_depth(
    r: AnyRedis, sync_r: redis.Redis, ns: str
) -> None:
    keys = Keys(ns)
    await register(r, ns, "adm-1")
    high, normal = keys.inbox("adm-1", "high"), keys.inbox("adm-1", "normal")
    await r.xgroup_create(normal, GROUP, id="0", mkstream=True)
    for _ in range(4):
        await r.xadd(normal, {"e": b"x"})
    await r.xadd(high, {"e": b"x"})
    t0 = now_ms()
    got = await r.xreadgroup(GROUP, "adm-1", {normal: ">"}, count=3)
    assert len(got[0][1]) == 3
    # An agent that is not registered (evicted, its inbox waiting for the sweeper) is
    # found by its streams; a key of another type where a stream should be counts 0.
    await r.xadd(keys.inbox("gone-1", "low"), {"e": b"x"})
    await r.set(keys.inbox("bad-1", "high"), "not a stream")

    assert await admin.inbox_agents(r, keys) == ["adm-1", "bad-1", "gone-1"]
    depths = await admin.queue_depths(r, keys, ["adm-1", "gone-1", "bad-1", "none-1"])
    assert depths == {
        "adm-1": {"high": 1, "normal": 4, "low": 0},
        "gone-1": {"high": 0, "normal": 0, "low": 1},
        "bad-1": {"high": 0, "normal": 0, "low": 0},
        "none-1": {"high": 0, "normal": 0, "low": 0},
    }
    for agent_id, d in depths.items():
        assert admin.queue_depths_sync(sync_r, keys, agent_id) == d
    assert await admin.queue_depths(r, keys, []) == {}

    stats = await admin.inbox_stats(r, keys, ["adm-1", "bad-1"])
    a, bad = stats
    assert (a.agent_id, a.depth, a.queued, a.pending) == ("adm-1", depths["adm-1"], 5, 3)
    assert a.oldest_pending_ms is not None and t0 - 5_000 <= a.oldest_pending_ms <= now_ms()
    assert a.added == {} and a.read == {}  # counters only when asked for
    assert (bad.queued, bad.pending, bad.oldest_pending_ms) == (0, 0, None)

    [c] = await admin.inbox_stats(r, keys, ["adm-1"], counters=True)
    assert c.added == {"high": 1, "normal": 4}  # no group on high: nothing read there
    assert c.read == {"normal": 3}
    assert c.pending == 3


# -- sweeping -------------------------------------------------------------------------------
async def test_sweep_once_evicts_moves_retries_and_expires(r: AnyRedis, ns: str) -> None:
    keys = Keys(ns)
    await register(r, ns, "adm-live")
    await register(r, ns, "adm-dead", lease_ms=50)
    # The agent about to be evicted holds one message; a retry is due; a parked message's
    # deadline has passed.
    held = await envelope(r, ns, "held")
    await r.xadd(keys.inbox("adm-dead", "normal"), {"e": encode(held)})
    retry = await envelope(r, ns, "retry")
    await r.zadd(keys.delayed, {encode(retry): now_ms() - 1})
    late = await envelope(r, ns, "late", timeout_s=0.001)
    await anyio.sleep(0.3)  # adm-dead misses lease and eviction; late's deadline passes
    await r.xadd(keys.parked(CAP), {"e": encode(late)})
    await r.sadd(keys.parked_caps, CAP)

    # While another runtime holds the sweeper lock, a locked pass does nothing.
    await r.set(keys.sweeper_lock, "someone", px=5_000)
    assert (await admin.sweep_once(r, keys, owner="me", lock_ms=1_000)).locked
    await r.delete(keys.sweeper_lock)

    res = await admin.sweep_once(r, keys)
    assert not res.locked
    assert res.evicted == ["adm-dead"]
    assert res.retries_moved == 1 and res.rerouted == 1 and res.expired == 1
    assert (res.parked, res.released, res.dead_lettered) == (0, 0, 0)
    moved = {e.msg_id for e in await inbox_envelopes(r, keys, "adm-live")}
    assert moved == {held.msg_id, retry.msg_id}
    assert (await get_status(r, keys, late.msg_id)).status == "expired"
    [letter] = await admin.list_dead_letters(r, keys)
    assert (letter.letter.msg_id, letter.letter.reason) == (late.msg_id, "expired")
    again = await admin.sweep_once(r, keys)
    assert again == admin.SweepReport()


# -- giving up on a message (the sweeper's path, through lua/give_up.lua) ------------------
async def test_giving_up_tells_the_caller_and_spares_completed_keys(r: AnyRedis, ns: str) -> None:
    keys = Keys(ns)
    async with Client(redis=r, namespace=ns, client_id="adm-caller") as c:
        late = c.build(CAP, 1, idempotency_key="k-late", timeout_s=5)
        dup = c.build(CAP, 2, idempotency_key="k-done", timeout_s=5)
        damaged = c.build(CAP, 3, idempotency_key="k-damaged", timeout_s=5)
    replies = keys.replies("adm-caller")
    stored = Reply(msg_id="first", status="succeeded", result=encode_payload("ok"))
    await r.hset(keys.idem(dup.key), mapping={"done": "1", "status": "succeeded"})
    await r.hset(keys.idem(dup.key), "reply", encode(stored))
    await r.hset(keys.idem(damaged.key), mapping={"done": "1", "status": "succeeded"})
    await r.hset(keys.idem(damaged.key), "reply", b"\xc1 no reply")

    await expire(r, keys, late, reason="expired", error="deadline passed while parked")
    await expire(r, keys, dup, reason="expired", error="deadline passed while parked")
    await expire(r, keys, damaged, reason="expired", error="deadline passed while parked")

    got = {(rep := decode_reply(f[b"r"])).msg_id: rep for _, f in await r.xrange(replies)}
    # Not completed: expired in its record, a dead letter, the caller told.
    assert got[late.msg_id].status == "expired" and got[late.msg_id].reason == "expired"
    assert await r.hget(keys.idem(late.key), "status") == b"expired"
    # Completed: the stored reply, under this message's id; nothing filed or changed.
    assert got[dup.msg_id].status == "succeeded" and got[dup.msg_id].result == stored.result
    assert await r.hget(keys.idem(dup.key), "status") == b"succeeded"
    # Completed, but its stored reply cannot be read: the caller is told it expired (a
    # dead letter too), and the record keeps its status.
    assert got[damaged.msg_id].status == "expired"
    assert await r.hget(keys.idem(damaged.key), "status") == b"succeeded"
    letters = {e.letter.msg_id for e in await admin.list_dead_letters(r, keys)}
    assert letters == {late.msg_id, damaged.msg_id}


async def test_an_id_in_several_capabilities_dead_letters_needs_the_capability(
    r: AnyRedis, ns: str
) -> None:
    # Entry ids are unique within a stream only: two capabilities' letters written in the
    # same millisecond can share one. The id alone must not pick one of them silently.
    keys = Keys(ns)
    shared, alone = "1700000000000-5", "1700000000001-0"
    for cap, msg in (("adm.one", "m-one"), ("adm.two", "m-two")):
        await r.xadd(keys.dlq(cap), {"reason": "rejected", "error": "e", "error_type": "",
                                      "attempts": 1, "agent_id": "a", "msg_id": msg,
                                      "capability": cap, "ts": 1, "env": b""}, id=shared)  # fmt: skip
    await r.xadd(keys.dlq("adm.two"), {"reason": "rejected", "msg_id": "m-alone"}, id=alone)
    with pytest.raises(AmbiguousDeadLetterId, match=r"2 capabilities \(adm.one, adm.two\).*--cap"):
        await admin.find_dead_letter(r, keys, shared)
    one = await admin.find_dead_letter(r, keys, shared, capability="adm.one")
    two = await admin.find_dead_letter(r, keys, shared, capability="adm.two")
    assert (one.letter.msg_id, two.letter.msg_id) == ("m-one", "m-two")
    assert (await admin.find_dead_letter(r, keys, alone)).letter.msg_id == "m-alone"

"""reroute.lua: a message its agent has not read moves to another agent's inbox in one
step (the first copy gone, its claim at send dropped); anything read, settled or held is
left where it is, and bad arguments are refused before any write."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.scripts import inbox
from reach.scripts._call import Call
from reach.scripts.codes import RerouteCode

from .snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

TTL_MS = 60_000
OWNER = "slow/inst-a"


async def sent(r: AnyRedis, k: Keys, msg_id: str, *, claim: bool = True) -> str:
    """A message sent to agent 'slow' (claimed at send for it when ``claim``); its entry id."""
    m = inbox.Message(b"ENV-" + msg_id.encode(), "cap", 1, msg_id, msg_id)
    extra: dict[str, Any] = {"claim_for": OWNER, "claim_lease_ms": 60_000} if claim else {}
    got = await inbox.send_call(
        k, m, agent_id="slow", priority="normal", ttl_ms=TTL_MS, **extra
    ).run(r)
    return got.entry_id


def move(k: Keys, msg_id: str, entry: str, *, max_queue: int = 0) -> Call[inbox.Rerouted]:
    return inbox.reroute_call(
        k,
        record=k.idem(msg_id),
        from_agent="slow",
        entry_id=entry,
        to_agent="fast",
        priority="normal",
        max_queue=max_queue,
    )


async def test_an_unread_message_moves_with_its_bytes_and_loses_its_claim(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    await r.xgroup_create(k.inbox("slow", "normal"), "reach", id="0", mkstream=True)
    entry = await sent(r, k, "m1")
    got = await move(k, "m1", entry).run(r)
    assert got.code == RerouteCode.MOVED and got.entry_id
    assert await r.xlen(k.inbox("slow", "normal")) == 0
    new = await r.xrange(k.inbox("fast", "normal"))
    assert [(i.decode(), f) for i, f in new] == [(got.entry_id, {b"e": b"ENV-m1"})]
    rec = await r.hgetall(k.idem("m1"))
    assert rec[b"status"] == b"pending" and rec[b"fence"] == b"2"
    assert rec[b"agent_id"] == b"fast"
    assert b"owner" not in rec and b"lease_until" not in rec
    # The first agent's read finds nothing: the first copy can never start.
    read = await r.xreadgroup("reach", "slow", {k.inbox("slow", "normal"): ">"})
    assert not read or not read[0][1]


async def test_a_message_read_by_its_agent_stays(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    src = k.inbox("slow", "normal")
    await r.xgroup_create(src, "reach", id="0", mkstream=True)
    first = await sent(r, k, "m2")
    second = await sent(r, k, "m3")
    await r.xreadgroup("reach", "slow", {src: ">"}, count=1)  # m2 read: it may be running
    before = await snapshot(r, ns)
    got = await move(k, "m2", first).run(r)
    assert got.code == RerouteCode.READ
    assert_unchanged(before, await snapshot(r, ns))
    got = await move(k, "m3", second).run(r)
    assert got.code == RerouteCode.MOVED


async def test_an_inbox_without_its_group_yet_counts_as_unread(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    entry = await sent(r, k, "m4", claim=False)
    got = await move(k, "m4", entry).run(r)
    assert got.code == RerouteCode.MOVED
    rec = await r.hgetall(k.idem("m4"))
    assert rec[b"status"] == b"pending" and rec[b"agent_id"] == b"fast"


async def test_a_gone_entry_a_settled_record_and_a_full_inbox_write_nothing(
    r: AnyRedis, ns: str
) -> None:
    k = Keys(ns)
    done = await sent(r, k, "m5")
    await r.hset(k.idem("m5"), mapping={"status": "succeeded", "done": "1"})
    full = await sent(r, k, "m6")
    for _ in range(2):
        await r.xadd(k.inbox("fast", "low"), {"e": b"x"})
    before = await snapshot(r, ns)
    assert (await move(k, "m5", "1-1").run(r)).code == RerouteCode.GONE
    got = await move(k, "m5", done).run(r)
    assert got.code == RerouteCode.SETTLED and got.status == "succeeded"
    got = await move(k, "m6", full, max_queue=2).run(r)
    assert got.code == RerouteCode.FULL and got.depth == 2
    assert_unchanged(before, await snapshot(r, ns))
    assert (await move(k, "m6", full, max_queue=3).run(r)).code == RerouteCode.MOVED


def good(k: Keys) -> tuple[list[str], list[Any]]:
    keys = [
        k.inbox("slow", "normal"),
        k.idem("m9"),
        k.inbox("fast", "normal"),
        *k.inboxes("fast"),
    ]
    return keys, ["1-0", 0, "fast"]


@pytest.mark.parametrize(
    ("slot", "value", "why"),
    [
        (0, "abc", "entry id"),
        (0, "1-", "entry id"),
        (0, "-1-0", "entry id"),
        (1, "-1", "max_queue"),
        (1, "nan", "max_queue"),
        (1, "1e3", "max_queue"),
        (2, "", "agent_id"),
        (3, "extra", "arguments"),
    ],
)
async def test_bad_arguments_are_refused_before_any_write(
    r: AnyRedis, ns: str, slot: int, value: Any, why: str
) -> None:
    k = Keys(ns)
    entry = await sent(r, k, "m9")
    keys, args = good(k)
    args[0] = entry
    if slot < len(args):
        args[slot] = value
    else:
        args.append(value)
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match=f"reach: bad {why}"):
        await scripts.call(r, "reroute", keys, args)
    assert_unchanged(before, await snapshot(r, ns))


@pytest.mark.parametrize("case", ["not_its_inboxes", "same_inbox", "record_string", "inbox_hash"])
async def test_bad_keys_are_refused_before_any_write(r: AnyRedis, ns: str, case: str) -> None:
    k = Keys(ns)
    entry = await sent(r, k, "m9")
    keys, args = good(k)
    args[0] = entry
    if case == "not_its_inboxes":
        keys[2] = k.inbox("other", "normal")
    elif case == "same_inbox":
        keys[2:] = [k.inbox("slow", "normal"), *k.inboxes("slow")]
    elif case == "record_string":
        await r.delete(keys[1])
        await r.set(keys[1], "x")
    else:
        await r.hset(keys[4], "x", "y")
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match=r"reach: bad KEYS\["):
        await scripts.call(r, "reroute", keys, args)
    assert_unchanged(before, await snapshot(r, ns))

"""Fuzz the ARGV (and KEYS) of the delivery scripts: claim, complete, settle, fetch.

Each example builds a realistic namespace (three inbox streams with the consumer group and
entries, some of them pending; idempotency records free, held, done, released, expired and
damaged; a reply stream, a dead-letter stream, the delayed set; keys of the wrong type),
then calls one script through ``reach.scripts.call`` with a valid call as the runtime
makes it, mutated a few times (or with arguments drawn at random). Whatever the input:

* the script succeeds with a well-formed answer, or refuses with its documented error
  (``ERR reach: bad ...``; fetch also ``NOGROUP``): never a Lua runtime error
  (``user_script:..: attempt to ...``) nor a Redis error from a command half-way through;
* a refused call changed nothing (every key of the namespace, DUMPed before and after);
* an unmutated call, as the runtime makes it, is never refused;
* Redis still answers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.exceptions as rexc
from hypothesis import given
from hypothesis import strategies as st

from reach import scripts
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.keys import GROUP, Keys
from tests.fuzz.strategies import EDGE_FLOATS, EDGE_INTS
from tests.lua.snapshot import assert_unchanged, snapshot

AGENT, OWNER, OTHER = "w-1", "w-1/i1", "w-2/i2"
TTL_MS = 60_000
STATUSES = ["succeeded", "failed", "retrying", "expired", "dead"]
MODES = ["done", "release"]

# Values at the edges of what the scripts parse: numbers in every spelling Lua's tonumber
# or Redis would take, counts and key indexes just in and out of range, the words of the
# contract (statuses, modes, commands, XADD options), stream ids and owners.
ARG_EDGES = [
    "",
    "0",
    "1",
    "2",
    "3",
    "-1",
    "-0",
    "+1",
    "nan",
    "-nan",
    "inf",
    "-inf",
    "+inf",
    "1e309",
    "-1e309",
    "1e3",
    "1.5",
    "0.0",
    " 5",
    "5 ",
    "0x10",
    "007",
    "00",
    str(2**31),
    str(2**53),
    str(2**53 + 1),
    str(2**63),
    str(2**64),
    "9" * 17,
    "9" * 40,
    "\x00",
    "é",
    "*",
    "$",
    ">",
    "MAXLEN",
    "maxlen",
    "MINID",
    "~",
    "=",
    "XADD",
    "ZADD",
    "xadd",
    "DEL",
    "EVAL",
    "XACK",
    *STATUSES,
    "running",
    "pending",
    *MODES,
    GROUP,
    OWNER,
    OTHER,
    AGENT,
    "0-0",
    "1-1",
    "1-",
    "-1-1",
    "18446744073709551615-18446744073709551615",
    "18446744073709551616-0",
    "604800000",
    "604800001",
    "31536000000",
    "31536000001",
    "10000",
    "10001",
]
FUZZ_ARG = st.one_of(
    st.sampled_from(ARG_EDGES),
    st.integers(-3, 16).map(str),  # counts and key indexes, in range and just out of it
    EDGE_INTS.map(str),
    EDGE_FLOATS.map(str),
    st.text(max_size=12),
    st.binary(max_size=12),
)


@dataclass
class World:
    """The keys of one example's namespace and what is in them."""

    ns: str
    k: Keys
    inboxes: list[str]
    pending: list[str]  # ids of entries of the normal inbox pending for AGENT
    records: dict[str, str]  # state -> idempotency record key
    fences: dict[str, int]  # state -> the record's current fence
    replies: str
    dlq: str
    delayed: str
    wrong: list[str] = field(default_factory=list)  # keys of the wrong type for every use

    def realistic_keys(self) -> list[str]:
        return [*self.records.values(), *self.inboxes, self.replies, self.dlq, self.delayed]


async def build_world(r: AnyRedis) -> World:
    ns = f"fz{uuid.uuid4().hex[:10]}"
    k = Keys(ns)
    inboxes = k.inboxes(AGENT)
    for key in inboxes:
        await r.xgroup_create(key, GROUP, id="0", mkstream=True)
        for i in range(3):
            await r.xadd(key, {"e": f"entry-{i}".encode()})
    got = await r.xreadgroup(GROUP, AGENT, {inboxes[1]: ">"}, count=2)
    pending = [eid.decode() for eid, _ in got[0][1]]
    rec = {s: k.idem(s) for s in ["free", "held", "mine", "done", "released", "expired", "damaged"]}
    fences = {"free": 1, "held": 1, "mine": 1, "done": 3, "released": 2, "expired": 5}
    await scripts.call(r, "claim", [rec["held"]], [OTHER, TTL_MS, "w-2", 3, 60_000, "m-held", ""])
    await scripts.call(r, "claim", [rec["mine"]], [OWNER, TTL_MS, AGENT, 3, 60_000, "m-mine", ""])
    await r.hset(
        rec["done"],
        mapping={
            "done": "1",
            "reply": b"\x81\xa1r\x01",
            "fence": 3,
            "status": "succeeded",
            "owner": "",
            "lease_until": 0,
        },
    )
    await r.hset(
        rec["released"], mapping={"fence": 2, "status": "retrying", "owner": "", "lease_until": 0}
    )
    await r.hset(rec["expired"], mapping={"fence": 5, "owner": OTHER, "lease_until": 1})
    await r.hset(
        rec["damaged"],
        mapping={
            "fence": "abc",
            "runs": "-",
            "lease_until": "soon",
            "owner": OTHER,
            "done": "maybe",
        },
    )
    for key in rec.values():
        if await r.exists(key):
            await r.pexpire(key, 600_000)
    replies, dlq, delayed = k.replies("c-1"), k.dlq("fuzz.cap"), k.delayed
    await r.xadd(replies, {"r": b"old"})
    await r.pexpire(replies, 600_000)
    await r.xadd(dlq, {"reason": "old"})
    await r.zadd(delayed, {b"OLD": 1})
    wrong = [k.idem("a-string"), k.idem("a-list")]
    await r.set(wrong[0], "x")
    await r.rpush(wrong[1], "x")
    return World(ns, k, inboxes, pending, rec, fences, replies, dlq, delayed, wrong)


async def drop_world(r: AnyRedis, w: World) -> None:
    keys = [key async for key in r.scan_iter(match=f"*{w.ns}*", count=1000)]
    if keys:
        await r.delete(*keys)


@pytest.fixture(scope="module")
def world_runner(redis_server: RedisServer) -> Iterator[tuple[asyncio.Runner, AnyRedis]]:
    """One event loop and one client for every example of the module (hypothesis runs
    examples as plain calls, so each example's coroutine is run on this loop)."""
    with asyncio.Runner() as runner:
        client = runner.run(connect(redis_server.url))
        yield runner, client
        runner.run(client.aclose())


# -- valid calls, as the runtime makes them ---------------------------------------------


def claim_call(data: st.DataObject, w: World) -> tuple[list[str], list[Any]]:
    states = data.draw(st.lists(st.sampled_from(sorted(w.records)), min_size=1, max_size=4))
    owner = data.draw(st.sampled_from([OWNER, OTHER]))
    max_takeovers = data.draw(st.sampled_from([0, 1, 3]))
    args: list[Any] = [owner, TTL_MS, owner.split("/")[0], max_takeovers]
    for i, _ in enumerate(states):
        args += [
            data.draw(st.sampled_from([1, 1000, 60_000, 604_800_000])),
            f"m{i}",
            data.draw(st.sampled_from(["", OTHER, OWNER, "w-3/x"])),  # takeover_from
        ]
    return [w.records[s] for s in states], args


def complete_call(data: st.DataObject, w: World) -> tuple[list[str], list[Any]]:
    states = data.draw(st.lists(st.sampled_from(sorted(w.records)), min_size=1, max_size=4))
    args: list[Any] = [TTL_MS]
    for s in states:
        fence = data.draw(st.sampled_from([w.fences.get(s, 1), 1, 2, 9]))
        status, mode = data.draw(st.sampled_from(STATUSES)), data.draw(st.sampled_from(MODES))
        args += [
            fence,
            status,
            data.draw(st.sampled_from([b"", b"R", b"\xff" * 3])),
            mode,
            data.draw(st.sampled_from(["", "boom"])),
        ]
    return [w.records[s] for s in states], args


def settle_call(data: st.DataObject, w: World) -> tuple[list[str], list[Any]]:
    keys: list[str] = []

    def ki(key: str | None) -> int:
        if key is None:
            return 0
        if key not in keys:
            keys.append(key)
        return keys.index(key) + 1

    items: list[Any] = []
    n = data.draw(st.integers(1, 4))
    runs = 0  # items given as runs: each run of k counts as k of the n
    if data.draw(st.booleans(), label="run"):
        # A run of plain successes ('*k', fence, inbox index, first record index, then
        # stored reply and entry id each): records new to the call, their KEYS in a row.
        states = data.draw(st.lists(st.sampled_from(sorted(w.records)), min_size=1, max_size=3,
                                    unique=True))  # fmt: skip
        inbox = data.draw(st.sampled_from([None, w.inboxes[1]]))
        ii = ki(inbox)
        first = ki(w.records[states[0]])
        for s in states[1:]:
            ki(w.records[s])
        items += [
            f"*{len(states)}",
            data.draw(st.sampled_from([w.fences.get(states[0], 1), 1, 7])),
            ii,
            first,
        ]
        for _ in states:
            items += [
                data.draw(st.sampled_from([b"", b"S"])),
                data.draw(st.sampled_from([*w.pending, "1-0", "99999-7"])),
            ]
        runs = len(states)
    for _ in range(n):
        state = data.draw(st.sampled_from([None, *sorted(w.records)]))
        idem = w.records[state] if state else None
        if idem is not None and data.draw(st.booleans(), label="plain"):
            # A plain success in its 5 slots ('+<record index>', fence, stored reply, inbox
            # index, entry id), as the runtime sends most of its items.
            inbox = data.draw(st.sampled_from([None, w.inboxes[1]]))
            items += [
                f"+{ki(idem)}",
                data.draw(st.sampled_from([w.fences.get(state or "", 1), 1, 7])),
                data.draw(st.sampled_from([b"", b"S"])),
                ki(inbox),
                data.draw(st.sampled_from([*w.pending, "1-0", "99999-7"])),
            ]
            continue
        if idem is not None:
            items += [
                ki(idem),
                data.draw(st.sampled_from([w.fences.get(state or "", 1), 1, 7])),
                data.draw(st.sampled_from(STATUSES)),
            ]
        else:
            items += [0, "", ""]
        items += [
            data.draw(st.sampled_from([b"", b"S"])),
            data.draw(st.sampled_from(MODES)) if idem else "",
            "",
            data.draw(st.sampled_from([b"", b"R"])),
        ]
        items += [ki(data.draw(st.sampled_from([None, w.replies])))]
        inbox = data.draw(st.sampled_from([None, w.inboxes[1]]))
        items += [ki(inbox), data.draw(st.sampled_from([*w.pending, "1-0", "99999-7"]))]
        kind = data.draw(st.sampled_from(["none", "dead_letter", "retry"]))
        if kind == "dead_letter":
            items += [1, ki(w.dlq), data.draw(st.sampled_from([0, 1000]))]
            items += ["fuzz", "boom", "ValueError", data.draw(st.sampled_from([0, 3]))]
            items += [AGENT, "m-1", "fuzz.cap", data.draw(st.sampled_from([0, 12345])), b"E"]
        elif kind == "retry":
            items += [2, ki(w.delayed), data.draw(st.sampled_from([0, 12345])), b"ENV"]
        else:
            items.append(0)
    return keys, [TTL_MS, GROUP, n + runs, *items]


def fetch_call(data: st.DataObject, w: World) -> tuple[list[str], list[Any]]:
    n = data.draw(st.integers(1, 12))
    keep = st.integers(0, min(n, 2)) if n < 10 else st.integers(0, n // 5)
    consumer = data.draw(st.sampled_from([AGENT, "w-9"]))
    return list(w.inboxes), [GROUP, consumer, n, data.draw(keep), data.draw(keep)]


VALID = {
    "claim": claim_call,
    "complete": complete_call,
    "settle": settle_call,
    "fetch": fetch_call,
}


def mutate(
    data: st.DataObject, w: World, keys: list[str], args: list[Any]
) -> tuple[list[str], list[Any], int]:
    """Apply 0..3 random edits to a call; returns the call and the number of edits."""
    keys, args = list(keys), list(args)
    n = data.draw(st.integers(0, 3), label="edits")
    for _ in range(n):
        op = data.draw(
            st.sampled_from(
                ["replace", "replace", "replace", "index", "delete", "insert", "truncate", "keys"]
            )
        )
        if op in ("replace", "index", "delete") and args:
            i = data.draw(st.integers(0, len(args) - 1))
            if op == "delete":
                del args[i]
            else:
                args[i] = data.draw(FUZZ_ARG if op == "replace" else st.integers(-1, len(keys) + 2))
        elif op == "insert":
            args.insert(data.draw(st.integers(0, len(args))), data.draw(FUZZ_ARG))
        elif op == "truncate":
            args = args[: data.draw(st.integers(0, len(args)))]
        else:
            how = data.draw(st.sampled_from(["drop", "add", "wrong"]))
            pool = [*w.realistic_keys(), *w.wrong, w.k.idem("absent")]
            if how == "drop" and keys:
                del keys[data.draw(st.integers(0, len(keys) - 1))]
            elif how == "add":
                keys.insert(data.draw(st.integers(0, len(keys))), data.draw(st.sampled_from(pool)))
            elif keys:
                keys[data.draw(st.integers(0, len(keys) - 1))] = data.draw(st.sampled_from(w.wrong))
    return keys, args, n


# -- what a successful call must have answered -------------------------------------------


async def check_answer(r: AnyRedis, name: str, keys: list[str], args: list[Any], res: Any) -> None:
    unique = {k for k in keys if keys.count(k) == 1}
    if name == "claim":
        assert isinstance(res, list) and len(res) == len(keys)
        for key, (code, value, *counts) in zip(keys, res, strict=True):
            assert code in (1, 2, 3, 5)
            if key not in unique:
                continue
            h = await r.hgetall(key)
            if not h:
                continue  # a ttl_ms of a few ms: gone already
            if code == 1:
                assert int(value) >= 1 and h[b"fence"] == str(value).encode()
                assert h[b"owner"] == _b(args[0]) and h[b"status"] == b"running"
            elif code == 2:
                assert h[b"done"] == b"1" and value == h.get(b"reply", b"")
            elif code == 5:  # poisoned: settled dead, no owner, not run
                assert h[b"status"] == b"dead" and h[b"owner"] == b""
                assert int(counts[0]) >= int(args[3])
            else:
                assert value and h[b"owner"] == value
    elif name == "complete":
        assert isinstance(res, list) and len(res) == len(keys) and set(res) <= {0, 1}
        for i, (key, code) in enumerate(zip(keys, res, strict=True)):
            h = await r.hgetall(key) if code == 1 and key in unique else {}
            if h:
                assert h[b"status"] == _b(args[2 + 5 * i]) and b"owner" not in h
                assert (h.get(b"done") == b"1") == (_b(args[4 + 5 * i]) == b"done")
    elif name == "settle":
        assert isinstance(res, list) and len(res) == int(args[2]) and set(res) <= {0, 1}
    else:
        assert name == "fetch"
        assert isinstance(res, list) and len(res) == 5 and res[3] in (0, 1) and res[4] in (0, 1)
        assert sum(len(x) for x in res[:3]) <= int(args[2])


def _b(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


async def run_example(
    r: AnyRedis, name: str, w: World, keys: list[str], args: list[Any], *, must_succeed: bool
) -> None:
    before = await snapshot(r, w.ns)
    try:
        res = await scripts.call(r, name, keys, args)
    except rexc.ResponseError as e:
        msg = str(e)
        documented = msg.startswith("reach: bad ") or (
            name == "fetch" and msg.startswith("NOGROUP")
        )
        assert documented, f"{name}.lua: undocumented error {msg!r}\nKEYS={keys!r}\nARGV={args!r}"
        assert not must_succeed, (
            f"{name}.lua refused a valid call: {msg}\nKEYS={keys!r}\nARGV={args!r}"
        )
        assert_unchanged(before, await snapshot(r, w.ns))
    else:
        await check_answer(r, name, keys, args, res)
    assert await r.ping()


def _example(
    world_runner: tuple[asyncio.Runner, AnyRedis], name: str, data: st.DataObject, *, random: bool
) -> None:
    runner, r = world_runner

    async def go() -> None:
        w = await build_world(r)
        try:
            if random:
                keys = data.draw(
                    st.lists(st.sampled_from([*w.realistic_keys(), *w.wrong]), max_size=4)
                )
                args = data.draw(st.lists(FUZZ_ARG, max_size=30))
                await run_example(r, name, w, keys, args, must_succeed=False)
            else:
                keys, args = VALID[name](data, w)
                keys, args, edits = mutate(data, w, keys, args)
                await run_example(r, name, w, keys, args, must_succeed=edits == 0)
        finally:
            await drop_world(r, w)

    runner.run(go())


SCRIPTS = sorted(VALID)


@pytest.mark.parametrize("name", SCRIPTS)
@given(data=st.data())
def test_mutated_calls_succeed_or_are_refused_unchanged(
    world_runner: tuple[asyncio.Runner, AnyRedis], name: str, data: st.DataObject
) -> None:
    _example(world_runner, name, data, random=False)


@pytest.mark.parametrize("name", SCRIPTS)
@given(data=st.data())
def test_random_arguments_succeed_or_are_refused_unchanged(
    world_runner: tuple[asyncio.Runner, AnyRedis], name: str, data: st.DataObject
) -> None:
    _example(world_runner, name, data, random=True)

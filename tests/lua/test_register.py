"""register.lua through Registry.register: codes 1 (new), 2 (replaced), -1 (stale)."""

from __future__ import annotations

import dataclasses

import pytest
import redis

import reach
from reach import scripts
from reach.connection import AnyRedis
from reach.registry import Registry, normalize_capabilities, normalize_capability
from tests.support.registry_helpers import (
    LONG_EVICT_MS,
    LONG_LEASE_MS,
    assert_consistent,
    new_version,
    register,
    wait_until,
)

pytestmark = pytest.mark.anyio


async def test_new_registration_returns_1_and_writes_every_key(reg: Registry, r: AnyRedis) -> None:
    version = new_version()
    code = await reg.register(
        "a1",
        instance_id="inst-1",
        version=version,
        capabilities=["text.summarize", "Code.Review"],
        weight=2.5,
        metadata={"region": "eu", "model": "m1"},
        lease_ms=9000,
        evict_after_ms=18000,
        card={"name": "A1", "skills": []},
        max_queue=50,
    )
    assert code == 1

    a = await reg.get("a1")
    assert a is not None
    assert (a.agent_id, a.instance_id, a.version) == ("a1", "inst-1", version)
    assert a.weight == 2.5
    assert a.capabilities == ["text.summarize", "code.review"]
    assert a.metadata == {"region": "eu", "model": "m1"}
    assert a.card == {"name": "A1", "skills": []}
    assert (a.state, a.ready, a.draining) == ("active", False, False)
    assert (a.lease_ms, a.evict_after_ms, a.max_queue) == (9000, 18000, 50)
    assert a.registered_ms == a.last_heartbeat_ms == a.state_ms > 0
    assert a.ready_ms == 0
    assert not a.routable  # registered not ready

    # lease deadline in the agents zset, capability sets and counts, one event
    assert await r.zscore(reg.keys.agents, "a1") == a.registered_ms + 9000
    assert await reg.agent_ids("text.summarize") == ["a1"]
    assert await reg.agent_ids("code.review") == ["a1"]
    assert await reg.capabilities() == [("code.review", 1), ("text.summarize", 1)]
    events = await reg.events()
    assert [(e.type, e.agent_id, e.instance_id) for e in events] == [("registered", "a1", "inst-1")]
    assert events[0].ts == a.registered_ms
    await assert_consistent(reg)


async def test_register_ready_sets_ready_ms(reg: Registry) -> None:
    await register(reg, "a1", ready=True)
    a = await reg.get("a1")
    assert a is not None and a.ready and a.ready_ms == a.registered_ms
    assert a.routable


async def test_same_version_again_replaces_and_returns_2(reg: Registry) -> None:
    code, inst, version = await register(reg, "a1", ["x"])
    assert code == 1
    code, _, _ = await register(reg, "a1", ["x"], instance_id=inst, version=version)
    assert code == 2
    assert await reg.capabilities() == [("x", 1)]
    assert [e.type for e in await reg.events()] == ["registered", "registered"]
    await assert_consistent(reg)


async def test_newer_version_replaces_and_resets_flags(reg: Registry) -> None:
    await register(reg, "a1", ["x"], ready=True)
    assert await reg.drain("a1") == 1
    code, inst2, v2 = await register(reg, "a1", ["x"], metadata={"env": "prod"})
    assert code == 2
    a = await reg.get("a1")
    assert a is not None
    assert (a.instance_id, a.version) == (inst2, v2)
    assert (a.ready, a.draining, a.state) == (False, False, "active")
    assert a.metadata == {"env": "prod"}


async def test_stale_version_refused_and_record_untouched(reg: Registry) -> None:
    old = new_version()
    code, inst, newer = await register(reg, "a1", ["x", "y"])
    assert code == 1
    with pytest.raises(reach.StaleRegistration, match=str(newer)):
        await register(reg, "a1", ["z"], version=old)
    a = await reg.get("a1")
    assert a is not None
    assert (a.instance_id, a.version, a.capabilities) == (inst, newer, ["x", "y"])
    assert await reg.capabilities() == [("x", 1), ("y", 1)]
    assert await reg.agent_ids("z") == []
    assert [e.type for e in await reg.events()] == ["registered"]  # no event for the refusal
    await assert_consistent(reg)


async def test_reregister_with_other_capabilities_moves_sets_and_counts(
    reg: Registry, r: AnyRedis
) -> None:
    await register(reg, "a1", ["a", "b", "c"])
    await register(reg, "a2", ["b", "c"])
    await register(reg, "a3", ["c"])
    assert await reg.capabilities() == [("a", 1), ("b", 2), ("c", 3)]

    code, _, _ = await register(reg, "a1", ["c", "d"])  # drops a and b, keeps c, adds d
    assert code == 2
    assert await reg.agent_ids("a") == []
    assert await reg.agent_ids("b") == ["a2"]
    assert await reg.agent_ids("c") == ["a1", "a2", "a3"]
    assert await reg.agent_ids("d") == ["a1"]
    assert await reg.capabilities() == [("b", 1), ("d", 1), ("c", 3)]
    assert await r.exists(reg.keys.cap("a")) == 0  # an emptied set is gone
    a = await reg.get("a1")
    assert a is not None and a.capabilities == ["c", "d"]
    await assert_consistent(reg)


async def test_capability_names_are_normalised(reg: Registry) -> None:
    assert normalize_capability(" Text.Summarize ") == "text.summarize"
    assert normalize_capabilities(["B", " b ", "a.x_1", "A.X_1"]) == ["b", "a.x_1"]
    assert normalize_capabilities("Solo") == ["solo"]
    await register(reg, "a1", [" Text.Summarize ", "TEXT.SUMMARIZE", "Code_Review.Py3"])
    a = await reg.get("a1")
    assert a is not None and a.capabilities == ["text.summarize", "code_review.py3"]
    # queries normalise too
    assert await reg.agent_ids(" Text.Summarize") == ["a1"]
    assert [x.agent_id for x in await reg.agents("CODE_REVIEW.PY3")] == ["a1"]
    assert await reg.capabilities() == [("code_review.py3", 1), ("text.summarize", 1)]


@pytest.mark.parametrize(
    "bad", ["Bad Name", "a..b", "", "   ", "x-y", ".a", "a.", "a/b", "a,b", "caf\u00e9", "a:b"]
)
async def test_bad_capability_names_refused(reg: Registry, r: AnyRedis, bad: str) -> None:
    with pytest.raises(reach.InvalidCapability) as exc:
        await register(reg, "a1", ["ok", bad])
    assert isinstance(exc.value, ValueError)  # a ValueError-like error, as promised
    assert repr(bad) in str(exc.value)
    assert await reg.get("a1") is None  # nothing written
    assert await r.exists(reg.keys.agents, reg.keys.caps, reg.keys.events) == 0
    with pytest.raises(reach.InvalidCapability):
        await reg.agent_ids(bad)
    with pytest.raises(reach.InvalidCapability):
        await reg.agents(bad)


@pytest.mark.parametrize("bad", [None, 3, b"text"])
def test_non_string_capability_refused(bad: object) -> None:
    with pytest.raises(reach.InvalidCapability):
        normalize_capability(bad)  # type: ignore[arg-type]


async def test_no_capability_refused(reg: Registry) -> None:
    with pytest.raises(reach.InvalidCapability):
        await register(reg, "a1", [])


async def test_braces_in_agent_id_are_stripped_everywhere(reg: Registry, r: AnyRedis) -> None:
    """An id with hash-tag braces must name the same agent in ARGV and in key names."""
    code, inst, version = await register(reg, "{x}y", ["c"], lease_ms=LONG_LEASE_MS)
    assert code == 1
    a = await reg.get("{x}y")
    assert a is not None and a.agent_id == "xy"
    assert await reg.agent_ids("c") == ["xy"]
    assert await reg.heartbeat("{x}y", instance_id=inst, version=version) == (1, False)
    # the sweeper finds the hash through the id stored in the agents zset
    res = await reg.sweep()
    assert res.deleted == 0
    await assert_consistent(reg)
    assert await reg.deregister("{x}y") == 1
    assert await r.exists(reg.keys.agent("xy")) == 0


async def test_register_after_eviction_keeps_shadow_ttl_off(reg: Registry, r: AnyRedis) -> None:
    """Re-registering over an evicted shadow makes a plain (non-expiring) record again."""
    _, inst, version = await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=1)

    async def evicted() -> bool:
        res = await reg.sweep(shadow_ttl_ms=LONG_EVICT_MS)
        return "a1" in res.evicted

    await wait_until(evicted, what="eviction")
    assert await r.pttl(reg.keys.agent("a1")) > 0
    code, _, _ = await register(reg, "a1", ["c"], instance_id=inst, version=version)
    assert code == 2
    assert await r.pttl(reg.keys.agent("a1")) == -1
    assert await reg.agent_ids("c") == ["a1"]
    await assert_consistent(reg)


async def test_a_drain_outlives_an_eviction_of_the_same_instance(reg: Registry) -> None:
    """An operator drains an agent, which is evicted before a heartbeat tells it: the same
    process registering again is still draining; a new process (another instance) is not."""
    _, inst, version = await register(reg, "a1", ["c"], lease_ms=1, evict_after_ms=1)
    assert await reg.drain("a1") == 1

    async def evicted() -> bool:
        res = await reg.sweep(shadow_ttl_ms=LONG_EVICT_MS)
        return "a1" in res.evicted

    await wait_until(evicted, what="eviction")
    code, _, _ = await register(reg, "a1", ["c"], instance_id=inst, version=version)
    assert code == 2
    a = await reg.get("a1")
    assert a is not None and a.draining and a.state == "active"
    code, _, _ = await register(reg, "a1", ["c"])  # a new process: starts afresh
    a = await reg.get("a1")
    assert a is not None and not a.draining
    await assert_consistent(reg)


async def test_query_by_capability_state_ready_and_metadata(reg: Registry) -> None:
    _, i1, _ = await register(reg, "eu1", ["text.summarize"], metadata={"region": "eu", "gpu": 1})
    _, i2, _ = await register(
        reg, "eu2", ["text.summarize", "code.review"], metadata={"region": "eu", "env": "prod"}
    )
    await register(reg, "us1", ["text.summarize"], metadata={"region": "us", "env": "prod"})
    await register(reg, "gone", ["text.summarize"], lease_ms=1, evict_after_ms=1)
    await register(reg, "slow", ["code.review"], lease_ms=1, evict_after_ms=LONG_EVICT_MS)
    await reg.mark_ready("eu1", instance_id=i1)
    await reg.mark_ready("eu2", instance_id=i2)

    async def settled() -> bool:
        await reg.sweep(shadow_ttl_ms=LONG_EVICT_MS)
        states = {a.agent_id: a.state for a in await reg.agents()}
        return states.get("gone") == "evicted" and states.get("slow") == "probation"

    await wait_until(settled, what="eviction and probation")

    async def ids(*args: object, **kw: object) -> list[str]:
        return sorted(a.agent_id for a in await reg.agents(*args, **kw))  # type: ignore[arg-type]

    # by capability: live agents only (evicted left the sets)
    assert await ids("text.summarize") == ["eu1", "eu2", "us1"]
    assert await ids("code.review") == ["eu2", "slow"]
    assert await ids("nobody.does_this") == []
    # every known agent, shadows included, without a capability
    assert await ids() == ["eu1", "eu2", "gone", "slow", "us1"]
    assert await reg.agent_ids() == ["eu1", "eu2", "gone", "slow", "us1"]
    # by state
    assert await ids(state="evicted") == ["gone"]
    assert await ids("code.review", state="probation") == ["slow"]
    assert await ids("code.review", state="active") == ["eu2"]
    assert await ids("text.summarize", state="evicted") == []
    # by readiness
    assert await ids("text.summarize", ready=True) == ["eu1", "eu2"]
    assert await ids("text.summarize", ready=False) == ["us1"]
    # by metadata (values compared as strings; a missing key never matches)
    assert await ids("text.summarize", where={"region": "eu"}) == ["eu1", "eu2"]
    assert await ids("text.summarize", where={"region": "eu", "env": "prod"}) == ["eu2"]
    assert await ids("text.summarize", where={"gpu": 1}) == ["eu1"]
    assert await ids("text.summarize", where={"gpu": "1"}) == ["eu1"]
    assert await ids("text.summarize", where={"env": None}) == []
    assert await ids("text.summarize", where={"env": "None"}) == []
    assert await ids("text.summarize", where={"region": "ap"}) == []
    assert await ids("text.summarize", where={}) == ["eu1", "eu2", "us1"]
    # all filters together
    assert await ids("text.summarize", state="active", ready=True, where={"region": "eu"}) == [
        "eu1",
        "eu2",
    ]
    # routable = active, ready, not draining
    await reg.drain("eu2")
    assert sorted(a.agent_id for a in await reg.agents("text.summarize") if a.routable) == ["eu1"]
    with pytest.raises(reach.ConfigError, match="Unknown state"):
        await reg.agents(state="dead")
    assert await reg.capabilities() == [("code.review", 2), ("text.summarize", 3)]


@pytest.mark.parametrize("bad", ["", "{}", "  "])
async def test_empty_agent_id_refused(reg: Registry, r: AnyRedis, bad: str) -> None:
    with pytest.raises(reach.ConfigError, match="agent_id"):
        await register(reg, bad, ["c"])
    assert await r.exists(reg.keys.agents, reg.keys.caps) == 0


# -- arguments out of contract: refused before the first write (issue 9, item 10) -----------

_ARGV = {  # ARGV index -> (name in the error, bad values)
    0: ("agent_id", ["", " ", "x" * 257, "a{b}", b"\xff", b"a\xed\xa0\x80"]),
    1: ("instance_id", ["", "i" * 257, b"\xc0\x80"]),
    2: ("version", ["abc", "", "nan", "inf", "1e309", "-1", "1.5", "0x10", "9" * 17, str(2**53)]),
    3: (
        "weight",
        ["abc", "", "nan", "inf", "-inf", "1e309", "0", "-1", "1001", "0x10", " 1", "1" * 40],
    ),
    4: ("capabilit", ["", "a,,b", "Bad", "a,a", "x" * 201, ",a", "a.", "caf\u00e9"]),
    5: (
        "metadata",
        [
            "not json",
            "",
            "[]",
            "1",
            '{"a":nan}',
            '{"a":0x10}',
            '{"a":01}',
            '{"a":1.}',
            '{"a":+1}',
            "{",
            '{"a":1} x',
            "[" * 70 + "]" * 70,
            '{"a":' + "[" * 70 + "]" * 70 + "}",
            b'{"a":"\xff"}',
            "{" + " " * 65536 + "}",
        ],
    ),
    6: (
        "lease_ms",
        [
            "",
            "abc",
            "nan",
            "inf",
            "1e309",
            "0",
            "-1",
            "86400001",
            "1e3",
            "1.0",
            str(32 * 365 * 86_400_000),
        ],
    ),
    7: ("evict_after_ms", ["", "abc", "nan", "0", "86400001", "1e3"]),
    8: ("events maxlen", ["", "0", "abc", "-5", "10000001", "007"]),
    9: ("card", ["not json", "[1]", '{"a":inf}']),
    10: ("ready", ["", "2", "yes", "true"]),
    11: ("max_queue", ["", "-1", "abc", "nan", "1e309", "1000000001", "2.5"]),
    12: ("slots", ["", "-1", "abc", "nan", "1000000001", "2.5"]),
    13: ("protocol", ["", "0", "-1", "abc", "1.0", "01", "1000001", "nan"]),
}
_BAD_ARGV = [(i, name, v) for i, (name, values) in _ARGV.items() for v in values]


async def _namespace_keys(reg: Registry) -> list[bytes]:
    return [k async for k in reg.redis.scan_iter(match=f"reach:{{{reg.keys.namespace}}}*")]


def _good_args(reg: Registry, agent_id: str = "a1") -> tuple[list[str], list[object]]:
    """The KEYS and ARGV the typed call encodes, to be spoiled one at a time."""
    c = reg.register_call(
        agent_id,
        instance_id="inst-1",
        version=new_version(),
        capabilities=["c", "d.e"],
        metadata={"region": "eu"},
        lease_ms=LONG_LEASE_MS,
        evict_after_ms=LONG_EVICT_MS,
        card={"name": "A1"},
    )
    return list(c.keys), list(c.args)


@pytest.mark.parametrize(("index", "name", "value"), _BAD_ARGV)
async def test_bad_argument_is_refused_and_nothing_is_written(
    reg: Registry, index: int, name: str, value: str | bytes
) -> None:
    keys, args = _good_args(reg)
    args[index] = value
    if index == 0:  # the hash key follows the id, as it must
        keys[1] = reg.keys.agent_prefix.encode() + (
            value if isinstance(value, bytes) else value.encode()
        )  # type: ignore[assignment]
    with pytest.raises(redis.ResponseError, match=f"^reach: bad {name}"):
        await scripts.call(reg.redis, "register", keys, args)
    assert await _namespace_keys(reg) == []


@pytest.mark.parametrize("shape", ["argv-1", "argv+1", "keys-1", "hash-of-another-id"])
async def test_wrong_shape_is_refused(reg: Registry, shape: str) -> None:
    keys, args = _good_args(reg)
    if shape == "argv-1":  # 11: the 12-ARGV form (no slots, no protocol) is taken, one less is not
        args = args[:-3]
    elif shape == "argv+1":
        args = [*args, "x"]
    elif shape == "keys-1":
        keys = keys[:-1]
    else:
        keys[1] = reg.keys.agent("someone-else")
    with pytest.raises(redis.ResponseError, match="^reach: bad (arguments|agent_id)"):
        await scripts.call(reg.redis, "register", keys, args)
    assert await _namespace_keys(reg) == []


async def test_good_arguments_at_the_limits_are_taken(reg: Registry) -> None:
    keys, args = _good_args(reg, "a" * 256)
    args[3] = "1000"
    args[5] = (
        '{"n":-0.5e+3,"t":true,"f":false,"z":null,"s":"a\\"b\\\\","u":"\\u00e9\xe9",'
        '"l":[1,{"x":[]}]}'
    )
    args[6] = args[7] = "86400000"
    args[11] = "1000000000"
    assert (await scripts.call(reg.redis, "register", keys, args))[0] == 1
    a = await reg.get("a" * 256)
    assert a is not None and (a.weight, a.lease_ms, a.max_queue) == (1000.0, 86_400_000, 10**9)
    assert a.metadata["s"] == 'a"b\\' and a.metadata["u"] == "\u00e9\u00e9"
    await assert_consistent(reg)


@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"weight": float("nan")}, "weight"),
        ({"weight": float("inf")}, "weight"),
        ({"weight": 0}, "weight"),
        ({"weight": -1}, "weight"),
        ({"weight": 1001}, "weight"),
        ({"weight": "2"}, "weight"),
        ({"lease_ms": 0}, "lease_ms"),
        ({"lease_ms": 2 * 86_400_000}, "lease_ms"),
        ({"lease_ms": 1.5}, "lease_ms"),
        ({"evict_after_ms": -1}, "evict_after_ms"),
        ({"version": -1}, "version"),
        ({"version": 2**63}, "version"),
        ({"max_queue": -1}, "max_queue"),
        ({"max_queue": True}, "max_queue"),
        ({"metadata": {"x": float("nan")}}, "metadata"),
        ({"metadata": {"x": "y" * 70_000}}, "metadata"),
        ({"card": {"x": float("inf")}}, "card"),
        ({"instance_id": "i" * 257}, "instance_id"),
        ({"instance_id": "\udcff"}, "instance_id"),
    ],
)
async def test_registry_refuses_out_of_range_arguments(
    reg: Registry, kw: dict[str, object], what: str
) -> None:
    with pytest.raises(reach.ConfigError, match=what):
        await register(reg, "a1", ["c"], **kw)  # type: ignore[arg-type]
    assert await _namespace_keys(reg) == []


@pytest.mark.parametrize("bad", ["x" * 257, "\udcff"])
async def test_registry_refuses_bad_agent_ids(reg: Registry, bad: str) -> None:
    with pytest.raises(reach.ConfigError, match="agent_id"):
        await register(reg, bad, ["c"])


async def test_registry_refuses_long_capability_names(reg: Registry) -> None:
    with pytest.raises(reach.InvalidCapability, match="200"):
        await register(reg, "a1", ["x" * 201])


async def test_script_refusal_becomes_a_config_error(reg: Registry) -> None:
    good = reg.register_call(
        "a1",
        instance_id="i1",
        version=new_version(),
        capabilities=["c"],
        lease_ms=1,
        evict_after_ms=1,
    )
    bad = dataclasses.replace(good, args=(*good.args[:6], "nan", *good.args[7:]))
    with pytest.raises(reach.ConfigError, match=r"register\.lua refused.*lease_ms") as exc:
        await reg._run(bad)
    assert isinstance(exc.value.__cause__, redis.ResponseError)
    assert await _namespace_keys(reg) == []


async def test_unreadable_stored_version_is_replaced(reg: Registry, r: AnyRedis) -> None:
    """A record written behind the scripts' back (version not a number) cannot fence a
    registration: registering replaces it instead of failing for ever."""
    await r.hset(reg.keys.agent("a1"), mapping={"version": "abc", "caps": "old", "junk": "x"})
    await r.sadd(reg.keys.cap("old"), "a1")
    code, _, _ = await register(reg, "a1", ["c"])
    assert code == 2
    a = await reg.get("a1")
    assert a is not None and a.capabilities == ["c"]
    assert await r.hget(reg.keys.agent("a1"), "junk") is None
    await assert_consistent(reg)


@pytest.mark.parametrize("which", ["agents", "events", "caps", "hash", "cap set"])
async def test_key_of_another_type_is_refused_before_any_write(
    reg: Registry, r: AnyRedis, which: str
) -> None:
    """A registry key holding another type (written behind the scripts' back) used to fail
    a command half-way through, leaving a half-written registration."""
    k = reg.keys
    key = {
        "agents": k.agents,
        "events": k.events,
        "caps": k.caps,
        "hash": k.agent("a1"),
        "cap set": k.cap("d.e"),
    }[which]
    await r.set(key, "x")
    with pytest.raises(reach.ConfigError, match="holds a string"):
        await reg.register(
            "a1",
            instance_id="i",
            version=new_version(),
            capabilities=["c", "d.e"],
            lease_ms=LONG_LEASE_MS,
            evict_after_ms=LONG_EVICT_MS,
        )
    assert await _namespace_keys(reg) == [key.encode()]


async def test_the_record_states_the_protocol_version(reg: Registry, r: AnyRedis) -> None:
    from reach._version import PROTOCOL_VERSION

    await register(reg, "a1")
    assert await r.hget(reg.keys.agent("a1"), "protocol") == str(PROTOCOL_VERSION).encode()
    a = await reg.get("a1")
    assert a is not None and a.protocol == PROTOCOL_VERSION == 2


async def test_the_form_without_protocol_is_taken_and_states_none(
    reg: Registry, r: AnyRedis
) -> None:
    # a runtime from before protocol versions sends 12 ARGV: registered, no field
    keys, args = _good_args(reg)
    assert len(args) == 14
    assert (await scripts.call(reg.redis, "register", keys, args[:13]))[0] == 1
    assert await r.hget(reg.keys.agent("a1"), "protocol") is None
    a = await reg.get("a1")
    assert a is not None and a.protocol == 0


async def test_replacing_another_instance_names_it_and_writes_a_replaced_event(
    reg: Registry,
) -> None:
    kw = {"capabilities": ["x.y"], "lease_ms": 60_000, "evict_after_ms": 120_000}
    v1 = new_version()
    first = await reg.register_detail("rp", instance_id="i1", version=v1, host="h1", pid=41, **kw)
    assert first.code == 1 and not first.replaced_instance
    again = await reg.register_detail("rp", instance_id="i1", version=v1, host="h1", pid=41, **kw)
    assert again.code == 2 and not again.replaced_instance  # itself: no replacement
    got = await reg.register_detail(
        "rp", instance_id="i2", version=new_version(), host="h2", pid=42, **kw
    )
    assert (got.code, got.replaced_instance, got.replaced_host, got.replaced_pid) == (
        2,
        "i1",
        "h1",
        "41",
    )
    assert got.replaced_live  # its lease still ran
    raw = await reg.redis.hmget(reg.keys.agent("rp"), "host", "pid")
    assert raw == [b"h2", b"42"]
    events = [e for e in await reg.recent_events(20) if e.agent_id == "rp"]
    kinds = [(e.type, e.instance_id) for e in events]
    assert kinds == [
        ("registered", "i1"),
        ("registered", "i1"),
        ("replaced", "i1"),
        ("registered", "i2"),
    ]
    assert events[2].detail == "host=h1 pid=41 live=1 by=i2"
    # A registration without host and pid (an older runtime's) is replaced all the same.
    await reg.register("rq", instance_id="j1", version=new_version(), **kw)
    got = await reg.register_detail("rq", instance_id="j2", version=new_version(), **kw)
    assert (got.replaced_instance, got.replaced_host, got.replaced_pid) == ("j1", "", "")


async def test_the_application_version_is_stored_and_read(reg: Registry, r: AnyRedis) -> None:
    # with host and pid (what a runtime sends), and without them (filled in as '' and 0)
    await register(reg, "a1", app_version="1.5", host="h", pid=7)
    await register(reg, "a2", app_version="2024-06-01+b.3")
    assert await r.hget(reg.keys.agent("a1"), "app_version") == b"1.5"
    assert await r.hget(reg.keys.agent("a1"), "host") == b"h"
    a1, a2 = await reg.get("a1"), await reg.get("a2")
    assert a1 is not None and a1.app_version == "1.5"
    assert a2 is not None and a2.app_version == "2024-06-01+b.3"
    # a re-registration without a version leaves none behind
    await register(reg, "a1")
    assert await r.hget(reg.keys.agent("a1"), "app_version") is None
    a1 = await reg.get("a1")
    assert a1 is not None and a1.app_version == ""


async def test_an_old_record_without_a_version_is_read_as_version_none(
    reg: Registry, r: AnyRedis
) -> None:
    """A record written before app_version (the 16-ARGV form, or HDEL of the field) reads
    as version ''; a garbled one is left out like any unreadable record."""
    keys, args = _good_args(reg)
    args += ["host", 1]
    assert len(args) == 16
    assert (await scripts.call(reg.redis, "register", keys, args))[0] == 1
    assert await r.hget(reg.keys.agent("a1"), "app_version") is None
    a = await reg.get("a1")
    assert a is not None and a.app_version == ""
    await r.hset(reg.keys.agent("a1"), "app_version", "1 5")
    assert [x.agent_id for x in await reg.agents()] == []


@pytest.mark.parametrize("bad", ["1 5", "1=5", "a,b", "x" * 65, "é"])
async def test_a_bad_application_version_is_refused(reg: Registry, bad: str) -> None:
    keys, args = _good_args(reg)
    args += ["host", 1, bad]
    with pytest.raises(redis.ResponseError, match="^reach: bad app_version"):
        await scripts.call(reg.redis, "register", keys, args)
    assert await reg.get("a1") is None
    with pytest.raises(reach.ConfigError):
        await register(reg, "a1", app_version=bad)

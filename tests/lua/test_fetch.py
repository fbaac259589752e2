"""fetch.lua: high first, with slots kept for normal and low so a flood of high never starves them."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from reach import scripts
from reach.connection import AnyRedis
from reach.keys import GROUP, Keys
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

AGENT = "w-1"


async def _inboxes(r: AnyRedis, ns: str, high: int, normal: int, low: int) -> list[str]:
    keys = Keys(ns).inboxes(AGENT)
    for key, count in zip(keys, (high, normal, low), strict=True):
        await r.xgroup_create(key, GROUP, id="0", mkstream=True)
        for i in range(count):
            await r.xadd(key, {"e": f"{key.rsplit(':', 1)[1]}-{i}"})
    return keys


def _counts(res: list[object]) -> list[int]:
    return [len(res[0]), len(res[1]), len(res[2])]  # type: ignore[arg-type]


async def test_high_first_then_normal_then_low(r: AnyRedis, ns: str) -> None:
    keys = await _inboxes(r, ns, high=3, normal=3, low=3)
    res = await scripts.call(r, "fetch", keys, [GROUP, AGENT, 5, 0, 0])
    assert _counts(res) == [3, 2, 0]
    assert [fields for _, fields in res[0]] == [
        [b"e", b"high-0"],
        [b"e", b"high-1"],
        [b"e", b"high-2"],
    ]
    # Low has unread entries and got nothing: it is reported as passed over.
    assert res[3:] == [0, 1]


async def test_kept_slots_serve_normal_and_low_under_a_flood_of_high(r: AnyRedis, ns: str) -> None:
    keys = await _inboxes(r, ns, high=100, normal=10, low=10)
    res = await scripts.call(r, "fetch", keys, [GROUP, AGENT, 10, 2, 1])
    assert _counts(res) == [7, 2, 1]
    assert res[3:] == [0, 0]


async def test_unused_kept_slots_go_back_to_high(r: AnyRedis, ns: str) -> None:
    keys = await _inboxes(r, ns, high=20, normal=0, low=0)
    res = await scripts.call(r, "fetch", keys, [GROUP, AGENT, 10, 2, 1])
    assert _counts(res) == [10, 0, 0]
    assert res[3:] == [0, 0]  # nothing waits in normal or low


async def test_a_priority_read_to_its_end_is_not_waiting_one_passed_over_is(
    r: AnyRedis, ns: str
) -> None:
    keys = await _inboxes(r, ns, high=8, normal=3, low=0)
    res = await scripts.call(r, "fetch", keys, [GROUP, AGENT, 5, 0, 0])
    assert _counts(res) == [5, 0, 0]
    assert res[3:] == [1, 0]  # normal passed over with 3 unread; low has none
    # Every stream read short of its count: none is read twice, none is waiting.
    res = await scripts.call(r, "fetch", keys, [GROUP, AGENT, 10, 0, 0])
    assert _counts(res) == [3, 3, 0]
    assert res[3:] == [0, 0]


async def test_entries_become_pending_for_the_agent_and_are_not_read_twice(
    r: AnyRedis, ns: str
) -> None:
    keys = await _inboxes(r, ns, high=0, normal=2, low=0)
    first = await scripts.call(r, "fetch", keys, [GROUP, AGENT, 10, 0, 0])
    assert _counts(first) == [0, 2, 0]
    pending = await r.xpending_range(keys[1], GROUP, min="-", max="+", count=10)
    assert [p["consumer"] for p in pending] == [AGENT.encode()] * 2
    again = await scripts.call(r, "fetch", keys, [GROUP, AGENT, 10, 0, 0])
    assert _counts(again) == [0, 0, 0] and again[3:] == [0, 0]


async def test_a_missing_group_is_a_nogroup_error(r: AnyRedis, ns: str) -> None:
    # The runtime recreates the groups on NOGROUP (after a Redis restart that lost them).
    keys = Keys(ns).inboxes(AGENT)
    await r.xadd(keys[0], {"e": "x"})
    with pytest.raises(rexc.ResponseError, match="NOGROUP"):
        await scripts.call(r, "fetch", keys, [GROUP, AGENT, 10, 0, 0])


def _bad_calls() -> list[tuple[str, int | None, object]]:
    # (what the error names, ARGV index (0-based) to replace, value); None: see the test
    calls: list[tuple[str, int | None, object]] = [("group", 0, ""), ("consumer", 1, "")]
    calls += [
        ("n", 2, v)
        for v in ["0", "", "abc", "nan", "inf", "1e309", "-1", "1.5", "007", "10001", str(10**16)]
    ]
    calls += [("slots kept for normal", 3, v) for v in ["x", "-1", "11", "", "1e1"]]
    calls += [("slots kept for low", 4, v) for v in ["x", "-1", "11", "nan"]]
    calls += [("arguments", None, "drop"), ("arguments", None, "extra"), ("arguments", None, "key")]
    return calls


@pytest.mark.parametrize(("what", "at", "value"), _bad_calls())
async def test_bad_arguments_are_refused_before_any_read(
    r: AnyRedis, ns: str, what: str, at: int | None, value: object
) -> None:
    keys = await _inboxes(r, ns, high=3, normal=3, low=3)
    args: list[object] = [GROUP, AGENT, 10, 1, 1]
    call_keys = list(keys)
    if at is not None:
        args[at] = value
    elif value == "drop":
        args = args[:-1]
    elif value == "extra":
        args = [*args, 1]
    else:
        call_keys = [*keys, keys[0]]
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=f"^reach: bad {what}"):
        await scripts.call(r, "fetch", call_keys, args)
    # Nothing was read: no entry moved into the pending list, no consumer created.
    assert_unchanged(before, await snapshot(r, ns))


async def test_a_missing_group_on_a_lower_priority_reads_nothing(r: AnyRedis, ns: str) -> None:
    keys = await _inboxes(r, ns, high=3, normal=3, low=0)
    await r.xgroup_destroy(keys[2], GROUP)
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match="NOGROUP"):
        await scripts.call(r, "fetch", keys, [GROUP, AGENT, 10, 0, 0])
    assert_unchanged(before, await snapshot(r, ns))  # high's entries are not left pending


async def test_a_key_that_is_not_a_stream_is_refused_before_any_read(r: AnyRedis, ns: str) -> None:
    keys = await _inboxes(r, ns, high=3, normal=0, low=0)
    await r.delete(keys[1])
    await r.set(keys[1], "x")
    before = await snapshot(r, ns)
    with pytest.raises(rexc.ResponseError, match=r"^reach: bad KEYS\[2\]: not a stream"):
        await scripts.call(r, "fetch", keys, [GROUP, AGENT, 10, 0, 0])
    assert_unchanged(before, await snapshot(r, ns))


async def test_kept_slots_larger_than_n_are_taken_as_they_come(r: AnyRedis, ns: str) -> None:
    # The runtime keeps one slot each for normal and low even when it asks for one entry
    # (a small batch whose lower priorities were passed over): high gets nothing then.
    keys = await _inboxes(r, ns, high=2, normal=2, low=2)
    res = await scripts.call(r, "fetch", keys, [GROUP, AGENT, 1, 1, 1])
    assert _counts(res) == [0, 0, 1]

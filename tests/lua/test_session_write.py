"""session_write.lua and session_read.lua: a batch of session writes applied in order in
one step, the TTL renewed, the version raised and announced; a read with its version;
anything out of contract refused before any write."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from redis.exceptions import ResponseError

from reach import scripts
from reach.connection import AnyRedis, connect
from reach.keys import Keys
from reach.scripts.sessions import read_history_call, read_values_call, write_call
from tests.lua.snapshot import assert_unchanged, snapshot

pytestmark = pytest.mark.anyio

TTL_MS = 60_000


async def test_a_batch_is_applied_in_order_versioned_and_announced(
    r: AnyRedis, redis_url: str, ns: str
) -> None:
    keys = Keys(ns)
    sub = await connect(redis_url)
    ps: Any = sub.pubsub()
    await ps.subscribe(keys.session_changes)
    try:
        assert await read_values_call(keys, "s").run(r) == (0, {})
        ops = ["S", "a", "1", "S", "b", "2", "D", "a", "A", "x", "0", "A", "y", "0", "A", "z", "2"]
        assert await write_call(keys, "s", ops, ttl_ms=TTL_MS).run(r) == (1, 2)
        assert await read_values_call(keys, "s").run(r) == (1, {b"b": b"2"})
        assert await read_history_call(keys, "s").run(r) == (1, [b"y", b"z"])
        assert await write_call(keys, "s", ["C", "S", "c", "3"], ttl_ms=TTL_MS).run(r) == (2, 0)
        assert await read_values_call(keys, "s").run(r) == (2, {b"c": b"3"})
        assert await write_call(keys, "s", [], ttl_ms=TTL_MS, announce=False).run(r) == (3, 0)
        heard = []
        with anyio.fail_after(10):
            while len(heard) < 2:
                m = await ps.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if m is not None:
                    heard.append(m["data"])
        assert heard == [b"1:s", b"2:s"]  # the third asked for no announcement
    finally:
        await ps.aclose()
        await sub.aclose()
    for key in (keys.session("s"), keys.session_version("s")):
        assert 0 < await r.pttl(key) <= TTL_MS


@pytest.mark.parametrize(
    ("ops", "why"),
    [
        (["X"], "op"),
        (["S", "a"], "arguments are missing"),
        (["A", "x", "-1"], "max_len"),
        (["A", "x", "01"], "max_len"),
        (["S", "a", "1", "A", "x"], "arguments are missing"),
    ],
)
async def test_a_bad_batch_writes_nothing(r: AnyRedis, ns: str, ops: list[str], why: str) -> None:
    keys = Keys(ns)
    await write_call(keys, "s", ["S", "k", "v"], ttl_ms=TTL_MS).run(r)
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match=f"reach: bad .*{why}"):
        await write_call(keys, "s", ops, ttl_ms=TTL_MS).run(r)
    assert_unchanged(before, await snapshot(r, ns))


async def test_keys_of_another_type_and_bad_arguments_are_refused(r: AnyRedis, ns: str) -> None:
    keys = Keys(ns)
    await r.set(keys.session_history("s"), "not a list")
    before = await snapshot(r, ns)
    with pytest.raises(ResponseError, match="KEYS\\[2\\]: holds a string, want a list"):
        await write_call(keys, "s", ["S", "k", "v"], ttl_ms=TTL_MS).run(r)
    with pytest.raises(ResponseError, match="ttl_ms"):
        await write_call(keys, "s", ["S", "k", "v"], ttl_ms=0).run(r)
    with pytest.raises(ResponseError, match="what"):
        await scripts.call(r, "session_read", [keys.session("s"), "h", "v"], ["all"])
    assert_unchanged(before, await snapshot(r, ns))

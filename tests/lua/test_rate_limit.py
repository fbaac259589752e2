"""rate_limit.lua: GCRA over one number kept in Redis. A full bucket grants ``burst``
starts at once, then one per interval; concurrent takers share the limit exactly."""

from __future__ import annotations

import time

import pytest
from redis.exceptions import ResponseError

from reach import limits, scripts
from reach.connection import AnyRedis
from reach.errors import ConfigError
from reach.keys import Keys

pytestmark = pytest.mark.anyio


async def take(r: AnyRedis, key: str, n: int, interval_us: int, burst: int) -> tuple[int, int]:
    granted, wait = await scripts.call(r, "rate_limit", [key], [n, interval_us, burst])
    return int(granted), int(wait)


async def test_a_full_bucket_grants_the_burst_then_asks_to_wait(r: AnyRedis, ns: str) -> None:
    key = Keys(ns).rate_state("cap")
    # 1 start / 10 s, burst 3: three now, then nothing for about 10 s
    granted, wait = await take(r, key, 5, 10_000_000, 3)
    assert granted == 3 and 9_000_000 < wait <= 10_000_000
    granted, wait2 = await take(r, key, 1, 10_000_000, 3)
    assert granted == 0 and 0 < wait2 <= wait
    # the state lives until the bucket is full again, no longer
    assert 20_000 < await r.pttl(key) <= 30_000


async def test_starts_come_back_one_interval_at_a_time(r: AnyRedis, ns: str) -> None:
    key = Keys(ns).rate_state("cap")
    assert await take(r, key, 1, 20_000, 1) == (1, 20_000)  # 50/s, evenly spaced
    granted, wait = await take(r, key, 1, 20_000, 1)
    assert granted == 0 and 0 < wait <= 20_000
    # In 0.3 s at 50/s: about 15 starts, never more than time allows (+ the first).
    t0, got = time.monotonic(), 0
    while time.monotonic() - t0 < 0.3:
        got += (await take(r, key, 1, 20_000, 1))[0]
    elapsed = time.monotonic() - t0
    assert got <= elapsed / 0.02 + 2
    assert got >= 10


async def test_a_garbled_state_counts_as_a_full_bucket(r: AnyRedis, ns: str) -> None:
    key = Keys(ns).rate_state("cap")
    await r.set(key, "soon")
    assert (await take(r, key, 2, 1_000_000, 2))[0] == 2


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([-1, 1000, 1], r"n \(ARGV\[1\]\) -1"),
        ([100_001, 1000, 1], r"n \(ARGV\[1\]\) 100001"),
        ([1, 0, 1], r"interval_us \(ARGV\[2\]\) 0"),
        ([1, 1000, 0], r"burst \(ARGV\[3\]\) 0"),
        ([1, "1e3", 1], r"interval_us"),
        ([1, 1000], r"want 1 KEYS and 3 ARGV"),
    ],
)
async def test_bad_arguments_are_refused_and_take_nothing(
    r: AnyRedis, ns: str, args: list[object], why: str
) -> None:
    key = Keys(ns).rate_state("cap")
    with pytest.raises(ResponseError, match=why):
        await scripts.call(r, "rate_limit", [key], args)
    assert await r.exists(key) == 0


async def test_a_state_key_of_another_type_is_refused(r: AnyRedis, ns: str) -> None:
    key = Keys(ns).rate_state("cap")
    await r.hset(key, "x", "1")
    with pytest.raises(ResponseError, match=r"KEYS\[1\]: holds a hash, want a string"):
        await take(r, key, 1, 1000, 1)


async def test_the_typed_call_and_the_limit_text(r: AnyRedis, ns: str) -> None:
    k = Keys(ns)
    lim = limits.parse_limit("600/m", burst=2)
    assert (lim.per_second, lim.burst, lim.interval_us) == (10.0, 2, 100_000)
    assert limits.parse_limit(lim.stored()) == lim
    assert limits.parse_limit("3/10s").interval_us == 3_333_333
    taken = await limits.take_call(k, "cap", lim, 5).run(r)
    assert taken.granted == 2 and 0 < taken.wait_us <= 100_000
    for bad in ("fast", "0/s", "5/0s", "-1/s", "1/day"):
        with pytest.raises(ConfigError, match="rate limit"):
            limits.parse_limit(bad)
    await limits.set_limit(r, k, " Cap ", lim)
    assert await limits.get_limits(r, k) == {"cap": lim}
    await r.hset(k.limits, "broken", "nonsense")  # written behind reach's back: skipped
    assert await limits.get_limits(r, k) == {"cap": lim}
    await limits.set_limit(r, k, "cap", None)
    assert "cap" not in await limits.get_limits(r, k)


async def test_a_peek_takes_nothing_and_answers_the_wait(r: AnyRedis, ns: str) -> None:
    key = Keys(ns).rate_state("cap")
    assert await take(r, key, 0, 1_000_000, 1) == (0, 0)  # a full bucket: a start fits
    assert await r.exists(key) == 0  # and nothing was written
    assert (await take(r, key, 1, 1_000_000, 1))[0] == 1
    state = await r.get(key)
    granted, wait = await take(r, key, 0, 1_000_000, 1)
    assert granted == 0 and 900_000 < wait <= 1_000_000
    assert await r.get(key) == state  # a peek never moves the state

"""Fuzz what the sweeper reads: the delayed set, the parked streams and the set listing
them, and the reroute set with the inbox of an evicted agent. Whatever is there, the
workers holding the sweeper lock stay up and serving, and every entry is either consumed
(routed, expired or dead-lettered with its reason) or is a valid message legitimately
waiting for an agent of its capability.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from reach.envelope import CAPABILITY_PATTERN, BadEnvelope, decode_envelope, now_ms
from reach.keys import Keys
from tests.fuzz.live import assert_serving, poll, start_ready
from tests.fuzz.strategies import hostile_entries
from tests.support.workers import Workers

SERVED = {"hard.echo", "hard.fail", "hard.slow"}
LIVE = {"h1", "h2"}
CAPABILITY = re.compile(CAPABILITY_PATTERN.encode())
CAPS = st.sampled_from(["hard.echo", "hard.fail", "fuzz.unknown"])
_ghosts = itertools.count()


@pytest.fixture(scope="module")
def live(redis_server):  # type: ignore[no-untyped-def]
    ns = "fuzzsweep"
    w = Workers(redis_server.url, ns, "tests.support.agents_hardening")
    start_ready(w, redis_server.url, ns, "h1", "h2")
    r = redis.Redis.from_url(redis_server.url)
    yield w, redis_server.url, ns, r
    r.close()
    w.stop_all()


def waits_legitimately(data: bytes) -> bool:
    """A valid, unexpired message that no live agent can take now may wait: its
    capability has no agent, or it names a target agent that is not there."""
    try:
        env = decode_envelope(data)
    except BadEnvelope:
        return False
    unexpired = not env.deadline_ms or env.deadline_ms > now_ms() + 1000
    no_agent = env.capability not in SERVED or (env.target and env.target not in LIVE)
    return bool(no_agent and unexpired)


def members(r: redis.Redis, key: str) -> set[Any]:
    return set(r.smembers(key))  # type: ignore[arg-type]


@given(
    delayed=st.lists(hostile_entries(), max_size=4),
    parked=st.lists(st.tuples(CAPS, hostile_entries()), max_size=4),
    ghost_inbox=st.lists(hostile_entries(), max_size=4),
    junk_members=st.lists(st.binary(min_size=1, max_size=12), max_size=2),
)
def test_any_sweeper_input_is_consumed_and_workers_serve(
    live: tuple[Workers, str, str, redis.Redis],
    delayed: list[bytes],
    parked: list[tuple[str, bytes]],
    ghost_inbox: list[bytes],
    junk_members: list[bytes],
) -> None:
    workers, url, ns, r = live
    keys = Keys(ns)
    past = now_ms() - 1
    for data in delayed:
        r.zadd(keys.delayed, {data: past})
    for cap, data in parked:
        r.xadd(keys.parked(cap), {"e": data})
        r.sadd(keys.parked_caps, cap)
    ghost = f"ghost-{next(_ghosts)}"
    for data in ghost_inbox:
        r.xadd(keys.inbox(ghost, "normal"), {"e": data})
    r.sadd(keys.reroute, ghost, *junk_members)
    if junk_members:
        r.sadd(keys.parked_caps, *junk_members)

    def leftovers() -> list[str]:
        """What the sweeper has not consumed (and may not keep waiting)."""
        left = [
            f"delayed {d[:60]!r}"
            for d in r.zrange(keys.delayed, 0, -1)
            if not waits_legitimately(d)
        ]
        left += [f"reroute member {m!r}" for m in members(r, keys.reroute)]
        left += [f"inbox {k}" for k in keys.inboxes(ghost) if r.exists(k)]
        for cap in members(r, keys.parked_caps):
            if not CAPABILITY.fullmatch(cap):
                left.append(f"parked member {cap!r}")  # junk: the sweeper removes it
                continue
            rows = r.xrange(keys.parked(cap.decode()))
            left += [
                f"parked {cap!r} {f.get(b'e', b'')[:60]!r}"
                for _, f in rows
                if not waits_legitimately(f.get(b"e", b""))
            ]
        return left

    try:
        poll(lambda: not leftovers(), what="sweeper inputs consumed")
    except AssertionError as e:
        raise AssertionError(f"{e}; left: {leftovers()}") from None
    assert_serving(workers, url, ns, "h1", "h2")

"""Fuzz a live worker's inbox: whatever bytes land in it, the worker stays up and serving,
and every entry ends settled (handled, retried or dead-lettered), none left pending.

Entries are arbitrary bytes, arbitrary msgpack values, deeply nested values and valid
envelopes with one field broken (wrong type, huge or negative number, unknown policy or
priority, long string...), written with XADD straight into the inbox streams, on every
priority, together with entries that are no map at all or have no ``e`` field.
"""

from __future__ import annotations

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from reach.keys import PRIORITIES, Keys
from tests.fuzz.live import assert_serving, start_ready, wait_settled
from tests.fuzz.strategies import hostile_entries
from tests.support.workers import Workers

CAPS = st.sampled_from(["hard.echo", "hard.fail", "hard.slow", "fuzz.unknown"])


@pytest.fixture(scope="module")
def live(redis_server):  # type: ignore[no-untyped-def]
    ns = "fuzzinbox"
    w = Workers(redis_server.url, ns, "tests.support.agents_hardening")
    start_ready(w, redis_server.url, ns, "h1")
    r = redis.Redis.from_url(redis_server.url)
    yield w, redis_server.url, ns, r
    r.close()
    w.stop_all()


def _entry(draw: st.DrawFn) -> dict[bytes, bytes]:
    kind = draw(st.sampled_from(["e", "e", "e", "e", "no_e", "extra"]))
    data = draw(hostile_entries(draw(CAPS)))
    if kind == "no_e":
        return {b"x": data}
    if kind == "extra":
        return {b"e": data, draw(st.binary(min_size=1, max_size=8)): b"1"}
    return {b"e": data}


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[str, dict[bytes, bytes]]]:
    n = draw(st.integers(1, 6))
    return [(draw(st.sampled_from(PRIORITIES)), _entry(draw)) for _ in range(n)]


@given(batch=batches())
def test_any_inbox_entry_is_settled_and_the_worker_serves(
    live: tuple[Workers, str, str, redis.Redis], batch: list[tuple[str, dict[bytes, bytes]]]
) -> None:
    workers, url, ns, r = live
    keys = Keys(ns)
    for prio, fields in batch:
        r.xadd(keys.inbox("h1", prio), fields)  # type: ignore[arg-type]
    wait_settled(r, ns, "h1")
    assert_serving(workers, url, ns, "h1")

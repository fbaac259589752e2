"""Issue 9: no inbox entry, sweeper input or API call may stop a worker.

Each test writes what a hostile or careless writer could put into Redis (or does what an
ordinary caller does) next to real `reach worker` processes, then checks that every
worker is still alive and serving, and that the bad entry went where an operator can see
it (a dead letter with its reason) instead of staying pending.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import msgspec
import pytest

from reach.client import Client
from reach.connection import AnyRedis
from reach.envelope import encode, new_id, now_ms, scoped_key
from reach.errors import NoAgentAvailable
from reach.keys import GROUP, Keys
from reach.registry import Registry
from reach.scripts import inbox
from reach.tasks import DLQ_RAW_MAX_BYTES, MALFORMED_CAP
from tests.fuzz.strategies import deep_nesting, valid_envelope
from tests.support.waiting import wait_until
from tests.support.workers import ROOT, Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_hardening")
    yield w
    w.stop_all()


async def ready(c: Client, ids: set[str]) -> None:
    async def probe() -> bool:
        got = {
            a.agent_id
            for a in await Registry(c.redis, c.namespace).agents(
                "hard.echo", ready=True, state="active"
            )
        }
        return ids <= got

    await wait_until(probe, timeout_s=30, what=f"agents {sorted(ids)} ready")
    c.invalidate()


def alive(workers: Workers, *names: str) -> None:
    for n in names:
        p = workers.procs[n]
        assert p.poll() is None, f"worker {n} exited with {p.returncode}"


async def serving(c: Client, workers: Workers, *names: str) -> None:
    """Every named worker is alive and answers a request addressed to it."""
    alive(workers, *names)
    for n in names:

        async def answered(n: str = n) -> Any:
            try:  # after an outage the agent may be re-registering: not routable yet
                return await c.request("hard.echo", {"ping": n}, target=n, timeout_s=20)
            except NoAgentAvailable:
                c.invalidate()
                return None

        out = await wait_until(answered, timeout_s=30, what=f"{n} answers")
        assert out["agent"] == n


async def pending(r: AnyRedis, ns: str, agent_id: str) -> int:
    total = 0
    for key in Keys(ns).inboxes(agent_id):
        with contextlib.suppress(Exception):  # no stream or group (dropped): none pending
            total += int((await r.xpending(key, GROUP))["pending"])
    return total


async def inbox_len(r: AnyRedis, ns: str, agent_id: str) -> int:
    return sum([int(await r.xlen(k)) for k in Keys(ns).inboxes(agent_id)])


async def dead_letters(r: AnyRedis, ns: str, cap: str) -> list[dict[str, Any]]:
    rows = await r.xrange(Keys(ns).dlq(cap))
    return [{k.decode(): v for k, v in f.items()} for _, f in rows]


async def settled(r: AnyRedis, ns: str, agent_id: str) -> None:
    async def probe() -> bool:
        return await pending(r, ns, agent_id) == 0 and await inbox_len(r, ns, agent_id) == 0

    await wait_until(probe, timeout_s=30, what=f"inbox of {agent_id} settled")


# -- item 1 ------------------------------------------------------------------------------
async def test_a_direct_send_to_an_agent_killed_before_handling_it_moves_on(
    workers: Workers, redis_url: str, ns: str
) -> None:
    for n in ("h1", "h2", "h3"):
        workers.start(n)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1", "h2", "h3"})
        workers.procs["h3"].send_signal(signal.SIGSTOP)  # it must not handle the message
        msg_id = await c.send("hard.echo", {"n": 1}, policy="direct", target="h3")
        workers.procs["h3"].send_signal(signal.SIGKILL)
        # Evicted, its inbox goes to the sweeper: the direct message loses its target and
        # is handled by a live agent; before the fix the router refused it and every
        # worker holding the sweeper lock died in turn.
        st = await wait_until(
            lambda: _status_in(c, msg_id, "succeeded", "dead"),
            timeout_s=30,
            what="direct message rerouted",
        )
        assert st.status == "succeeded" and st.agent_id in ("h1", "h2")
        await serving(c, workers, "h1", "h2")
        # `reach sweep` walks the same path: it must not fail either.
        with anyio.fail_after(60):
            out = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "reach_cli.app",
                    "sweep",
                    "--redis-url",
                    redis_url,
                    "--namespace",
                    ns,
                ],
                cwd=ROOT,
                check=False,
            )
        assert out.returncode == 0, out.stderr.decode()


async def _status_in(c: Client, msg_id: str, *statuses: str) -> Any:
    st = await c.task(msg_id)
    return st if st.status in statuses else None


# -- item 2 ------------------------------------------------------------------------------
async def test_poison_inbox_entries_are_dead_lettered_and_the_worker_goes_on(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("h1")
    keys = Keys(ns)
    inbox = keys.inbox("h1", "normal")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1"})
        # attempt 5000 of 10000 on a failing handler: 2**4999 overflowed the backoff.
        retry = valid_envelope(
            capability="hard.fail", attempt=5000, max_attempts=10_000, deadline_ms=0
        )
        await r.xadd(inbox, {"e": encode(retry)})
        # A payload nested 100,000 levels deep: RecursionError in decoding.
        deep = msgspec.msgpack.decode(encode(valid_envelope(capability="hard.echo")))
        raw = _replace_payload(deep, deep_nesting(100_000))
        await r.xadd(inbox, {"e": raw})
        # A second copy of a key being handled, claiming it waited a million times already:
        # its backoff is capped, not 2**1_000_000.
        key = new_id()
        slow = c.build("hard.slow", {"sleep_s": 1.5}, idempotency_key=key, target="h1")
        await c.deliver(slow)
        await wait_until(
            lambda: _status_in(c, slow.msg_id, "running"), timeout_s=20, what="slow message running"
        )
        copy = valid_envelope(
            capability="hard.slow",
            idempotency_key=key,
            busy_waits=1_000_000,
            payload=msgspec.Raw(encode({})),
        )
        await r.xadd(inbox, {"e": encode(copy)})
        await serving(c, workers, "h1")
        await settled(r, ns, "h1")
        await serving(c, workers, "h1")
        # The retry got its backoff (capped), the deep one its reason.
        assert (await c.task(retry.msg_id)).status in ("retrying", "pending", "running", "dead")
        bad = await dead_letters(r, ns, MALFORMED_CAP)
        assert any(b"nested too deeply" in d["error"] for d in bad), bad


def _replace_payload(env_map: dict[str, Any], payload: bytes) -> bytes:
    """An envelope's msgpack with ``payload`` spliced in as the payload's raw bytes."""
    rest = {k: v for k, v in env_map.items() if k != "payload"}
    body = encode(rest)
    n = len(rest) + 1
    assert n < 16 and 0x80 <= body[0] <= 0x8F
    return bytes([0x80 + n]) + body[1:] + encode("payload") + payload


async def test_an_entry_whose_reply_cannot_be_written_does_not_block_the_others(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    """A reply stream overwritten with a string (WRONGTYPE): settle.lua fails for the
    batch; the others settle, that one is dead-lettered, nothing loops."""
    workers.start("h1", "--concurrency", "1")
    keys = Keys(ns)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1"})
        await r.set(keys.replies("victim"), "not a stream")
        bad = valid_envelope(capability="hard.echo", reply_to="victim")
        await r.xadd(keys.inbox("h1", "normal"), {"e": encode(bad)})
        await settled(r, ns, "h1")
        await serving(c, workers, "h1")
        letters = await dead_letters(r, ns, MALFORMED_CAP)
        assert any(d["reason"] == b"unprocessable" for d in letters), letters


async def test_a_planted_key_of_the_wrong_type_fails_only_its_own_entry(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    """An idempotency record overwritten with a string: claim.lua refuses the batch it is
    in; the others are claimed one by one and handled, that one is dead-lettered."""
    p = workers.start("h1")
    keys = Keys(ns)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1"})
        await r.set(keys.idem(scoped_key("hard.echo", "planted")), "not a hash")
        p.send_signal(signal.SIGSTOP)  # so the six entries arrive in one read
        try:
            good = [c.build("hard.echo", {"i": i}, target="h1") for i in range(5)]
            bad = c.build("hard.echo", {"i": "bad"}, target="h1", idempotency_key="planted")
            for env in [*good[:2], bad, *good[2:]]:
                await r.xadd(keys.inbox("h1", "normal"), {"e": encode(env)})
        finally:
            p.send_signal(signal.SIGCONT)
        await settled(r, ns, "h1")
        for env in good:
            assert (await c.task(env.msg_id)).status == "succeeded"
        letters = await dead_letters(r, ns, MALFORMED_CAP)
        assert [d["reason"] for d in letters] == [b"unprocessable"]
        assert bad.msg_id.encode() in letters[0]["env"]
        await serving(c, workers, "h1")


# -- item 7 ------------------------------------------------------------------------------
async def test_an_oversized_entry_is_dead_lettered_with_a_bounded_copy(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("h1")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1"})
        await r.xadd(Keys(ns).inbox("h1", "low"), {"e": b"\xc1" * (10 * 1024 * 1024)})
        await settled(r, ns, "h1")
        [letter] = await dead_letters(r, ns, MALFORMED_CAP)
        assert letter["reason"] == b"too_large"
        assert len(letter["env"]) == DLQ_RAW_MAX_BYTES
        assert b"10485760 bytes" in letter["error"]
        await serving(c, workers, "h1")


async def test_a_stopped_agent_leaves_no_inbox(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    p = workers.start("h1")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1"})
        await c.request("hard.echo", {}, timeout_s=20)
        assert await r.exists(*Keys(ns).inboxes("h1"))
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0
    assert not await r.exists(*Keys(ns).inboxes("h1"))


async def test_an_evicted_agents_emptied_inbox_is_dropped(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    for n in ("h1", "h2"):
        workers.start(n)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1", "h2"})
        workers.procs["h2"].send_signal(signal.SIGSTOP)
        ids = [await c.send("hard.echo", {"i": i}, target="h2") for i in range(5)]
        workers.procs["h2"].send_signal(signal.SIGKILL)
        for i in ids:
            await wait_until(
                lambda i=i: _status_in(c, i, "succeeded"),
                timeout_s=30,
                what="moved message handled",
            )

        async def dropped() -> bool:
            return not await r.exists(*Keys(ns).inboxes("h2"))

        await wait_until(dropped, timeout_s=30, what="inbox of the evicted agent dropped")
        await serving(c, workers, "h1")


async def test_a_message_sent_to_an_evicted_agent_after_its_inbox_was_dropped_is_moved_on(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    """A caller whose registry view has not read an eviction yet sends to the evicted
    agent after the sweeper emptied and dropped its inbox: the add recreates an inbox
    stream nobody reads. The evicted agent stays in the reroute set for a grace time after
    its eviction, so the next pass moves the message on (it waited forever before: the
    cluster suite's reroute test timed out on its last request this way)."""
    for n in ("h1", "h2"):
        workers.start(n)
    keys = Keys(ns)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1", "h2"})
        workers.procs["h2"].send_signal(signal.SIGKILL)

        async def dropped() -> bool:
            a = await Registry(r, ns).get("h2")
            return (
                a is not None and a.state == "evicted" and not await r.exists(*keys.inboxes("h2"))
            )

        await wait_until(dropped, timeout_s=30, what="h2 evicted and its inbox dropped")
        # what send() does for a caller whose view still routes to h2
        env = c.build("hard.echo", {"late": True})
        m = inbox.Message.of(env, encode(env))
        sent = await inbox.send(
            r, keys, m, cluster=False, agent_id="h2", priority="normal", ttl_ms=60_000
        )
        assert not sent.refused

        async def handled() -> Any:
            return await _status_in(c, env.msg_id, "succeeded")

        st = await wait_until(handled, timeout_s=30, what="the late message moved and handled")
        assert st.agent_id == "h1"


# -- item 11 -----------------------------------------------------------------------------
async def test_garbage_in_the_sweepers_structures_is_dead_lettered_and_workers_live(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    for n in ("h1", "h2"):
        workers.start(n)
    keys = Keys(ns)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1", "h2"})
        past = now_ms() - 1000
        await r.sadd(keys.reroute, b"\xff\xfe-not-utf8", b"has{brace}")
        await r.zadd(
            keys.delayed,
            {
                b"garbage in the delayed set": past,
                deep_nesting(100_000, as_map=True): past,
                encode(valid_envelope(capability="hard.echo", policy="direct")): past,
            },
        )
        await r.xadd(keys.parked("hard.echo"), {"e": b"\x00garbage parked"})
        await r.sadd(keys.parked_caps, "hard.echo", b"\xff")

        async def cleaned() -> bool:
            return (
                await r.scard(keys.reroute) == 0
                and await r.zcard(keys.delayed) == 0
                and await r.scard(keys.parked_caps) == 0
            )

        await wait_until(cleaned, timeout_s=30, what="sweeper inputs consumed")
        letters = await dead_letters(r, ns, MALFORMED_CAP)
        raws = {bytes(d["env"]) for d in letters}
        assert b"garbage in the delayed set" in raws
        assert b"\x00garbage parked" in raws
        assert any(b"nested too deeply" in d["error"] for d in letters)
        unroutable = await dead_letters(r, ns, "hard.echo")
        assert [d["reason"] for d in unroutable] == [b"unroutable"]
        await serving(c, workers, "h1", "h2")


async def test_keys_of_the_wrong_type_stop_no_sweeper_chore(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    """The delayed set, an evicted agent's inbox and a parked stream overwritten with other
    types: each refusal stays with its own chore or member, and a good parked message is
    still released (before, the first refusal ended every sweep pass)."""
    for n in ("h1", "h2"):
        workers.start(n)
    keys = Keys(ns)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, {"h1", "h2"})
        await r.set(keys.delayed, "not a zset")
        await r.set(keys.inbox("ghost", "normal"), "not a stream")
        await r.sadd(keys.reroute, "ghost")
        await r.hset(keys.parked("wrong.type"), "a", "b")
        good = c.build("hard.echo", {"parked": True})
        await r.xadd(keys.parked("hard.echo"), {"e": encode(good)})
        await r.sadd(keys.parked_caps, "wrong.type", "hard.echo")

        async def released() -> Any:
            return await _status_in(c, good.msg_id, "succeeded")

        await wait_until(released, timeout_s=30, what="the good parked message released")

        async def members_gone() -> bool:
            return await r.scard(keys.reroute) == 0 and await r.scard(keys.parked_caps) == 0

        await wait_until(members_gone, timeout_s=30, what="unreadable members removed")
        await r.delete(keys.delayed)  # retries need it to serve
        await serving(c, workers, "h1", "h2")


# -- item 12 -----------------------------------------------------------------------------
async def test_a_redis_outage_is_a_few_lines_in_a_workers_log(
    fresh_redis: Any, ns: str, tmp_path: Any
) -> None:
    """Before: ~13 warnings a second per worker while Redis was down."""
    log = tmp_path / "h1.log"
    w = Workers(fresh_redis.url, ns, "tests.support.agents_hardening")
    try:
        w.start("h1", log=log)
        async with Client(redis_url=fresh_redis.url, namespace=ns, slow_start_s=0) as c:
            await ready(c, {"h1"})
        fresh_redis.kill()
        await anyio.sleep(3.0)  # the outage itself
        await anyio.to_thread.run_sync(fresh_redis.start)
        async with Client(redis_url=fresh_redis.url, namespace=ns, slow_start_s=0) as c:
            await ready(c, {"h1"})
            await serving(c, w, "h1")
            text = log.read_text().splitlines()
            lines = [x for x in text if " reach.runtime: " in x]
            assert 1 <= len(lines) <= 5, lines  # down, back, maybe "evicted: h1" (itself)
            assert any("works again" in x for x in lines), lines
            # Its registry view (of the Client inside the runtime): a few lines too.
            view = [x for x in text if " reach.view: " in x]
            assert len(view) <= 4, view
    finally:
        w.stop_all()


async def test_dead_letter_streams_are_bounded(redis_url: str, ns: str, r: AnyRedis) -> None:
    """Item 7: dead letters never expired; now each stream is trimmed near dlq_maxlen."""
    from reach import Agent
    from tests.support.agents_messaging import serving

    app = Agent("bounded", capabilities=["hard.echo"])

    @app.handler("hard.echo")
    async def echo(payload: Any, ctx: Any) -> Any:
        return payload

    async with serving(redis_url, ns, app, dlq_maxlen=10):
        inbox = Keys(ns).inbox("bounded", "normal")
        for i in range(600):
            await r.xadd(inbox, {"e": b"junk %d" % i})

        async def drained() -> bool:
            return await r.xlen(inbox) == 0

        await wait_until(drained, timeout_s=30, what="junk dead-lettered")
        # MAXLEN ~ trims whole radix-tree nodes (100 entries each): near 10, never 600.
        assert await r.xlen(Keys(ns).dlq(MALFORMED_CAP)) <= 200

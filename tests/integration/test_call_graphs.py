"""Call graphs against real worker processes (docs/concepts.md, *Call graphs*): A -> B -> A
refused at the second entry of A, a self-call with every slot busy answered at once
(routed to the other agent, or WouldDeadlock), a chain of 20 capabilities stopped at
max_hops, a send() ping-pong that ends, and the agent's own checks of what reaches it
(dead letters ``loop`` and ``hop_limit``, the caller told at once).

Every call here has a 60 s deadline: a refusal that came from the deadline would be
``DeadlineExceeded``, so each typed refusal asserted shows it was not waited for."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import anyio
import msgspec
import pytest

from reach import Client, Hop, HopLimitExceeded, LoopDetected
from reach.connection import AnyRedis
from reach.envelope import decode_envelope, encode
from reach.keys import Keys
from reach.tasks import MALFORMED_CAP
from tests.support.agents_calls import CHAIN, ping_agent, pong_agent
from tests.support.agents_messaging import FAST, handled_by_agent, wait_eligible
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio
DEADLINE_S = 60
SECRET = "calls-secret-0123456789abcdef"


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_calls")
    try:
        yield w
    finally:
        w.stop_all()


async def runs(r: AnyRedis, ns: str, name: str) -> dict[str, int]:
    """How often the handler ``name`` ran, by agent."""
    return await handled_by_agent(r, ns, name)


async def test_a_to_b_to_a_is_refused_at_the_second_entry_with_the_path(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("ping_agent", "--agent-id", "a1")
    workers.start("pong_agent", "--agent-id", "b1")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.a", ["a1"])
        await wait_eligible(client, "calls.b", ["b1"])

        # B catches the refusal of its call: it is LoopDetected, raised at send in B
        got = await client.request("calls.a", {"catch": True}, timeout_s=DEADLINE_S)
        assert got["refused"] == "LoopDetected", got
        assert got["path"] == "calls.a@a1 -> calls.b@b1 -> calls.a@a1", got
        assert "calls.a@a1 -> calls.b@b1 -> calls.a@a1" in got["error"]
        # A ran once (the first entry), never a second time; B once
        assert await runs(r, ns, "calls.a") == {"a1": 1}
        assert await runs(r, ns, "calls.b") == {"b1": 1}

        # B lets it go: its message ends `loop` (not retried), and so does A's, so the
        # first caller gets LoopDetected with the path
        with pytest.raises(LoopDetected) as e:
            await client.request("calls.a", {}, timeout_s=DEADLINE_S)
        assert e.value.path == "calls.a@a1 -> calls.b@b1 -> calls.a@a1"
        assert e.value.reason == "loop"
        assert await runs(r, ns, "calls.a") == {"a1": 2}
        assert await runs(r, ns, "calls.b") == {"b1": 2}  # once each: no retry


async def test_a_loop_is_routed_to_another_agent_when_one_can_take_it(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("ping_agent", "--agent-id", "a1")
    workers.start("ping_agent", "--agent-id", "a2")
    workers.start("pong_agent", "--agent-id", "b1")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.a", ["a1", "a2"])
        await wait_eligible(client, "calls.b", ["b1"])
        # a1 -> b1 -> calls.a: a1 waits there, a2 does not: every time, a2 answers
        for _ in range(5):
            got = await client.request(
                "calls.a", {"then_leaf": True}, target="a1", timeout_s=DEADLINE_S
            )
            assert got == {"leaf": "a2"}
        # a1 -> b1 -> a2 -> calls.b: b1 waits, and is the only agent of calls.b
        with pytest.raises(LoopDetected) as e:
            await client.request("calls.a", {}, target="a1", timeout_s=DEADLINE_S)
        assert e.value.path == "calls.b@b1 -> calls.a@a2 -> calls.b@b1"  # the cycle
    assert await runs(r, ns, "calls.a") == {"a1": 6, "a2": 6}
    assert await runs(r, ns, "calls.b") == {"b1": 6}


async def test_a_self_call_with_every_slot_busy_goes_to_the_other_agent(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("self_agent", "--agent-id", "s1", "--concurrency", "1")
    workers.start("self_agent", "--agent-id", "s2", "--concurrency", "1")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.self", ["s1", "s2"])
        got = await client.request("calls.self", {"children": 1}, target="s1", timeout_s=DEADLINE_S)
    assert got == {"agent": "s1", "children": [{"agent": "s2"}]}, got


async def test_a_self_call_with_every_slot_busy_and_no_other_agent_is_refused_at_once(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("self_agent", "--agent-id", "s1", "--concurrency", "1")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.self", ["s1"])
        got = await client.request("calls.self", {"children": 1}, timeout_s=DEADLINE_S)
    [child] = got["children"]
    assert child["refused"] == "WouldDeadlock", got
    assert "none of its 1 handler slots is free" in child["error"]
    assert await runs(r, ns, "calls.self") == {"s1": 1}  # the refused call never ran


async def test_concurrent_self_calls_do_not_count_one_free_slot_twice(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    # 2 slots: the parent holds one, the first child takes the other (and holds it until
    # its sibling was refused), so the second child has none: WouldDeadlock, not a wait
    workers.start("self_agent", "--agent-id", "s1", "--concurrency", "2")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.self", ["s1"])
        got = await client.request(
            "calls.self", {"children": 2, "release": "calls.self.released"}, timeout_s=DEADLINE_S
        )
    children = got["children"]
    assert {"agent": "s1"} in children, got
    refused = [c for c in children if c != {"agent": "s1"}]
    assert len(refused) == 1 and refused[0]["refused"] == "WouldDeadlock", got
    assert await runs(r, ns, "calls.self") == {"s1": 2}  # the parent and one child


async def test_a_20_hop_chain_is_refused_at_max_hops(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("chain_agent", "--agent-id", "chain-1", "--concurrency", "32")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "chain.0", ["chain-1"])
        with pytest.raises(HopLimitExceeded) as e:
            await client.request("chain.0", {}, timeout_s=DEADLINE_S)
    # chain.0 is the first message (0 hops); chain.16 is 16 calls deep, the limit; its
    # call to chain.17 would be the 17th: refused at send, and every caller told
    steps = e.value.path.split(" -> ")
    assert steps == [f"chain.{k}@chain-1" for k in range(17)] + ["chain.17"], e.value.path
    assert "17 calls deep, past the limit of 16" in str(e.value)
    for k in range(CHAIN):
        want = {"chain-1": 1} if k <= 16 else {}
        assert await runs(r, ns, f"chain.{k}") == want, k


async def test_send_ping_pong_ends_at_max_hops(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("echo_sender_agent", "--agent-id", "pp-1")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.ping", ["pp-1"])
        await client.send("calls.ping", {})  # no deadline, no one waits: only hops stop it

        async def refused() -> dict[str, int]:
            return await runs(r, ns, "calls.refused")

        assert await wait_until(refused, timeout_s=60, what="the send refused") == {"pp-1": 1}
    # hops 0..16 ran (17 handlers), the 17th send was refused
    ping, pong = await runs(r, ns, "calls.ping"), await runs(r, ns, "calls.pong")
    assert ping["pp-1"] + pong["pp-1"] == 17, (ping, pong)
    error = (await r.get(Keys(ns).effects("calls.refused.error"))).decode()
    assert "17 calls deep, past the limit of 16" in error


async def _dead_letters(r: AnyRedis, ns: str, capability: str) -> list[dict[bytes, bytes]]:
    entries = await r.xrange(Keys(ns).dlq(capability))
    return [fields for _, fields in entries]


async def test_the_receiving_agent_refuses_a_loop_its_sender_did_not_check(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("ping_agent", "--agent-id", "a1")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.a", ["a1"])
        env = client.build("calls.a", {"leaf": True}, timeout_s=DEADLINE_S)
        # as another implementation could send it: a path on which a1 waits for it
        env.hops = 2
        env.path = [Hop("calls.a", "a1", True), Hop("calls.b", "b1", True)]
        with pytest.raises(LoopDetected) as e:
            await client.call(env)  # no gate: the plain client does not check
        assert e.value.path == "calls.a@a1 -> calls.b@b1 -> calls.a@a1"
    assert await runs(r, ns, "calls.a") == {}  # never ran
    [letter] = await _dead_letters(r, ns, "calls.a")
    assert letter[b"reason"] == b"loop"
    assert decode_envelope(letter[b"env"]).path == env.path


async def test_the_receiving_agent_refuses_a_message_past_its_handlers_max_hops(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("ping_agent", "--agent-id", "a1")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.a", ["a1"])
        ok = client.build("calls.a", {"leaf": True}, timeout_s=DEADLINE_S)
        ok.hops, ok.path = 16, [Hop("calls.x", "x1", True)]
        assert await client.call(ok) == {"leaf": "a1"}  # at the limit: runs
        deep = client.build("calls.a", {"leaf": True}, timeout_s=DEADLINE_S)
        deep.hops, deep.path = 17, [Hop("calls.x", "x1", True)]
        with pytest.raises(HopLimitExceeded) as e:
            await client.call(deep)
        assert e.value.path == "calls.x@x1 -> calls.a@a1"
        assert "agent 'a1' refused it" in str(e.value)
    assert await runs(r, ns, "calls.a") == {"a1": 1}
    [letter] = await _dead_letters(r, ns, "calls.a")
    assert letter[b"reason"] == b"hop_limit"


async def test_a_forged_call_path_in_an_inbox_is_dead_lettered_malformed(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    workers.start("ping_agent", "--agent-id", "a1")
    async with Client(redis_url=redis_url, namespace=ns) as client:
        await wait_eligible(client, "calls.a", ["a1"])
        good = msgspec.msgpack.decode(encode(client.build("calls.a", {"leaf": True})))
        bad_paths: list[Any] = [
            [["calls.a", "a1"]],
            [["NOT A CAP", "a1", True]],
            [["calls.a", "a1", True]] * 33,
            "calls.a@a1",
            [[1, 2, 3]],
        ]
        inbox = Keys(ns).inbox("a1", "normal")
        for path in bad_paths:
            await r.xadd(inbox, {"e": encode({**good, "hops": 1, "path": path})})
        await r.xadd(inbox, {"e": encode({**good, "hops": -5})})

        async def filed() -> bool:
            return len(await _dead_letters(r, ns, MALFORMED_CAP)) >= len(bad_paths) + 1

        await wait_until(filed, what="every forged entry dead-lettered")
        letters = await _dead_letters(r, ns, MALFORMED_CAP)
        assert {f[b"reason"] for f in letters} == {b"malformed"}
        # and the worker goes on
        assert await client.request("calls.a", {"leaf": True}, timeout_s=DEADLINE_S) == {
            "leaf": "a1"
        }
    assert await runs(r, ns, "calls.a") == {"a1": 1}


async def test_a_signed_call_path_verifies_on_an_agent_that_requires_signatures(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    # Both agents require signed messages: the handler's call reaches B only if its
    # signature, which covers hops and path, verifies there.
    opts: dict[str, Any] = {**FAST, "secret": SECRET, "require_signed": True}
    a, b = ping_agent(), pong_agent()
    async with anyio.create_task_group() as tg:
        for agent in (a, b):
            tg.start_soon(partial(agent.run, redis_url=redis_url, namespace=ns, **opts))
        try:
            async with Client(redis_url=redis_url, namespace=ns, secret=SECRET) as client:
                await wait_eligible(client, "calls.a", ["a1"])
                await wait_eligible(client, "calls.b", ["b1"])
                got = await client.request("calls.a", {"catch": True}, timeout_s=DEADLINE_S)
        finally:
            a.stop()
            b.stop()
    assert got["refused"] == "LoopDetected", got  # B's call was refused, not A's
    assert await runs(r, ns, "calls.b") == {"b1": 1}  # A's signed call reached B
    assert await _dead_letters(r, ns, "calls.b") == []  # nothing unauthenticated

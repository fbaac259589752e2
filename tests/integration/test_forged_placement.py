"""Forged messages written straight into Redis where the sweeper places messages again
(the delayed set, a parked stream, an evicted agent's inbox), and forged dead letters an
operator replays: none of them is signed for its writer.

The agent is a real ``reach worker`` process with ``REACH_SECRET`` and
``--require-signed``; its own sweeper and scheduler (holding the secret) do the moves. The
attacker is a Redis user of reach's ``caller`` role (``reach acl``) without the secret.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import msgspec
import pytest

from reach import acl, admin
from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.envelope import Envelope, decode_envelope, encode, encode_payload, new_id, now_ms
from reach.keys import GROUP, Keys
from reach.registry import Registry
from reach.tasks import dead_letter_op
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

SECRET = "s3cret-for-the-forgery-tests-0123456789"
CAP = "sig.work"


@pytest.fixture
def workers(redis_url: str, ns: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workers]:
    monkeypatch.setenv("REACH_SECRET", SECRET)  # the worker processes inherit it
    w = Workers(redis_url, ns, "tests.support.agents_signed")
    w.start("w1", "--require-signed")
    yield w
    w.stop_all()


def forged(source: str = "admin") -> Envelope:
    """What an attacker without the secret writes: an unsigned envelope naming any sender."""
    return Envelope(
        msg_id=new_id(),
        capability=CAP,
        payload=encode_payload({}),
        source=source,
        sent_ms=now_ms(),
    )


async def ready(r: AnyRedis, ns: str) -> None:
    async def up() -> bool:
        return bool(await Registry(r, ns).agents(CAP, ready=True, state="active"))

    await wait_until(up, timeout_s=30, what="sig-1 ready")


async def ran(r: AnyRedis, ns: str, msg_id: str) -> tuple[int, str]:
    """How often the handler ran ``msg_id``, and the ctx.sender it saw."""
    key = Keys(ns).effects("sig")
    runs, sender = await r.hmget(key, f"runs:{msg_id}", f"sender:{msg_id}")
    return int(runs or 0), (sender or b"").decode()


async def dead_reason(r: AnyRedis, ns: str, msg_id: str) -> str:
    for _, f in await r.xrange(Keys(ns).dlq(CAP)):
        if f.get(b"msg_id") == msg_id.encode():
            return str(f[b"reason"].decode())
    return ""


@pytest.fixture
async def attacker(r: AnyRedis, redis_url: str, ns: str) -> AsyncIterator[AnyRedis]:
    """A connection as a user of reach's ``caller`` role in ``ns`` (the rules ``reach acl``
    prints), holding no secret: what a leaked caller password gives."""
    user, password = f"attacker-{uuid.uuid4().hex[:8]}", "attacker-pw-0123456789"
    await r.execute_command("ACL", "SETUSER", user, *acl.rules(ns, "caller", password=password))
    conn = await connect(redis_url.replace("redis://", f"redis://{user}:{password}@", 1))
    try:
        yield conn
    finally:
        await conn.aclose()
        await r.execute_command("ACL", "DELUSER", user)


PLACES = ("delayed", "parked", "evicted inbox", "scheduled")


async def place_everywhere(w: AnyRedis, r: AnyRedis, ns: str, envs: list[Envelope]) -> None:
    """Written by ``w``: ``envs[0]`` into the delayed set (due now), ``envs[1]`` into the
    capability's parked stream, ``envs[2]`` into the inbox of an agent the registry lists
    for rerouting, ``envs[3]`` into the scheduled set (due now). ``r`` only makes that
    inbox's consumer group, as its agent did before it was evicted."""
    keys = Keys(ns)
    inbox = keys.inbox("ghost-1", "normal")
    await r.xgroup_create(inbox, GROUP, id="0", mkstream=True)
    await w.zadd(keys.delayed, {encode(envs[0]): now_ms()})
    await w.xadd(keys.parked(CAP), {"e": encode(envs[1])})
    await w.sadd(keys.parked_caps, CAP)
    await w.xadd(inbox, {"e": encode(envs[2])})
    await w.sadd(Registry(r, ns).keys.reroute_of(0), "ghost-1")
    await w.hset(keys.scheduled_envelopes, envs[3].msg_id, encode(envs[3]))
    await w.zadd(keys.scheduled, {envs[3].msg_id: now_ms()})


async def test_forged_entries_placed_again_are_dead_lettered_unauthenticated(
    workers: Workers, r: AnyRedis, attacker: AnyRedis, ns: str
) -> None:
    await ready(r, ns)
    fakes = [forged() for _ in PLACES]
    await place_everywhere(attacker, r, ns, fakes)

    async def all_dead() -> bool:
        return all([await dead_reason(r, ns, e.msg_id) for e in fakes])

    await wait_until(all_dead, timeout_s=30, what="the forged entries dead-lettered")
    for where, e in zip(PLACES, fakes, strict=True):
        assert await dead_reason(r, ns, e.msg_id) == "unauthenticated", where
        assert await ran(r, ns, e.msg_id) == (0, ""), f"forged entry in {where} ran"


async def test_signed_entries_placed_again_keep_their_signature_and_run(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """A genuinely signed message moved by the sweeper runs, as its original sender."""
    await ready(r, ns)
    async with Client(redis_url=redis_url, namespace=ns, secret=SECRET) as alice:
        assert alice.signer is not None
        envs = [alice.build(CAP, {}, reply=False, source="alice") for _ in PLACES]
        for env in envs:
            alice.signer.sign_envelope(env)
        await place_everywhere(r, r, ns, envs)

        async def all_ran() -> bool:
            return all([(await ran(r, ns, e.msg_id))[0] for e in envs])

        await wait_until(all_ran, timeout_s=30, what="the signed entries ran")
        for e in envs:
            assert await ran(r, ns, e.msg_id) == (1, "alice")
            assert await dead_reason(r, ns, e.msg_id) == ""


async def test_a_retry_keeps_the_senders_signature(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """The runtime's own re-placement: a failed first attempt goes back through the
    delayed set (attempt + 1, outside the signed fields) and verifies on its retry."""
    await ready(r, ns)
    async with Client(redis_url=redis_url, namespace=ns, secret=SECRET) as c:
        got = await c.request(CAP, {"fail_first": True}, timeout_s=30)
        assert got == c.client_id
        msg_id = await c.send(CAP, {"fail_first": True})
        await wait_until(
            lambda: _succeeded(c, msg_id), timeout_s=30, what="the sent retry succeeded"
        )
        assert await ran(r, ns, msg_id) == (2, c.client_id)


async def _succeeded(c: Client, msg_id: str) -> bool:
    return (await c.task(msg_id)).status == "succeeded"


async def test_a_forged_dead_letter_is_not_replayed_as_its_claimed_sender(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """An operator replaying with the secret: a forged letter is refused (it stays); with
    as_operator it runs as the operator's own message; a genuine signed letter is re-signed
    and runs as its original sender."""
    keys = Keys(ns)
    await ready(r, ns)
    fake = forged()
    async with Client(redis_url=redis_url, namespace=ns, secret=SECRET) as operator:
        assert operator.signer is not None
        real = operator.build(CAP, {}, reply=False, source="alice")
        operator.signer.sign_envelope(real)
        for env in (fake, real):  # filed as the runtime files them
            op = dead_letter_op(
                keys, capability=CAP, reason="max_attempts", data=encode(env), msg_id=env.msg_id
            )
            await r.execute_command(*op)
        letters = await admin.list_dead_letters(r, keys, capability=CAP)
        assert len(letters) == 2
        res = await admin.replay_dead_letters(r, keys, letters, client=operator)
        assert [s.msg_id for s in res.sent] == [real.msg_id]
        assert len(res.failed) == 1 and "does not verify" in res.failed[0].error

        async def real_ran() -> bool:
            return (await ran(r, ns, real.msg_id))[0] == 1

        await wait_until(real_ran, timeout_s=30, what="the genuine letter ran")
        assert await ran(r, ns, real.msg_id) == (1, "alice")
        assert await ran(r, ns, fake.msg_id) == (0, "")

        left = await admin.list_dead_letters(r, keys, capability=CAP)
        assert [x.letter.msg_id for x in left] == [fake.msg_id]
        res = await admin.replay_dead_letters(r, keys, left, client=operator, as_operator=True)
        assert [s.msg_id for s in res.sent] == [fake.msg_id]

        async def fake_ran() -> bool:
            return (await ran(r, ns, fake.msg_id))[0] == 1

        await wait_until(fake_ran, timeout_s=30, what="the letter replayed as the operator")
        assert await ran(r, ns, fake.msg_id) == (1, operator.client_id)


async def test_a_forged_copy_cannot_end_a_signing_callers_request(
    workers: Workers, r: AnyRedis, redis_url: str, ns: str
) -> None:
    """An attacker copies the msg_id and reply_to of a signing caller's running request
    into forged, unsigned entries: one in the agent's inbox (refused, unauthenticated) and
    one in the delayed set with its deadline passed (expired by the sweeper). Neither
    refusal is signed, so the caller drops both and gets its real result."""
    keys = Keys(ns)
    await ready(r, ns)
    async with Client(redis_url=redis_url, namespace=ns, secret=SECRET) as victim:
        result: list[object] = []

        async def ask() -> None:
            result.append(await victim.request(CAP, {"sleep_s": 2.0}, timeout_s=30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)

            async def sent() -> list[Any]:
                got = await r.xrevrange(keys.inbox("sig-1", "normal"), count=1)
                return [decode_envelope(f[b"e"]) for _, f in got]

            [real] = await wait_until(sent, timeout_s=20, what="the request in the inbox")
            refused = msgspec.structs.replace(real, kid="", sig=b"", source="admin")
            await r.xadd(keys.inbox("sig-1", "normal"), {"e": encode(refused)})
            stale = msgspec.structs.replace(refused, deadline_ms=now_ms() - 1000)
            await r.zadd(keys.delayed, {encode(stale): 1})

            async def both_answered() -> bool:
                replies = await r.xrange(keys.replies(victim.client_id))
                return len(replies) >= 2 or bool(result)

            await wait_until(both_answered, timeout_s=20, what="the forged refusals")
        assert result == [victim.client_id]
        assert victim.forged_replies >= 2
        assert await ran(r, ns, real.msg_id) == (1, victim.client_id)

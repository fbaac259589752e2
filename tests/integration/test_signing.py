"""Signed envelopes and replies (issue 13, item 3), against a real Redis: an agent requiring
signatures dead-letters unsigned and forged messages (``unauthenticated``), a claim made at
send does not let a forged entry run, a client with a secret drops forged replies, the
handler learns who signed (``ctx.sender``), and a signed message still verifies after a
retry."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from reach import Agent, Client, Context, Rejected, admin
from reach.connection import AnyRedis
from reach.envelope import Reply, decode_reply, encode, encode_payload
from reach.keys import Keys
from reach.scripts import inbox
from reach.signing import Keyring, keygen
from reach.sweeper import expire
from reach.tasks import parse_dead_letter
from tests.support.agents_messaging import Gate, serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

AGENT = "sig-1"
CAP = "sig.work"
SECRET = "team-secret-0123456789abcdef"
OTHER = "not-the-team-secret-0123456789"


class Seen:
    def __init__(self) -> None:
        self.ran: list[Any] = []
        self.senders: list[str | None] = []
        self.failed_once: set[str] = set()


def agent(seen: Seen, gate: Gate | None = None) -> Agent:
    app = Agent(AGENT, capabilities=[CAP])

    @app.handler(CAP)
    async def work(payload: Any, ctx: Context) -> Any:
        seen.ran.append(payload)
        seen.senders.append(ctx.sender)
        if payload == "hold" and gate is not None:
            await gate.hold()
        if payload == "fail-once" and ctx.msg_id not in seen.failed_once:
            seen.failed_once.add(ctx.msg_id)
            raise RuntimeError("first attempt fails")
        return {"echo": payload, "sender": ctx.sender}

    return app


@pytest.fixture(autouse=True)
def _no_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    # serving()'s own client reads REACH_SECRET: here it never has one.
    monkeypatch.delenv("REACH_SECRET", raising=False)
    monkeypatch.delenv("REACH_REQUIRE_SIGNED", raising=False)


async def letters(r: AnyRedis, ns: str) -> list[Any]:
    return [parse_dead_letter(i, f) for i, f in await r.xrange(Keys(ns).dlq(CAP))]


async def test_signed_requests_run_and_the_handler_knows_the_sender(
    redis_url: str, ns: str
) -> None:
    seen = Seen()
    async with (
        serving(redis_url, ns, agent(seen), secret=SECRET, require_signed=True),
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as c,
    ):
        got = await c.request(CAP, "hi", timeout_s=20)
        assert got == {"echo": "hi", "sender": c.client_id}
        # A retried message (attempt 2, avoid set by the worker) still verifies.
        got = await c.request(CAP, "fail-once", timeout_s=20)
        assert got["echo"] == "fail-once" and seen.ran.count("fail-once") == 2
        assert c.forged_replies == 0
        many = await c.request_many(CAP, ["a", "b", "c"], timeout_s=20)
        assert [m["echo"] for m in many] == ["a", "b", "c"]


async def test_unsigned_and_forged_messages_are_dead_lettered(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    seen = Seen()
    async with (
        serving(redis_url, ns, agent(seen), secret=SECRET, require_signed=True) as plain,
        Client(redis_url=redis_url, namespace=ns, secret=OTHER) as wrong,
    ):
        # Unsigned: refused, and the caller told why (a Rejected, never run).
        with pytest.raises(Rejected) as exc:
            await plain.request(CAP, "unsigned", timeout_s=20)
        assert exc.value.reason == "unauthenticated"
        # Signed with another secret: dead-lettered too (this client drops the agent's
        # reply, signed with a key it does not hold, so it only sends).
        await wrong.send(CAP, "wrong-key")
        # Signed right, then tampered with in Redis: the payload changed.
        good = Keyring.from_option(ns, SECRET)
        assert good is not None
        env = plain.build(CAP, "signed", reply=False)
        good.sign_envelope(env)
        forged = msgspec.structs.replace(env, payload=encode_payload("tampered"))
        k = Keys(ns)
        await r.xadd(k.inbox(AGENT, "normal"), {"e": encode(forged)})

        async def three_letters() -> bool:
            return len(await letters(r, ns)) == 3

        await wait_until(three_letters, timeout_s=20)
        found = await letters(r, ns)
        assert {d.reason for d in found} == {"unauthenticated"}
        whys = [d.error for d in found]
        assert any("unsigned" in w for w in whys)
        assert any("unknown key id" in w for w in whys)
        assert any("bad signature" in w for w in whys)
        # The letters keep the envelopes as read: replayable by an operator.
        assert {d.envelope.capability for d in found if d.envelope} == {CAP}
        assert len([d for d in found if d.envelope and d.envelope.sig]) == 2
        assert seen.ran == []
        assert wrong.forged_replies == 0  # a send: no reply was waited for


async def test_a_replay_by_an_operator_with_the_secret_is_not_signed_for_its_claimed_sender(
    redis_url: str, ns: str, r: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller that forgot its secret: its message is dead-lettered. `reach dlq replay`
    # (admin.replay_dead_letters) run with REACH_SECRET set does not sign the unsigned
    # letter for the sender it names (anyone with the namespace's keys can write one):
    # it stays, unless the operator sends it as its own message.
    seen = Seen()
    async with serving(redis_url, ns, agent(seen), secret=SECRET, require_signed=True) as c:
        msg_id = await c.send(CAP, "forgot")

        async def one_letter() -> list[Any]:
            return await admin.list_dead_letters(r, Keys(ns), capability=CAP)

        entries = await wait_until(one_letter, timeout_s=20)
        monkeypatch.setenv("REACH_SECRET", SECRET)
        res = await admin.replay_dead_letters(r, Keys(ns), entries)
        assert res.replayed == 0 and "does not verify (unsigned)" in res.failed[0].error
        async with Client(redis_url=redis_url, namespace=ns) as operator:
            res = await admin.replay_dead_letters(
                r, Keys(ns), entries, client=operator, as_operator=True
            )
            assert res.replayed == 1 and not res.failed

            async def ran() -> bool:
                return seen.ran == ["forgot"]

            await wait_until(ran, timeout_s=20)
            assert seen.senders == [operator.client_id]  # the operator's, not the letter's
        assert (await c.task(msg_id)).status in ("running", "succeeded")


async def test_a_claim_made_at_send_does_not_let_a_forged_entry_run(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    seen = Seen()
    async with serving(redis_url, ns, agent(seen), secret=SECRET, require_signed=True) as c:
        [info] = await c.eligible(CAP)
        mine = f"{info.agent_id}/{info.instance_id}"
        env = c.build(CAP, "claimed", reply=False)
        env.kid, env.sig = "0" * 16, b"\x01" * 32  # looks signed, is not
        m = inbox.Message.of(env, encode(env))
        k = Keys(ns)
        await r.xadd(k.inbox(AGENT, "normal"), {"e": m.data, "c": mine, "l": "99999999999999"})

        async def one_letter() -> bool:
            return len(await letters(r, ns)) == 1

        await wait_until(one_letter, timeout_s=20)
        [d] = await letters(r, ns)
        assert d.reason == "unauthenticated" and d.msg_id == env.msg_id
        assert seen.ran == []


async def test_a_client_with_a_secret_drops_forged_replies(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    seen, gate = Seen(), Gate()
    async with (
        serving(redis_url, ns, agent(seen, gate), secret=SECRET),
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as c,
    ):
        result: list[Any] = []

        async def ask() -> None:
            result.append(await c.request(CAP, "hold", timeout_s=20))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await gate.entered.wait()
            [msg_id] = [m for m in c._reader.events]
            replies = Keys(ns).replies(c.client_id)
            forged = Reply(msg_id=msg_id, status="succeeded", result=encode_payload("forged"))
            forged.kid, forged.sig = c.signer.kid if c.signer else "", b"\x00" * 32
            await r.xadd(replies, {"r": encode(forged)})
            unsigned = Reply(msg_id=msg_id, status="succeeded", result=encode_payload("nosig"))
            await r.xadd(replies, {"r": encode(unsigned)})
            other = Keyring.from_option(ns, OTHER)
            assert other is not None
            signed_by_other = other.sign_reply(
                Reply(msg_id=msg_id, status="succeeded", result=encode_payload("other"))
            )
            await r.xadd(replies, {"r": encode(signed_by_other)})

            async def three_dropped() -> bool:
                return c.forged_replies == 3

            await wait_until(three_dropped, timeout_s=10)
            assert not result  # the call still waits for the real reply
            gate.open()
        assert result == [{"echo": "hold", "sender": c.client_id}]


async def test_an_agent_without_a_secret_is_not_believed(redis_url: str, ns: str) -> None:
    # Its replies are unsigned: a client with a secret drops them (and times out), a
    # client without one takes them; its handlers never see a sender.
    seen = Seen()
    async with (
        serving(redis_url, ns, agent(seen)) as plain,
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as c,
    ):
        assert (await plain.request(CAP, "a", timeout_s=20))["sender"] is None
        with pytest.raises(TimeoutError):
            await c.request(CAP, "b", timeout_s=1)
        assert c.forged_replies == 1
        assert seen.senders == [None, None]


async def test_signing_without_requiring_it_accepts_unsigned(redis_url: str, ns: str) -> None:
    seen = Seen()
    async with (
        serving(redis_url, ns, agent(seen), secret=SECRET) as plain,
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as c,
    ):
        assert (await plain.request(CAP, "a", timeout_s=20))["sender"] is None
        assert (await c.request(CAP, "b", timeout_s=20))["sender"] == c.client_id


async def test_a_stored_reply_replayed_to_another_message_is_taken(redis_url: str, ns: str) -> None:
    # Same idempotency key, a new msg_id: the worker answers from the stored result.
    seen = Seen()
    async with (
        serving(redis_url, ns, agent(seen), secret=SECRET),
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as c,
    ):
        first = await c.request(CAP, "once", idempotency_key="k-1", timeout_s=20)
        again = await c.request(CAP, "once", idempotency_key="k-1", timeout_s=2)
        assert again == first and seen.ran == ["once"]


async def test_a_key_rollover(redis_url: str, ns: str) -> None:
    # The agent already signs with the new key and still accepts the old one; a caller
    # not yet moved on signs with the old key and accepts the new one.
    new = "the-new-team-secret-0123456789"
    seen = Seen()
    async with (
        serving(redis_url, ns, agent(seen), secret=[new, SECRET], require_signed=True),
        Client(redis_url=redis_url, namespace=ns, secret=[SECRET, new]) as old_first,
        Client(redis_url=redis_url, namespace=ns, secret=new) as moved,
    ):
        assert (await old_first.request(CAP, "a", timeout_s=20))["echo"] == "a"
        assert (await moved.request(CAP, "b", timeout_s=20))["echo"] == "b"
        assert old_first.forged_replies == moved.forged_replies == 0


# -- Ed25519: a key pair per identity ---------------------------------------------------
needs_cryptography = pytest.mark.skipif(
    find_spec("cryptography") is None, reason="the Ed25519 mode needs `cryptography`"
)


def _identity(tmp_path: Path, name: str) -> tuple[str, str]:
    private, line = keygen(name)
    f = tmp_path / f"{name}.key"
    f.write_text(private)
    return str(f), line


@needs_cryptography
async def test_per_identity_keys(redis_url: str, ns: str, r: AnyRedis, tmp_path: Path) -> None:
    # The agent and one caller are trusted; an intruder has a key pair of its own, unknown
    # to the trusted file: its messages are dead-lettered, and a reply it forges is dropped.
    agent_key, agent_line = _identity(tmp_path, AGENT)
    caller_key, caller_line = _identity(tmp_path, "billing-service")
    intruder_key, _ = _identity(tmp_path, "intruder")
    trusted = tmp_path / "trusted"
    trusted.write_text(agent_line + caller_line)
    t = str(trusted)
    seen, gate = Seen(), Gate()
    async with (
        serving(
            redis_url,
            ns,
            agent(seen, gate),
            identity_file=agent_key,
            require_signed=True,
            trusted_keys_file=t,
        ),
        Client(
            redis_url=redis_url, namespace=ns, identity_file=caller_key, trusted_keys_file=t
        ) as c,
        Client(
            redis_url=redis_url, namespace=ns, identity_file=intruder_key, trusted_keys_file=t
        ) as x,
    ):
        got = await c.request(CAP, "hi", timeout_s=20)
        assert got == {"echo": "hi", "sender": "billing-service"}  # the name, verified
        await x.send(CAP, "intruding")

        async def one_letter() -> bool:
            return len(await letters(r, ns)) == 1

        await wait_until(one_letter, timeout_s=20)
        [d] = await letters(r, ns)
        assert d.reason == "unauthenticated" and "unknown identity 'intruder'" in d.error

        # A reply forged by the intruder for a call in flight is dropped.
        result: list[Any] = []

        async def ask() -> None:
            result.append(await c.request(CAP, "hold", timeout_s=20))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await gate.entered.wait()
            [msg_id] = list(c._reader.events)
            assert x.signer is not None
            forged = x.signer.sign_reply(
                Reply(msg_id=msg_id, status="succeeded", agent_id=AGENT, result=encode_payload(0))
            )
            await r.xadd(Keys(ns).replies(c.client_id), {"r": encode(forged)})

            async def dropped() -> bool:
                return c.forged_replies == 1

            await wait_until(dropped, timeout_s=10)
            gate.open()
        assert result == [{"echo": "hold", "sender": "billing-service"}]
        assert seen.ran == ["hi", "hold"]


async def test_replies_the_sweeper_writes_are_signed(r: AnyRedis, ns: str) -> None:
    # A parked message whose deadline passed, and a late duplicate of a completed key, are
    # answered by the sweeping runtime: a caller with the secret must be able to take both.
    keys, ring = Keys(ns), Keyring(ns, [SECRET.encode()])
    async with Client(redis=r, namespace=ns, client_id="sw-caller", secret=SECRET) as c:
        late = c.build(CAP, 1, timeout_s=5)
        dup = c.build(CAP, 2, idempotency_key="k-done", timeout_s=5)
    for env in (late, dup):  # as a signing caller's messages wait in Redis
        ring.sign_envelope(env)
    stored = ring.sign_reply(Reply(msg_id="first", status="succeeded", result=encode_payload(7)))
    await r.hset(keys.idem(dup.key), mapping={"done": "1", "status": "succeeded"})
    await r.hset(keys.idem(dup.key), "reply", encode(stored))
    for env in (late, dup):
        await expire(r, keys, env, reason="expired", error="deadline passed", signer=ring)
    got = {
        (rep := decode_reply(f[b"r"])).msg_id: rep
        for _, f in await r.xrange(keys.replies("sw-caller"))
    }
    assert got[late.msg_id].status == "expired" and got[dup.msg_id].status == "succeeded"
    assert all(ring.check_reply(rep) is None for rep in got.values())
    # Without the runtime's keys the same reply is unsigned: a signing caller drops it.
    await expire(r, keys, c.build(CAP, 3, timeout_s=5), reason="expired", error="x")
    unsigned = decode_reply((await r.xrevrange(keys.replies("sw-caller"), count=1))[0][1][b"r"])
    assert ring.check_reply(unsigned) is not None
    # Nor for a message that does not verify: an unsigned (maybe forged) entry naming a
    # caller is answered unsigned, so a signing caller drops it.
    await expire(r, keys, c.build(CAP, 4, timeout_s=5), reason="expired", error="x", signer=ring)
    unsigned = decode_reply((await r.xrevrange(keys.replies("sw-caller"), count=1))[0][1][b"r"])
    assert ring.check_reply(unsigned) == "unsigned"

"""Compact idempotency records (protocol version 2, issue 27): a completed record with a
50-byte result stays in Redis's compact hash encoding and takes at most 300 bytes; its
short stored reply still replays the reply the caller first got, signed or not, and a
record written by protocol version 1 (the whole reply stored) still replays."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from reach import Agent, Client, Context
from reach.connection import AnyRedis
from reach.envelope import Reply, decode_reply, encode, encode_payload, scoped_key
from reach.keys import Keys
from reach.signing import Keyring
from tests.support.agents_messaging import serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

AGENT = "rec-1"
CAP = "rec.echo"
SECRET = "team-secret-0123456789abcdef"
RESULT = "r" * 50  # msgpack: 52 bytes


@pytest.fixture(autouse=True)
def _no_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACH_SECRET", raising=False)
    monkeypatch.delenv("REACH_REQUIRE_SIGNED", raising=False)


def echo(ran: list[Any]) -> Agent:
    app = Agent(AGENT, capabilities=[CAP])

    @app.handler(CAP)
    async def work(payload: Any, ctx: Context) -> Any:
        ran.append(payload)
        return payload

    return app


async def replies(r: AnyRedis, ns: str, client_id: str) -> list[Reply]:
    return [decode_reply(f[b"r"]) for _, f in await r.xrange(Keys(ns).replies(client_id))]


async def test_a_completed_record_with_a_50_byte_result_is_a_listpack_of_at_most_300_bytes(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    ran: list[Any] = []
    async with serving(redis_url, ns, echo(ran)) as c:
        msg_id = await c.send(CAP, RESULT)
        assert await c.result(msg_id, timeout_s=20) == RESULT
        rec = Keys(ns).idem(msg_id)

        async def done() -> bool:
            return await r.hget(rec, "done") == b"1"

        await wait_until(done, what="the record completed")
        h = await r.hgetall(rec)
        # Nothing empty is kept: the claim's fields and an empty error are gone; nor what
        # the record's name says (its msg_id).
        assert not {b"owner", b"lease_until", b"error", b"sent_msg_id", b"msg_id"} & set(h)
        assert h[b"status"] == b"succeeded"
        assert max(len(v) for v in h.values()) <= 64
        assert await r.object("encoding", rec) == b"listpack"
        size = await r.memory_usage(rec, samples=0)
        assert size is not None and size <= 300, size
        # Read back, the record's reply is the one the caller got.
        st = await c.task(msg_id)
        assert st.reply is not None and st.reply.msg_id == msg_id
        assert st.reply.status == "succeeded" and st.reply.agent_id == AGENT
        assert msgspec.msgpack.decode(st.reply.result) == RESULT


@pytest.mark.parametrize("signed", [False, True])
async def test_a_redelivered_message_replays_its_reply_byte_for_byte(
    redis_url: str, ns: str, r: AnyRedis, signed: bool
) -> None:
    ran: list[Any] = []
    ring = Keyring(ns, [SECRET.encode()])
    opts = {"secret": SECRET} if signed else {}
    async with serving(redis_url, ns, echo(ran), **opts) as c:
        env = c.build(CAP, RESULT, timeout_s=20)
        env = msgspec.structs.replace(env, reply_to=f"listener-{env.msg_id}")
        await c.deliver(env)

        async def first() -> list[Reply]:
            return await replies(r, ns, env.reply_to)

        await wait_until(first, what="the first reply")

        async def done() -> bool:
            return await r.hget(Keys(ns).idem(env.key), "done") == b"1"

        await wait_until(done, what="the record completed")
        # The same bytes again in the inbox: a redelivery, answered from the record.
        await r.xadd(Keys(ns).inbox(AGENT, "normal"), {"e": encode(env)})

        async def two() -> list[Reply]:
            got = await replies(r, ns, env.reply_to)
            return got if len(got) >= 2 else []

        one, again = await wait_until(two, what="the replayed reply")
        assert one == again and ran == [RESULT]
        assert (one.sig != b"") == signed
        if signed:
            assert ring.check_reply(again) is None
        # What a record lookup rebuilds is that reply too, signature included.
        st = await c.task(env.msg_id)
        assert st.reply == one


@pytest.mark.parametrize("signed", [False, True])
async def test_a_resend_under_the_key_replays_the_result_for_its_own_msg_id(
    redis_url: str, ns: str, signed: bool
) -> None:
    ran: list[Any] = []
    opts = {"secret": SECRET} if signed else {}
    async with (
        serving(redis_url, ns, echo(ran), **opts),
        Client(redis_url=redis_url, namespace=ns, **opts) as c,
    ):
        assert await c.request(CAP, RESULT, idempotency_key="k-1", timeout_s=20) == RESULT
        assert await c.request(CAP, "other", idempotency_key="k-1", timeout_s=20) == RESULT
        assert ran == [RESULT] and c.forged_replies == 0


@pytest.mark.parametrize("signed", [False, True])
async def test_a_record_of_protocol_version_1_still_replays(
    redis_url: str, ns: str, r: AnyRedis, signed: bool
) -> None:
    # A record written before the upgrade: the whole reply stored, as version 1 did.
    ran: list[Any] = []
    ring = Keyring(ns, [SECRET.encode()])
    stored = Reply(msg_id="first", status="succeeded", result=encode_payload("old"), agent_id=AGENT)
    if signed:
        ring.sign_reply(stored)
    rec = Keys(ns).idem(scoped_key(CAP, "k-old"))
    await r.hset(
        rec,
        mapping={
            "status": "succeeded",
            "done": "1",
            "msg_id": "first",
            "agent_id": AGENT,
            "owner": "",
            "lease_until": 0,
            "error": "",
            "reply": encode(stored),
        },
    )
    opts = {"secret": SECRET} if signed else {}
    async with (
        serving(redis_url, ns, echo(ran), **opts),
        Client(redis_url=redis_url, namespace=ns, **opts) as c,
    ):
        assert await c.request(CAP, "new", idempotency_key="k-old", timeout_s=20) == "old"
        assert ran == [] and c.forged_replies == 0
    async with Client(redis=r, namespace=ns) as c:
        st = await c.task("first")
        assert st.status == "unknown"  # no pointer for a msg_id of another key: by key only
    got = await r.hget(rec, "reply")
    assert got == encode(stored)  # a replay writes nothing

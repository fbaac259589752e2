"""The audit trail (reach.audit): the calls of an ``audited=True`` capability recorded by
the agent that settles them (who, outcome, msg_id; an unaudited capability's never), every
action of the console recorded as the console's, retention trimming old entries, and a
trail Redis refuses never failing the action it records.

The ``reach`` command's actions, ``reach audit --json`` and ``--follow``:
tests/cli/test_audit_cmd.py."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import reach
from reach import audit
from reach.client import Client
from reach.connection import AnyRedis
from reach.envelope import encode, now_ms
from reach.errors import UnknownTask
from reach.keys import Keys
from reach.registry import Registry
from reach.tasks import dead_letter_op
from reach.web.app import create_app
from reach.web.security import Guard, loopback_hosts
from tests.support.agents_messaging import serving
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio
SECRET = "audit-test-secret-0123456789abcdef"
AUDITED, PLAIN = "t.audited", "t.plain"
HOST = "http://127.0.0.1:8090"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REACH_SECRET", "REACH_REQUIRE_SIGNED", audit.ENV_RETENTION, audit.ENV_OPERATOR):
        monkeypatch.delenv(name, raising=False)


def audited_agent() -> reach.Agent:
    app = reach.Agent("aud-1", capabilities=[AUDITED, PLAIN])

    @app.handler(AUDITED, audited=True)
    async def refund(payload: Any, ctx: reach.Context) -> Any:
        if payload == "refuse":
            raise reach.Reject("not refundable")
        return {"refunded": payload}

    @app.handler(PLAIN)
    async def plain(payload: Any, ctx: reach.Context) -> Any:
        return payload

    return app


async def calls(r: AnyRedis, ns: str) -> list[audit.AuditEntry]:
    return await audit.read_audit(r, Keys(ns), kind="call", limit=1000)


async def test_audited_calls_are_recorded_with_who_outcome_and_msg_id(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    app = audited_agent()
    assert app.metadata["audited"] == [AUDITED]
    async with (
        serving(redis_url, ns, app, secret=SECRET) as unsigned,
        Client(redis_url=redis_url, namespace=ns, secret=SECRET, client_id="billing-7") as signed,
    ):
        info = await Registry(r, ns).get("aud-1")
        assert info is not None and info.audited(AUDITED) and not info.audited(PLAIN)
        ok = signed.build(AUDITED, "A-1", timeout_s=20)
        assert await signed.call(ok) == {"refunded": "A-1"}
        refused = signed.build(AUDITED, "refuse", timeout_s=20)
        with pytest.raises(reach.Rejected):
            await signed.call(refused)
        claimed = unsigned.build(AUDITED, "A-2", timeout_s=20)
        assert await unsigned.call(claimed) == {"refunded": "A-2"}
        for i in range(5):  # never recorded
            assert await signed.request(PLAIN, i, timeout_s=20) == i

        async def three() -> list[audit.AuditEntry] | None:
            got = await calls(r, ns)
            return got if len(got) >= 3 else None

        got = await wait_until(three, what="the audited calls' entries")
        by_msg = {e.msg_id: e for e in got}
        assert set(by_msg) == {ok.msg_id, refused.msg_id, claimed.msg_id}, got
        assert all(e.target == AUDITED and e.fields["agent"] == "aud-1" for e in got)
        e = by_msg[ok.msg_id]
        assert (e.who, e.fields["auth"], e.outcome) == ("billing-7", "signed", "succeeded")
        e = by_msg[refused.msg_id]
        assert (e.who, e.fields["auth"], e.outcome) == ("billing-7", "signed", "dead")
        assert e.fields["reason"] == "rejected" and "not refundable" in e.error
        e = by_msg[claimed.msg_id]
        assert (e.who, e.fields["auth"]) == (unsigned.client_id, "claimed")
        # the plain capability's calls settled with the audited ones: none recorded
        assert not [x for x in await audit.read_audit(r, Keys(ns), limit=1000) if x.target == PLAIN]


# -- the console ------------------------------------------------------------------------------
@pytest.fixture
async def console(r: AnyRedis, ns: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(r, ns, Guard(token=None, allowed_hosts=loopback_hosts("127.0.0.1")))
    life = app.router.lifespan_context(app)
    await life.__aenter__()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=HOST) as c:
        yield c
    await life.__aexit__(None, None, None)


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert m, html
    return m.group(1)


async def test_every_console_action_is_recorded_as_the_consoles(
    console: httpx.AsyncClient, r: AnyRedis, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(audit.ENV_OPERATOR, "carol")
    keys = Keys(ns)
    reg = Registry(r, ns)
    _, instance, _ = await register(reg, "sum-1", ["text.summarize"])
    await reg.mark_ready("sum-1", instance_id=instance)
    async with Client(redis=r, namespace=ns) as client:
        env = client.build("text.summarize", {"x": 1}, reply=False)
        pending = await client.send("text.summarize", {"y": 2})
    letter = await r.execute_command(
        *dead_letter_op(
            keys,
            capability="text.summarize",
            reason="rejected",
            data=encode(env),
            msg_id=env.msg_id,
        )
    )
    letter_id = letter.decode() if isinstance(letter, bytes) else str(letter)
    await r.execute_command(*dead_letter_op(keys, capability="t.other", reason="x", data=b"\0"))
    token = _csrf((await console.get("/dlq/purge", params={"cap": "t.other"})).text)

    async def post(path: str, **form: str) -> httpx.Response:
        return await console.post(path, data={**form, "csrf": token})

    assert (await post("/dlq/replay", cap="text.summarize", id=letter_id)).status_code == 303
    assert (await post("/dlq/purge", cap="t.other")).status_code == 303
    assert (await post("/message/cancel", id=pending)).status_code == 303
    assert (await post("/message/answer", id="no-such-task", answer="yes")).status_code == 409
    assert (await post("/agents/drain", id="sum-1")).status_code == 303
    assert audit.current_operator().via == "api"  # the console's name ends with its request

    entries = await audit.read_audit(r, keys, kind="operator", limit=100)
    by_action = {e.action: e for e in entries}
    assert set(by_action) == {"dlq.replay", "dlq.purge", "cancel", "task.answer", "agents.drain"}
    for e in entries:
        assert (e.who, e.via) == ("carol", "web"), e
        assert e.fields["session"] and e.fields["address"], e
    replay = by_action["dlq.replay"]
    assert replay.outcome == "ok" and replay.msg_id == env.msg_id
    assert replay.target == "text.summarize" and '"replayed": 1' in replay.detail
    assert (
        by_action["dlq.purge"].target == "t.other"
        and '"purged": 1' in by_action["dlq.purge"].detail
    )
    assert by_action["cancel"].msg_id == pending and by_action["cancel"].outcome == "ok"
    answer = by_action["task.answer"]
    assert answer.outcome == "error" and "UnknownTask" in answer.error
    assert by_action["agents.drain"].target == "sum-1"

    # the page lists them, newest first, and filters by action
    page = await console.get("/audit")
    assert page.status_code == 200 and 'href="/audit"' in page.text
    shown = re.findall(r'<tr data-action="([^"]+)"', page.text)
    assert shown == ["agents.drain", "task.answer", "cancel", "dlq.purge", "dlq.replay"]
    dlq = await console.get("/audit", params={"action": "dlq", "since": "1h"})
    assert re.findall(r'<tr data-action="([^"]+)"', dlq.text) == ["dlq.purge", "dlq.replay"]
    bad = await console.get("/audit", params={"since": "yesterday"})
    assert 'id="problem"' in bad.text


async def test_library_calls_are_recorded_too(r: AnyRedis, ns: str) -> None:
    """A script calling the library is recorded like a face: the write is in the shared
    function, and the name is the one set for the task."""
    with audit.operator_scope("batch-job"):
        async with Client(redis=r, namespace=ns) as client:
            with pytest.raises(UnknownTask):
                await client.answer("nope", True)
    (e,) = await audit.read_audit(r, Keys(ns))
    assert (e.action, e.who, e.via, e.outcome, e.msg_id) == (
        "task.answer",
        "batch-job",
        "api",
        "error",
        "nope",
    )


async def test_retention_trims_entries_older_than_it(
    r: AnyRedis, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys(ns)
    day_ms = 86_400_000
    for days in (40, 3, 2):  # written long ago (ids carry the time)
        await r.xadd(
            keys.audit, {"kind": "operator", "action": f"old.{days}d"}, id=now_ms() - days * day_ms
        )
    await audit.record(r, keys, action="test.now")  # the default: 30 days
    assert [e.action for e in await audit.read_audit(r, keys)] == ["old.3d", "old.2d", "test.now"]
    monkeypatch.setenv(audit.ENV_RETENTION, "60h")
    assert audit.retention_s() == 60 * 3600
    await audit.record(r, keys, action="test.later")
    assert [e.action for e in await audit.read_audit(r, keys)] == [
        "old.2d",
        "test.now",
        "test.later",
    ]
    await audit.record(r, keys, action="test.last", retention=3600)
    assert [e.action for e in await audit.read_audit(r, keys)] == [
        "test.now",
        "test.later",
        "test.last",
    ]


def test_retention_settings() -> None:
    assert audit.parse_retention("30d") == audit.DEFAULT_RETENTION_S
    assert [audit.parse_retention(t) for t in ("12h", "90m", "3600s", "3600")] == [
        43_200,
        5400,
        3600,
        3600,
    ]
    for bad in ("", "0d", "soon", "-1d", "1w"):
        with pytest.raises(reach.ConfigError, match="REACH_AUDIT_RETENTION"):
            audit.parse_retention(bad)
    assert audit.retention_text(30 * 86_400) == "30d" and audit.retention_text(5400) == "90m"


async def test_a_trail_redis_refuses_never_fails_the_action(
    r: AnyRedis, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(ns)
    await r.set(keys.audit, "not a stream")  # written behind reach's back
    from reach.quotas import get_quotas, set_quotas

    with caplog.at_level(logging.WARNING, logger="reach.audit"):
        await set_quotas(r, keys, max_inbox=5)
    assert (await get_quotas(r, keys)).max_inbox == 5
    assert "audit trail of" in caplog.text and "not written" in caplog.text
    assert await audit.read_audit(r, keys) == []


async def test_the_trail_on_a_cluster(redis_cluster: Any, ns: str) -> None:
    """The trail is one stream in the namespace's slot: an operator action, a cancel
    through a Client's pipelined commands and an audited call all land in it."""
    from reach.connection import connect
    from reach.quotas import set_quotas

    url = redis_cluster.url
    r = await connect(url)
    try:
        keys = Keys(ns)
        with audit.operator_scope("ops"):
            await set_quotas(r, keys, max_inbox=50)
            async with serving(url, ns, audited_agent()) as c:
                assert (await c.cancel("never-sent")).outcome == "unknown"
                msg = c.build(AUDITED, "C-1", timeout_s=20)
                assert await c.call(msg) == {"refunded": "C-1"}

                async def three() -> list[audit.AuditEntry] | None:
                    got = await audit.read_audit(r, keys)
                    return got if len(got) >= 3 else None

                got = await wait_until(three, what="three entries on the cluster")
        assert [(e.action, e.who) for e in got] == [
            ("quota.set", "ops"),
            ("cancel", "ops"),
            ("call", c.client_id),
        ]
        assert got[1].outcome == "error" and got[2].msg_id == msg.msg_id
    finally:
        await r.aclose()

"""The console's pages and guards, in process (httpx on the ASGI app, a real Redis): what
is shown, what an attacker's requests get (no CSRF token, another site's Origin, another
host name, no sign-in, a read-only console), and that the actions do what they say.

The browser walk (live stream, clicks) is tests/cli/test_web_browser.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from reach.client import Client
from reach.connection import AnyRedis, connect
from reach.embedded import RedisServer
from reach.envelope import now_ms
from reach.keys import Keys
from reach.registry import Registry
from reach.tasks import dead_letter_op
from reach.untrusted import safe_text
from reach.web.app import create_app, sent_ms_of
from reach.web.security import Guard, loopback_hosts
from tests.support.registry_helpers import register

pytestmark = pytest.mark.anyio
TOKEN = "t0ken-for-the-tests-0123456789"
HOST = "http://127.0.0.1:8090"


@pytest.fixture
async def make(r: AnyRedis, ns: str) -> AsyncIterator[Any]:
    """make(**guard options) -> an httpx client on a running console app."""
    stack: list[Any] = []

    async def make(**kw: Any) -> httpx.AsyncClient:
        kw.setdefault("token", None)
        kw.setdefault("allowed_hosts", loopback_hosts("127.0.0.1"))
        app = create_app(r, ns, Guard(**kw), interval_s=0.1)
        life = app.router.lifespan_context(app)
        await life.__aenter__()
        stack.append(life)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=HOST)
        stack.append(client)
        return client

    yield make
    for x in reversed(stack):
        await x.__aexit__(None, None, None)


async def _letter(r: AnyRedis, ns: str, cap: str, **kw: Any) -> str:
    op = dead_letter_op(Keys(ns), capability=cap, reason="rejected", data=b"\x00", **kw)
    entry = await r.execute_command(*op)
    return entry.decode() if isinstance(entry, bytes) else str(entry)


async def _ready_agent(r: AnyRedis, ns: str, agent_id: str = "sum-1") -> Registry:
    """A registered, ready agent (no process behind it: its messages stay queued)."""
    reg = Registry(r, ns)
    _, instance, _ = await register(reg, agent_id, ["text.summarize"])
    await reg.mark_ready(agent_id, instance_id=instance)
    return reg


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert m, html
    return m.group(1)


async def test_pages_show_the_namespace_and_escape_what_redis_holds(
    make: Any, r: AnyRedis, ns: str
) -> None:
    reg = Registry(r, ns)
    await register(reg, "sum-1", ["text.summarize"])
    hostile = "<script>alert(1)</script>"
    entry = await _letter(r, ns, "text.summarize", error=hostile, msg_id="m-1")
    c = await make()
    for path in ("/", "/dlq", "/events", "/agent?id=sum-1", "/message"):
        res = await c.get(path)
        assert res.status_code == 200, (path, res.text)
        assert "<script>alert" not in res.text
    dlq = (await c.get("/dlq")).text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dlq
    assert entry in dlq
    letter = await c.get("/dlq/letter", params={"cap": "text.summarize", "id": entry})
    assert "&lt;script&gt;" in letter.text and "m-1" in letter.text
    frame = (await c.get("/api/frame")).json()["frame"]
    assert [a["agent_id"] for a in frame["agents"]] == ["sum-1"]
    agents = (await c.get("/")).text
    assert 'data-agent="sum-1"' in agents and "text.summarize" in agents


async def test_garbage_in_redis_does_not_stop_the_pages(make: Any, r: AnyRedis, ns: str) -> None:
    """Anyone holding the namespace's keys can write anything: an event with markup and
    bytes that are not UTF-8, a dead-letter key that is no stream."""
    keys = Keys(ns)
    await r.xadd(keys.events_of(0), {"type": "<b>x</b>", "agent_id": b"\xff<img src=x>"})
    await r.set(keys.dlq("bad.type"), "not a stream")
    await _letter(r, ns, "text.summarize", error="fine")
    c = await make()
    for path in ("/", "/events", "/dlq", "/dlq?cap=bad.type", "/api/frame"):
        res = await c.get(path)
        assert res.status_code in (200, 400), (path, res.status_code, res.text)
        assert "<img src=x>" not in res.text and "<b>x</b>" not in res.text
    assert "&lt;img src=x&gt;" in (await c.get("/events")).text


async def test_a_message_page_shows_the_task_record(make: Any, r: AnyRedis, ns: str) -> None:
    await _ready_agent(r, ns)
    async with Client(redis=r, namespace=ns) as client:
        msg_id = await client.send("text.summarize", {"text": "hi"})
    c = await make()
    res = await c.get("/message", params={"id": msg_id})
    assert 'id="task-status">pending<' in res.text
    assert "text.summarize" in res.text
    sent = sent_ms_of(msg_id)
    assert sent is not None and abs(sent - now_ms()) < 60_000
    unknown = await c.get("/message", params={"id": "nope"})
    assert 'id="task-status">unknown<' in unknown.text


async def test_actions_need_the_sessions_token_and_the_consoles_origin(
    make: Any, r: AnyRedis, ns: str
) -> None:
    await _letter(r, ns, "text.summarize")
    keys = Keys(ns)
    c = await make()
    confirm = await c.get("/dlq/purge", params={"cap": "text.summarize"})
    assert confirm.status_code == 200 and "Purge 1 dead letters of text.summarize?" in confirm.text
    token = _csrf(confirm.text)
    assert await r.xlen(keys.dlq("text.summarize")) == 1  # asking to confirm changes nothing

    # No token, a wrong one, another session's, another site's Origin: refused, untouched.
    assert (await c.post("/dlq/purge", data={"cap": "text.summarize"})).status_code == 403
    bad = {"cap": "text.summarize", "csrf": "0" * 64}
    assert (await c.post("/dlq/purge", data=bad)).status_code == 403
    async with httpx.AsyncClient(transport=c._transport, base_url=HOST) as other:
        stolen = {"cap": "text.summarize", "csrf": token}
        assert (await other.post("/dlq/purge", data=stolen)).status_code == 403
    evil = {"origin": "http://evil.example"}
    ok_form = {"cap": "text.summarize", "csrf": token}
    assert (await c.post("/dlq/purge", data=ok_form, headers=evil)).status_code == 403
    assert await r.xlen(keys.dlq("text.summarize")) == 1

    res = await c.post("/dlq/purge", data=ok_form, headers={"origin": HOST})
    assert res.status_code == 303 and res.headers["location"] == "/dlq?note=purged&n=1"
    assert await r.exists(keys.dlq("text.summarize")) == 0
    assert "Purged 1 dead letters." in (await c.get(res.headers["location"])).text
    # A note is a code, not text a link can choose.
    spoof = await c.get("/dlq", params={"note": "Your token expired: enter it at evil.example"})
    assert "evil.example" not in spoof.text


async def test_drain_through_the_confirmation(make: Any, r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    await register(reg, "sum-1", ["text.summarize"])
    c = await make()
    page = await c.get("/agents/drain", params={"id": "sum-1"})
    assert "Drain agent sum-1?" in page.text
    info = await reg.get("sum-1")
    assert info is not None and not info.draining
    res = await c.post("/agents/drain", data={"id": "sum-1", "csrf": _csrf(page.text)})
    assert res.status_code == 303
    info = await reg.get("sum-1")
    assert info is not None and info.draining
    unknown = await c.post("/agents/drain", data={"id": "nobody", "csrf": _csrf(page.text)})
    assert unknown.status_code == 400 and "No live agent" in unknown.text


async def test_a_read_only_console_changes_nothing(make: Any, r: AnyRedis, ns: str) -> None:
    entry = await _letter(r, ns, "text.summarize")
    await register(Registry(r, ns), "sum-1", ["text.summarize"])
    c = await make(read_only=True)
    for path in ("/", "/dlq", "/agent?id=sum-1"):
        text = (await c.get(path)).text
        assert "read-only" in text
        assert "/dlq/replay" not in text and "/dlq/purge" not in text
        assert "/agents/drain" not in text
    assert (await c.get("/dlq/replay", params={"id": entry})).status_code == 403
    res = await c.post("/dlq/purge", data={})
    assert res.status_code == 403 and "read-only" in res.text  # before any token check
    assert await r.xlen(Keys(ns).dlq("text.summarize")) == 1


async def test_a_token_guards_every_page_but_the_login(make: Any) -> None:
    c = await make(token=TOKEN, allowed_hosts=None)
    res = await c.get("/dlq")
    assert res.status_code == 303 and res.headers["location"].startswith("/login")
    assert (await c.get("/api/frame")).status_code == 303
    assert (await c.get("/live")).status_code == 401
    assert (await c.post("/dlq/purge", data={})).status_code == 401
    assert (await c.get("/static/console.css")).status_code == 200

    bearer = {"authorization": f"Bearer {TOKEN}"}
    assert (await c.get("/api/frame", headers=bearer)).status_code == 200
    wrong = {"authorization": "Bearer " + "x" * len(TOKEN)}
    assert (await c.get("/api/frame", headers=wrong)).status_code == 303

    login = await c.get("/login")
    form = {"csrf": _csrf(login.text), "token": "not it", "next": "/dlq"}
    assert (await c.post("/login", data=form)).status_code == 401
    form["token"] = TOKEN
    for away in ("//evil.example/", "/\\evil.example/", "https://evil.example/"):
        csrf = _csrf((await c.get("/login")).text)  # each sign-in starts a new session
        res = await c.post("/login", data={**form, "next": away, "csrf": csrf})
        assert res.status_code == 303 and res.headers["location"] == "/", away
    form["csrf"] = _csrf((await c.get("/login")).text)
    res = await c.post("/login", data=form)
    assert res.status_code == 303 and res.headers["location"] == "/dlq"
    assert (await c.get("/dlq")).status_code == 200  # the signed-in cookie
    # A cookie that says "signed in" without the server's signature is no sign-in.
    forged = httpx.AsyncClient(
        transport=c._transport, base_url=HOST, cookies={"reach_web": "abc.1.00"}
    )
    async with forged:
        assert (await forged.get("/dlq")).status_code == 303


async def test_other_host_names_are_refused_on_loopback(make: Any) -> None:
    c = await make()
    assert (await c.get("/", headers={"host": "127.0.0.1:8090"})).status_code == 200
    assert (await c.get("/", headers={"host": "localhost:8090"})).status_code == 200
    rebound = await c.get("/api/frame", headers={"host": "attacker.example:8090"})
    assert rebound.status_code == 421
    assert "frame" not in rebound.text


async def test_replay_sends_the_letter_again(make: Any, r: AnyRedis, ns: str) -> None:
    """Replayed from the console, a dead letter is a message again, and its page is next."""
    await _ready_agent(r, ns)
    async with Client(redis=r, namespace=ns) as client:
        env = client.build("text.summarize", {"x": 1}, reply=False)
    keys = Keys(ns)
    from reach.envelope import encode

    entry = await r.execute_command(
        *dead_letter_op(
            keys,
            capability="text.summarize",
            reason="rejected",
            data=encode(env),
            msg_id=env.msg_id,
        )
    )
    entry_id = entry.decode() if isinstance(entry, bytes) else str(entry)
    c = await make()
    page = await c.get("/dlq/replay", params={"cap": "text.summarize", "id": entry_id})
    assert f"Replay dead letter {entry_id}?" in page.text
    form = {"cap": "text.summarize", "id": entry_id, "csrf": _csrf(page.text)}
    res = await c.post("/dlq/replay", data=form)
    assert res.status_code == 303
    assert res.headers["location"].startswith(f"/message?id={env.msg_id}")
    assert await r.xlen(keys.dlq("text.summarize")) == 0
    assert await r.xlen(keys.inbox("sum-1", "normal")) == 1
    gone = await c.post("/dlq/replay", data=form)
    assert gone.status_code == 409 and "No dead letter" in gone.text


async def test_the_console_says_when_redis_is_gone_and_recovers(
    fresh_redis: RedisServer, ns: str
) -> None:
    """A Redis outage is shown on every page (they keep being served), and the console
    carries on by itself once Redis is back."""
    r = await connect(fresh_redis.url)
    try:
        await register(Registry(r, ns), "sum-1", ["text.summarize"])
        app = create_app(r, ns, Guard(token=None), interval_s=0.1)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=HOST) as c,
        ):
            monitor = app.state.console.monitor
            assert not monitor.error
            await anyio.to_thread.run_sync(fresh_redis.kill)
            with anyio.fail_after(20):
                while not monitor.error:
                    await anyio.sleep(0.05)
            page = await c.get("/")
            assert page.status_code == 200 and "Redis" in page.text and 'class="bad"' in page.text
            assert 'data-agent="sum-1"' in page.text  # the last reading stays on screen
            dlq = await c.get("/dlq")  # read from Redis at request time: said, not a crash
            assert dlq.status_code == 503 and "Redis refused or did not answer" in dlq.text
            await anyio.to_thread.run_sync(fresh_redis.start)
            with anyio.fail_after(30):
                while monitor.error:
                    await anyio.sleep(0.05)
            frame = (await c.get("/api/frame")).json()
            assert frame["error"] == "" and frame["frame"]["agents"][0]["agent_id"] == "sum-1"
    finally:
        await r.aclose()


async def test_a_dead_letter_page_reads_as_a_person_reads_it(
    make: Any, r: AnyRedis, ns: str
) -> None:
    from reach.envelope import Envelope, encode, encode_payload, now_ms

    env = Envelope(
        msg_id="m-tb",
        capability="text.summarize",
        payload=encode_payload({"text": "hi"}),
        sent_ms=now_ms() - 120_000,
        avoid="sum-0",
        busy_waits=2,
        holds=1,
    )
    op = dead_letter_op(
        Keys(ns),
        capability="text.summarize",
        reason="max_attempts",
        data=encode(env),
        error="'txt'",
        error_type="KeyError",
        msg_id="m-tb",
    )
    entry = await r.execute_command(*op, "traceback", "Traceback ...\nKeyError: 'txt'\n")
    c = await make()
    page = (
        await c.get("/dlq/letter", params={"cap": "text.summarize", "id": safe_text(entry)})
    ).text
    assert "KeyError: &#39;txt&#39;" in page and 'id="letter-traceback"' in page
    assert ">2 min ago</time>" in page  # sent, as a time people read (ISO on hover)
    for internal in ("busy_waits", "holds", "avoid", "envelope."):
        assert internal not in page, internal


async def test_the_message_list_lists_scheduled_sends(make: Any, r: AnyRedis, ns: str) -> None:
    await _ready_agent(r, ns)
    async with Client(redis=r, namespace=ns) as client:
        later = await client.send("text.summarize", {"text": "later"}, delay_s=3600)
        sooner = await client.send("text.summarize", {"text": "sooner"}, delay_s=600)
        other = await client.send("text.translate", {"text": "x"}, delay_s=60)
    c = await make()
    # Any other listing says how many wait and links to them.
    res = await c.get("/messages")
    assert 'id="scheduled-link"' in res.text and ">3 scheduled sends</a> wait" in res.text
    res = await c.get("/messages", params={"status": "scheduled"})
    assert res.status_code == 200
    rows = re.findall(r'<tr data-msg="([^"]+)" data-status="scheduled">', res.text)
    assert rows == [other, sooner, later]  # the earliest due first
    # Due times read as people read them (a few ms have passed since the send).
    assert re.search(r">in (59 min|1 h)</time>", res.text) and "3 scheduled in all" in res.text
    res = await c.get("/messages", params={"status": "scheduled", "cap": "text.summarize"})
    rows = re.findall(r'<tr data-msg="([^"]+)" data-status="scheduled">', res.text)
    assert rows == [sooner, later]
    res = await c.get("/messages", params={"status": "scheduled", "agent": "nobody"})
    assert "no scheduled send matches these filters" in res.text
    # Its page says scheduled and offers the cancel.
    page = await c.get("/message", params={"id": later})
    assert 'id="task-status">scheduled<' in page.text and 'id="cancel-msg"' in page.text


async def test_the_message_list_filters_by_agent_and_time(
    make: Any, r: AnyRedis, ns: str, redis_url: str
) -> None:
    """/messages with the agent and since filters (the browser test clicks the status and
    capability ones), and a time it cannot read named on the page."""
    import reach
    from reach.recent import list_messages
    from tests.support.agents_failing import failing_agent
    from tests.support.agents_messaging import serving, wait_status, wait_until

    echo = reach.Agent("echo-w1", capabilities=["web.echo"])

    @echo.handler("web.echo")
    async def run(payload: Any, ctx: reach.Context) -> Any:
        return payload

    async with serving(redis_url, ns, failing_agent(), echo) as client:
        failed = client.build("fail.key", {"no": "txt"}, timeout_s=15, max_attempts=1)
        with pytest.raises(reach.RemoteError):
            await client.call(failed)
        await wait_status(client, failed.msg_id, "dead")
        ok = client.build("web.echo", 1, timeout_s=15)
        assert await client.call(ok) == 1

        async def both() -> bool:  # the index's rows may be held for a moment
            return len((await list_messages(r, Keys(ns))).messages) == 2

        await wait_until(both, what="both messages indexed")
    c = await make()

    async def rows(**params: str) -> list[str]:
        page = await c.get("/messages", params=params)
        assert page.status_code == 200 and 'id="problem"' not in page.text, page.text
        return re.findall(r'<tr data-msg="([0-9a-f]+)"', page.text)

    assert await rows() == [ok.msg_id, failed.msg_id]
    assert await rows(agent="failing-1") == [failed.msg_id]
    assert await rows(agent="echo-w1") == [ok.msg_id]
    assert await rows(since="1h") == [ok.msg_id, failed.msg_id]
    assert await rows(since=str(now_ms() + 3_600_000)) == []  # from an hour ahead: none
    assert await rows(agent="echo-w1", status="failed") == []
    bad = await c.get("/messages", params={"since": "yesterday"})
    assert 'id="problem"' in bad.text and "is not a time" in bad.text


async def test_the_capability_list_shows_each_security_level(
    make: Any, r: AnyRedis, ns: str
) -> None:
    access = {"pay.refund": {"allow": ["role:billing"], "security": "sensitive"}}
    await register(
        Registry(r, ns), "pay-1", ["pay.refund", "pay.quote"], metadata={"access": access}
    )
    c = await make()
    frame = (await c.get("/api/frame")).json()["frame"]
    levels = {x["capability"]: x["security"] for x in frame["capabilities"]}
    assert levels == {"pay.refund": "sensitive", "pay.quote": "public"}
    page = (await c.get("/")).text
    assert ">security</abbr></th>" in page
    assert '<td class="security sensitive">sensitive</td>' in page


async def test_the_agents_page_shows_each_agents_version(make: Any, r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    await register(reg, "sum-old", ["text.summarize"], app_version="1.4")
    await register(reg, "sum-new", ["text.summarize"], app_version="1.5-rc.2")
    c = await make()
    frame = (await c.get("/api/frame")).json()["frame"]
    assert {a["agent_id"]: a["version"] for a in frame["agents"]} == {
        "sum-old": "1.4",
        "sum-new": "1.5-rc.2",
    }
    page = (await c.get("/")).text
    assert "<th>version</th>" in page and "<td>1.5-rc.2</td>" in page
    assert "1.5-rc.2" in (await c.get("/agent", params={"id": "sum-new"})).text

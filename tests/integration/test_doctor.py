"""`reach doctor` on real Redis servers: an evicting Redis, a Redis without persistence and
a user lacking a command reach needs are each flagged with their fix, errors exit 1; a
Client and a worker warn about eviction and persistence once when they start."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator

import pytest
import redis
from reach_cli.app import app
from typer.testing import CliRunner

import reach
from reach import doctor
from reach.embedded import RedisServer, ServerBinary

runner = CliRunner()


def run_doctor(url: str, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    res = runner.invoke(app, ["doctor", "--redis-url", url, "--json", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, json.loads(res.stdout)


def of(report: dict, check: str) -> list[dict]:  # type: ignore[type-arg]
    return [f for f in report["findings"] if f["check"] == check]


@pytest.fixture
def sync(fresh_redis: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(fresh_redis.url)
    yield c
    c.close()


def test_a_well_set_redis_has_no_error(fresh_redis: RedisServer) -> None:
    code, rep = run_doctor(fresh_redis.url)  # AOF on, noeviction
    assert code == 0, rep
    assert rep["status"] in ("ok", "info")
    assert {f["check"] for f in rep["findings"]} >= {
        "version",
        "maxmemory-policy",
        "persistence",
        "maxmemory",
        "topology",
        "cluster",
        "acl",
        "clock",
        "script cache",
        "key scheme",
    }
    assert of(rep, "persistence")[0]["level"] == "ok"
    assert of(rep, "maxmemory-policy")[0]["level"] == "ok"
    assert all(f["level"] == "ok" for f in of(rep, "acl"))


def test_an_evicting_redis_is_an_error_with_its_fix(
    fresh_redis: RedisServer, sync: redis.Redis
) -> None:
    sync.config_set("maxmemory-policy", "allkeys-lru")
    code, rep = run_doctor(fresh_redis.url)
    assert code == 1
    (f,) = of(rep, "maxmemory-policy")
    assert f["level"] == "error" and "allkeys-lru" in f["message"]
    assert "maxmemory-policy noeviction" in f["fix"]
    res = runner.invoke(app, ["doctor", "--redis-url", fresh_redis.url])  # the table
    assert res.exit_code == 1
    assert "ERROR" in res.stdout and "fix: CONFIG SET maxmemory-policy noeviction" in res.stdout


def test_a_redis_without_persistence_is_a_warning_saying_what_a_restart_loses(
    fresh_redis: RedisServer, sync: redis.Redis
) -> None:
    sync.config_set("save", "")
    sync.config_set("appendonly", "no")
    code, rep = run_doctor(fresh_redis.url)
    assert code == 0  # a warning, not an error
    (f,) = of(rep, "persistence")
    assert f["level"] == "warning"
    assert "a restart loses everything" in f["message"] and "idempotency records" in f["message"]
    assert "appendonly yes" in f["fix"]
    sync.config_set("save", "3600 1")
    (f,) = of(run_doctor(fresh_redis.url)[1], "persistence")
    assert f["level"] == "warning" and "since the last snapshot" in f["message"]


def test_a_user_lacking_a_command_is_an_error_naming_the_grant(
    fresh_redis: RedisServer, sync: redis.Redis
) -> None:
    user = f"noeval-{uuid.uuid4().hex[:6]}"
    sync.acl_setuser(
        user,
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-evalsha"],
    )
    url = fresh_redis.url.replace("redis://", f"redis://{user}:pw@")
    code, rep = run_doctor(url)
    assert code == 1
    acl = of(rep, "acl")
    assert {f["level"] for f in acl} == {"error"} and len(acl) == 3  # agent, caller, operator
    for f in acl:
        assert "EVALSHA" in f["message"] and user in f["message"]
        assert f["fix"].startswith(f"ACL SETUSER {user} +evalsha")
    assert "pw@" not in rep["redis_url"]
    # checked from an admin URL for another user: same answer
    code, rep = run_doctor(fresh_redis.url, "--acl-user", user)
    assert code == 1 and "EVALSHA" in of(rep, "acl")[0]["message"]


def test_a_user_of_another_namespace_lacks_its_keys(
    fresh_redis: RedisServer, sync: redis.Redis
) -> None:
    sync.acl_setuser(
        "reach-other",
        enabled=True,
        passwords=["+pw"],
        keys=["reach:other:*", "reach:{other}:*"],
        channels=["*"],
        commands=["+@all"],
    )
    code, rep = run_doctor(fresh_redis.url, "--acl-user", "reach-other", "-n", "prod")
    assert code == 1
    f = of(rep, "acl")[0]
    assert "keys of namespace 'prod'" in f["message"]
    # the exact patterns of reach.acl: none matches a neighbour namespace ('prod:x', 'prodx')
    assert "~reach:{prod}:* " in f["fix"] and "~reach:prod:{* " in f["fix"]
    assert "~reach:prod:* " not in f["fix"]


def test_a_user_that_may_not_ask_gets_how_to_check(
    fresh_redis: RedisServer, sync: redis.Redis
) -> None:
    sync.acl_setuser(
        "plain",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-acl"],
    )
    _, rep = run_doctor(fresh_redis.url.replace("redis://", "redis://plain:pw@"))
    (f,) = of(rep, "acl")
    assert f["level"] == "info" and "--acl-user plain" in f["fix"]


def test_key_scheme_flags_keys_it_does_not_know(
    fresh_redis: RedisServer, sync: redis.Redis
) -> None:
    sync.hset("reach:{ks}:agent:a-1", "state", "active")
    sync.xadd("reach:ks:{a:a-1}:in:normal", {"f": "v"})
    (f,) = of(run_doctor(fresh_redis.url, "-n", "ks")[1], "key scheme")
    assert f["level"] == "ok" and "2 keys" in f["message"]
    sync.set("reach:{ks}:inboxes-v0", "x")
    (f,) = of(run_doctor(fresh_redis.url, "-n", "ks")[1], "key scheme")
    assert f["level"] == "warning" and "reach:{ks}:inboxes-v0" in f["message"]


@pytest.mark.anyio
async def test_client_warns_once_at_start(
    fresh_redis: RedisServer, sync: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    sync.config_set("maxmemory-policy", "allkeys-lru")
    sync.config_set("appendonly", "no")
    sync.config_set("save", "")
    doctor._warned.discard(fresh_redis.url)
    with caplog.at_level(logging.WARNING, logger="reach.doctor"):
        for _ in range(2):
            async with reach.Client(redis_url=fresh_redis.url):
                pass
    msgs = [r.getMessage() for r in caplog.records if r.name == "reach.doctor"]
    assert len(msgs) == 2, msgs  # eviction and persistence, once each
    assert any("allkeys-lru" in m and "noeviction" in m for m in msgs)
    assert any("a restart loses everything" in m for m in msgs)


@pytest.mark.anyio
async def test_agent_warns_once_at_start(
    fresh_redis: RedisServer, sync: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    import anyio

    sync.config_set("maxmemory-policy", "volatile-lru")
    doctor._warned.discard(fresh_redis.url)
    app = reach.Agent("doc-1", capabilities=["doc.x"])

    @app.handler("doc.x")
    async def h(p: object, ctx: reach.Context) -> object:
        return p

    ready = threading.Event()
    with caplog.at_level(logging.WARNING, logger="reach.doctor"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: app.run(redis_url=fresh_redis.url, handle_signals=False, ready_event=ready)
            )
            with anyio.fail_after(30):
                await anyio.to_thread.run_sync(ready.wait)
            app.stop()
    msgs = [r.getMessage() for r in caplog.records if r.name == "reach.doctor"]
    assert len(msgs) == 1 and "volatile-lru" in msgs[0], msgs  # AOF is on: eviction only


@pytest.mark.anyio
async def test_a_throwaway_embedded_server_gets_no_persistence_warning(
    server_binary: ServerBinary, caplog: pytest.LogCaptureFixture
) -> None:
    # `reach demo`'s server (a temporary directory, deleted when it stops) is without
    # persistence by design: warning about it on every start is noise; eviction still warns.
    with RedisServer(binary=server_binary) as srv:
        redis.Redis.from_url(srv.url).config_set("maxmemory-policy", "allkeys-lru")
        doctor._warned.discard(srv.url)
        with caplog.at_level(logging.WARNING, logger="reach.doctor"):
            async with reach.Client(redis_url=srv.url):
                pass
    msgs = [r.getMessage() for r in caplog.records if r.name == "reach.doctor"]
    assert len(msgs) == 1 and "allkeys-lru" in msgs[0], msgs


@pytest.mark.anyio
async def test_no_key_of_everyday_operations_is_unknown(redis_url: str, ns: str) -> None:
    """A real worker, a client and the CLI do what users do (sends, requests with an
    idempotency key, a session, a stream, a retry, a dead letter, a cancel, a scheduled
    send, a capability's limit and a handler's own, quotas, a version split with a
    session pinned to a version, a worker killed mid-handler
    whose inbox the sweeps park): every key they leave has a form in
    reach.keys.LAYOUT, and doctor's key scheme check says so."""
    import anyio
    import redis.asyncio

    from reach.keys import Keys, form_of, scan_patterns
    from tests.support.agents_messaging import wait_eligible, wait_status
    from tests.support.waiting import wait_until
    from tests.support.workers import Workers

    async def keys_known_to_doctor() -> list[str]:
        """The namespace's keys now, each checked to have a form, and doctor's verdict."""
        sync = redis.Redis.from_url(redis_url)
        try:
            keys = [k.decode() for p in scan_patterns(ns) for k in sync.scan_iter(match=p)]
        finally:
            sync.close()
        unknown = [k for k in keys if form_of(k, ns) is None]
        assert not unknown, unknown
        report = (await anyio.to_thread.run_sync(lambda: run_doctor(redis_url, "-n", ns)))[1]
        (f,) = of(report, "key scheme")
        assert f["level"] == "ok" and "follow key scheme" in f["message"], f
        return keys

    async def cli(*args: str) -> None:
        argv = [*args, "--redis-url", redis_url, "--namespace", ns]
        res = await anyio.to_thread.run_sync(lambda: runner.invoke(app, argv))
        assert res.exit_code == 0, (args, res.output, res.exception)

    # the limits' states outlive the test: one start a minute, bursts that let it through
    await cli("caps", "limit", "doc.echo", "1/m", "--burst", "100")
    await cli("quota", "set", "--max-inbox", "1000", "--send-rate", "1/m", "--burst", "1000")
    await cli("caps", "split", "doc.session", "=100")  # the agent states no version
    workers = Workers(redis_url, ns, "tests.support.agents_doctor")
    workers.start("ops_agent")
    try:
        async with reach.Client(redis_url=redis_url, namespace=ns) as client:
            await wait_eligible(client, "doc.echo", ["doc-ops-1"], timeout=60)
            await client.send("doc.echo", {"n": 1})
            assert await client.request("doc.echo", 2, idempotency_key="k-2", timeout_s=30) == 2
            assert await client.request("doc.session", "hi", session_id="s-1", timeout_s=30) == 1
            chunks = [c async for c in client.stream("doc.stream", 3, timeout_s=30)]
            assert chunks == [0, 1, 2]
            assert await client.request("doc.retry", 0, timeout_s=30) == "second time"
            with pytest.raises(reach.Rejected):
                await client.request("doc.reject", 0, timeout_s=30)
            held = await client.send("doc.hold", 0)
            await wait_status(client, held, "running", timeout=30)
            assert (await client.cancel(held)).cancelled
            await wait_status(client, held, "cancelled", timeout=30)
            await client.send("doc.echo", 3, delay_s=3600)  # a scheduled send, due later
            # the worker killed while it runs one: the sweeps evict it and park its inbox
            orphan = await client.send("doc.hold", 1)
            await wait_status(client, orphan, "running", timeout=30)
            # the index of recent messages holds a few rows up to 0.25 s before it writes
            # them (reach._worker.recording): wait for them, the kill below would drop them
            index = redis.asyncio.Redis.from_url(redis_url)

            async def indexed() -> bool:
                return bool(await index.exists(Keys(ns).recent))

            try:
                await wait_until(indexed, timeout_s=30, what="the index of recent messages")
            finally:
                await index.aclose()
            found = await keys_known_to_doctor()
        proc = workers.procs["ops_agent"]
        proc.kill()
        proc.wait(timeout=30)

        async def parked() -> bool:
            await cli("sweep")
            return bool(await r.exists(Keys(ns).parked("doc.hold")))

        r = redis.asyncio.Redis.from_url(redis_url)
        try:
            await wait_until(parked, timeout_s=60, interval_s=0.2, what="the inbox parked")
        finally:
            await r.aclose()
        await cli("dlq", "list")
        found += await keys_known_to_doctor()
    finally:
        workers.stop_all()
    builders = {f.builder for k in found if (f := form_of(k, ns)) is not None}
    # what the operations above leave behind, so the check below checks them
    assert builders >= {
        "agents_of", "agent", "cap_of", "caps_of", "events_of", "inbox", "replies", "idem",
        "task", "session", "session_history", "effects", "dlq", "cancels", "limits",
        "quotas", "rate_state", "agent_rate_state", "send_rate_state", "parked",
        "parked_caps", "recent", "scheduled", "scheduled_envelopes", "splits", "version_pins",
    }, builders  # fmt: skip
    assert len(found) >= 20 and Keys(ns).cancels in found

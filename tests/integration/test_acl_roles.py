"""Least-privilege users on a real Redis with ACLs (``reach acl``, docs/security.md).

One server of the module's own: for namespace ``ns1`` the three users that ``reach acl``
prints are created from its output; a worker runs as the agent user, a Client and ``reach
send`` / ``reach task`` as the caller, the looking and repairing commands as the operator,
and the server's ACL LOG must stay empty (no command reach runs was refused). Then the
ns1 users try real commands on the keys of ``ns2`` and of the prefix-sharing neighbours
``ns1x`` and ``ns1:x``, and every one is refused (NOPERM). The key patterns are checked
against every key form :class:`reach.keys.Keys` builds, so a key-scheme change that the
patterns do not cover fails here.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from reach_cli.app import app
from typer.testing import CliRunner

import reach
from reach import acl
from reach.embedded import RedisServer, ServerBinary
from reach.errors import ConfigError
from reach.keys import CLUSTER_SHARDS, PRIORITIES, Keys
from tests.support.waiting import wait_until

runner = CliRunner()
PASSWORD = "s3cret-acl-pw"
NEIGHBOURS = ("ns2", "ns1x", "ns1:x", "ns1:rx", "ns", "xns1")
FAST: dict[str, Any] = {
    "heartbeat_s": 0.1,
    "lease_s": 0.3,
    "evict_after_s": 0.6,
    "sweep_interval_s": 0.1,
    "retry_base_s": 0.02,
}


def cli(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        args,
        repr(res.exception),
        res.output,
    )
    return res.exit_code, res.stdout, res.stderr


# -- the key patterns against every key form of Keys ----------------------------------------
_STAND_IN = "nsstandin"


def every_key(ns: str) -> list[str]:
    """Every key :class:`Keys` builds for ``ns``, standalone and Cluster shard counts: each
    public method and property is called (with sample ids), so a new key form is covered
    without touching this test. A name :class:`Keys` refuses (``ns1:x``: no ':' in a
    namespace) gets the same key forms with it written in: keys someone wrote behind
    reach's back, which the patterns must not grant either."""
    try:
        Keys(ns)
    except ConfigError:
        return sorted({k.replace(_STAND_IN, ns) for k in every_key(_STAND_IN)})
    out: list[str] = []
    for shards in (1, CLUSTER_SHARDS):
        keys = Keys(ns, shards)
        for name, member in inspect.getmembers(type(keys)):
            if name.startswith("_") or name in ("namespace", "shards"):
                continue
            if isinstance(member, property):
                value = getattr(keys, name)
                if isinstance(value, str) and value.startswith("reach:"):
                    out.append(value)
                continue
            if not callable(member):
                continue
            params = list(inspect.signature(member).parameters)[1:]
            if name.endswith("_of") and params == ["k"]:
                out += [getattr(keys, name)(k) for k in range(shards)]
                continue
            for ident in ("x", "a:b", "{odd}", "agent-1"):
                args: list[Any] = []
                for p in params:
                    if p == "k":
                        args.append(shards - 1)
                    elif p == "priority":
                        args.append(PRIORITIES[0])
                    else:
                        args.append(ident)
                try:
                    value = getattr(keys, name)(*args)
                except (ValueError, TypeError):
                    continue
                if isinstance(value, str) and value.startswith("reach:"):
                    out.append(value)
                elif isinstance(value, list):
                    out += [v for v in value if isinstance(v, str) and v.startswith("reach:")]
    return sorted(set(out))


def test_patterns_cover_every_key_of_the_namespace_and_none_of_another() -> None:
    pats = acl.key_patterns("ns1")
    # plain text and '*' only: fnmatchcase is then Redis's glob
    assert all(not any(c in p for c in "?[]\\") for p in pats), pats
    keys = every_key("ns1")
    assert len(keys) > 40, keys
    for k in keys:
        assert any(fnmatchcase(k, p) for p in pats), f"{k} is not granted by {pats}"
    for other in NEIGHBOURS:
        for k in every_key(other):
            assert not any(fnmatchcase(k, p) for p in pats), f"{k} of {other!r} matches {pats}"


def test_the_printed_lines_name_the_role_commands() -> None:
    code, out, err = cli("acl", "--namespace", "ns1", "--role", "caller")
    assert code == 0, err
    (line,) = out.splitlines()
    assert line.startswith("ACL SETUSER reach-ns1-caller reset on ")
    assert "~reach:{ns1}:*" in line and "~reach:ns1:{*" in line and "+xadd" in line
    assert "+xreadgroup" not in line and "+scan" not in line
    assert "password" in err  # none given: says how to set one
    code, out, _ = cli("acl", "-n", "ns1", "--json")
    assert [u["role"] for u in json.loads(out)["users"]] == list(acl.ROLES)
    code, _, err = cli("acl", "-n", "ns1", "--role", "admin")
    assert code == 2 and err.startswith("error:") and "agent, caller, operator" in err


# -- real users on a real Redis ---------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    from reach.embedded import find_server_binary

    binary: ServerBinary = find_server_binary()
    with RedisServer(binary=binary) as s:
        yield s


@pytest.fixture(scope="module")
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(server.url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def users(
    server: RedisServer, admin: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Role -> URL of its ns1 user, made from `reach acl` output."""
    pw = tmp_path_factory.mktemp("acl") / "pw"
    pw.write_text(PASSWORD + "\n")
    code, out, err = cli("acl", "-n", "ns1", "--password-file", str(pw), "--json")
    assert code == 0, err
    assert PASSWORD not in out
    urls = {}
    for u in json.loads(out)["users"]:
        admin.execute_command("ACL", "SETUSER", u["user"], *u["rules"])
        urls[u["role"]] = server.url.replace("redis://", f"redis://{u['user']}:{PASSWORD}@")
    admin.execute_command("ACL", "LOG", "RESET")
    return urls


# Refused on purpose: the start-up check reads the `save` setting with CONFIG GET, which
# would also show the server's passwords (requirepass, masterauth); without it the check
# says the snapshots are unknown (docs/security.md).
# And ACL DRYRUN: reach doctor checks other users' permissions with it, which an admin's
# URL may (reach doctor --acl-user), the operator not.
EXPECTED_REFUSALS = {"config|get", "acl|dryrun"}


def refused(admin: redis.Redis) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in e.items() if k in ("username", "reason", "object", "context")}
        for e in admin.acl_log(count=1000)
        if e["object"] not in EXPECTED_REFUSALS
    ]


def make_agent(name: str) -> reach.Agent:
    a = reach.Agent(name, capabilities=["acl.echo"])

    @a.handler("acl.echo")
    async def echo(payload: Any, ctx: reach.Context) -> Any:
        if payload == "fail":
            raise ValueError("asked to fail")
        if payload == "stream":  # chunks kept for a resume (keep_chunks.lua), as the agent
            for word in ("one", "two", "three"):
                await ctx.emit(word)
            return "streamed"
        if payload == "ask":  # human input: ask.lua, its channel, the answer read back
            return {"answer": await ctx.ask("ok?", timeout_s=30)}
        if payload == "ask-late":  # and withdraw_ask.lua
            try:
                await ctx.ask("anyone?", timeout_s=0.2)
            except reach.AskTimeout:
                return "no answer"
        if payload == "session":  # a handler's session store, under the agent's user
            await ctx.session.set("turns", 1)
            await ctx.session.append("hello", max_len=10)
            await ctx.session.history()
            await ctx.session.all()
            await ctx.session.delete("turns")
            await ctx.session.clear()
        return {"echo": payload}

    return a


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_each_role_runs_under_its_user_and_nothing_is_refused(
    server: RedisServer, admin: redis.Redis, users: dict[str, str], tmp_path: Path
) -> None:
    agent = make_agent(f"acl-echo-{uuid.uuid4().hex[:6]}")
    agent_done = anyio.Event()
    # quotas in force: every send of the caller reads them and takes from its send rate
    admin.hset(Keys("ns1").quotas, mapping={"max_inbox": "1000", "send_rate": "1000/1s,100"})

    other = reach.Agent(f"acl-other-{uuid.uuid4().hex[:6]}", capabilities=["acl.other"])

    # its calls go to the audit trail; its session cached (a subscription, reads with versions)
    @other.handler("acl.other", audited=True, session="cached")
    async def other_handler(payload: Any, ctx: reach.Context) -> Any:
        if ctx.session_id:
            await ctx.session.set("seen", await ctx.session.get("seen", 0) + 1)
        return payload

    async def serve() -> None:
        try:
            await agent.run(redis_url=users["agent"], namespace="ns1", handle_signals=False, **FAST)
        finally:
            agent_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        # a second agent of the process: idle agents wait on one shared connection
        tg.start_soon(
            lambda: other.run(
                redis_url=users["agent"], namespace="ns1", handle_signals=False, **FAST
            )
        )
        async with reach.Client(redis_url=users["caller"], namespace="ns1") as client:

            async def ready() -> bool:
                try:
                    return bool(await client.eligible("acl.echo"))
                except reach.NoAgentAvailable:
                    return False

            await wait_until(ready, timeout_s=10, what="the agent routable")
            assert await client.request("acl.echo", "hi", timeout_s=10) == {"echo": "hi"}
            msg_id = await client.send("acl.echo", "later")
            scheduled = await client.send("acl.echo", "scheduled", delay_s=0.3)
            assert (await client.cancel(await client.send("acl.echo", "x", delay_s=60))).cancelled
            assert await client.request("acl.echo", "session", session_id="s1", timeout_s=10)
            assert await client.request("acl.echo", "again", idempotency_key="k1", timeout_s=10)
            await client.send_many("acl.echo", ["m1", "m2"])
            assert len(await client.request_many("acl.echo", ["r1", "r2"], timeout_s=10)) == 2
            assert list((await client.broadcast("acl.echo", "all", timeout_s=10)).values()) == [
                {"echo": "all"}
            ]
            assert (await client.task(msg_id)).status
            await client.result(msg_id, timeout_s=10)
            [end] = [c async for c in client.watch(msg_id, timeout_s=10)]
            assert end.final and end.status == "succeeded"
            streamed = client.stream("acl.echo", "stream", timeout_s=10)
            assert [c async for c in streamed] == ["one", "two", "three"]
            resumed = client.resume(streamed.msg_id, after=1, timeout_s=10)  # as the caller
            assert [c async for c in resumed] == ["two", "three"]
            assert resumed.result == "streamed"
            assert await client.result(scheduled, timeout_s=10) == {"echo": "scheduled"}
            await wait_until(lambda: client.eligible("acl.other"), timeout_s=10)
            assert await client.request("acl.other", "x", timeout_s=10) == "x"
            for _ in range(2):
                assert await client.request("acl.other", "x", session_id="s", timeout_s=10) == "x"
            asking = await client.send("acl.echo", "ask")

            async def waits(m: str) -> bool:
                return (await client.task(m)).status == "input_required"

            await wait_until(lambda: waits(asking), timeout_s=10, what="the handler asking")
            assert await client.answer(asking, True) == 1  # answer.lua, as the caller
            assert await client.result(asking, timeout_s=10) == {"answer": True}
            assert await client.request("acl.echo", "ask-late", timeout_s=10) == "no answer"
            by_cli = await client.send("acl.echo", "ask")
            await wait_until(lambda: waits(by_cli), timeout_s=10, what="the handler asking")
            await anyio.sleep(0.3)  # both idle a while: the shared wait
            with pytest.raises(reach.ReachError):
                await client.request("acl.echo", "fail", timeout_s=10)
        op = ("--redis-url", users["operator"], "-n", "ns1")
        caller = ("--redis-url", users["caller"], "-n", "ns1")
        failed = []
        for args in (
            ("send", "acl.echo", '"cli"', *caller),
            ("task", msg_id, *caller),
            ("task", msg_id, "--follow", *caller),
            ("task", "answer", by_cli, "true", *caller),
            ("agents", *op),
            ("agents", "show", agent.agent_id, *op),
            ("caps", *op),
            ("queues", *op),
            ("tasks", "--scheduled", *op),
            ("dlq", "list", *op),
            ("dlq", "show", "DLQ_ID", *op),  # the failed request's, written as it failed
            ("dlq", "replay", "--all", *op),
            ("events", "--count", "5", *op),
            ("sweep", *op),
            ("top", "--once", *op),
            ("doctor", "--acl-role", "operator", *op),
            ("agents", "card", agent.agent_id, *op),
            ("dlq", "purge", "--yes", *op),
            ("agents", "drain", agent.agent_id, *op),
            ("quota", "set", "--max-inbox", "500", "--send-rate", "50/s", *op),
            ("quota", "show", *op),
            ("quota", "clear", *op),
            ("audit", "--json", *op),
        ):
            if "DLQ_ID" in args:  # the dead letter of the failed request
                code, out, err = await anyio.to_thread.run_sync(
                    lambda: cli("dlq", "list", "--json", *op)
                )
                letters = json.loads(out) if code == 0 else []
                assert letters, (code, out, err)
                args = tuple(letters[0]["id"] if a == "DLQ_ID" else a for a in args)
            code, out, err = await anyio.to_thread.run_sync(lambda a=args: cli(*a))
            if code != 0:
                failed.append((args[:3], code, err or out))
        with anyio.fail_after(10):
            await agent_done.wait()
        other.stop()
    assert not failed, failed
    log = refused(admin)
    assert not log, log
    # the trail written by each role: the agent's audited call, the caller's cancel and
    # answers, the operator's changes
    trail = [f for _, f in admin.xrange(Keys("ns1").audit)]
    actions = {f[b"action"].decode() for f in trail}
    assert {"call", "cancel", "task.answer", "dlq.purge", "quota.set"} <= actions, actions


def test_doctor_and_reach_acl_agree(server: RedisServer, users: dict[str, str]) -> None:
    for role in acl.ROLES:
        res = runner.invoke(
            app,
            ["doctor", "--redis-url", server.url, "--json", "-n", "ns1"]
            + ["--acl-user", acl.default_user("ns1", role), "--acl-role", role],
        )
        found = [f for f in json.loads(res.stdout)["findings"] if f["check"] == "acl"]
        assert [f["level"] for f in found] == ["ok"], found
    # the caller's user is no operator: doctor names what it lacks, as info (it fits a role)
    res = runner.invoke(
        app,
        ["doctor", "--redis-url", server.url, "--json", "-n", "ns1"]
        + ["--acl-user", acl.default_user("ns1", "caller")],
    )
    found = {
        f["message"].split(" as ")[-1]: f
        for f in json.loads(res.stdout)["findings"]
        if f["check"] == "acl"
    }
    assert [f["level"] for f in found.values()].count("ok") == 1, found
    lacking = [f for f in found.values() if f["level"] != "ok"]
    assert all(f["level"] == "info" for f in lacking), lacking
    assert any("SCAN" in f["message"] and "+scan" in f["fix"] for f in lacking), lacking


def test_a_missing_permission_is_one_error_line_naming_the_command(
    users: dict[str, str],
) -> None:
    code, out, err = cli("queues", "--redis-url", users["caller"], "-n", "ns1")
    assert code == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "SCAN" in err and "+scan" in err and "reach acl" in err
    assert PASSWORD not in out + err
    # a namespace the user has no keys of
    code, out, err = cli("caps", "--redis-url", users["operator"], "-n", "ns2")
    assert code == 2 and err.startswith("error:") and "key" in err and "--namespace" in err


def test_ns1_users_cannot_touch_another_namespace(
    server: RedisServer, admin: redis.Redis, users: dict[str, str]
) -> None:
    others = [k for ns in NEIGHBOURS for k in every_key(ns)]
    for k in others:
        admin.set(k, "secret")
    script = "return redis.call('GET', KEYS[1])"
    undeclared = "return redis.call('GET', ARGV[1])"
    for role, url in users.items():
        c = redis.Redis.from_url(url)
        try:
            for k in others:
                for cmd in (
                    ("GET", k),
                    ("TYPE", k),
                    ("EXISTS", k),
                    ("HGETALL", k),
                    ("XRANGE", k, "-", "+"),
                    ("SET", k, "mine"),
                    ("XADD", k, "*", "f", "v"),
                    ("DEL", k),
                    ("EVALSHA", admin.script_load(script), "1", k),
                    ("EVALSHA", admin.script_load(undeclared), "0", k),
                ):
                    with pytest.raises(redis.ResponseError) as e:
                        c.execute_command(*cmd)
                    assert "permission" in str(e.value) or "can't" in str(e.value), (role, cmd)
            # no listing of key names: KEYS for nobody, SCAN only for the operator
            # (docs/security.md: Redis cannot filter what SCAN returns)
            with pytest.raises(redis.exceptions.NoPermissionError):
                c.execute_command("KEYS", "*")
            with pytest.raises(redis.exceptions.NoPermissionError):
                c.execute_command("RANDOMKEY")
            if role != "operator":
                with pytest.raises(redis.exceptions.NoPermissionError):
                    c.execute_command("SCAN", "0")
            for cmd in (("FLUSHALL",), ("CONFIG", "GET", "requirepass"), ("SUBSCRIBE", "x")):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    c.execute_command(*cmd)
        finally:
            c.close()
    assert all(admin.get(k) == b"secret" for k in others)


# -- a Redis Cluster: the registry in 16 shards, the users made on every node ---------------------
@pytest.fixture(scope="module")
def cluster_users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, str]]]:
    from reach.embedded import find_server_binary
    from tests.support.cluster import RedisTestCluster

    with RedisTestCluster(binary=find_server_binary(), masters=3) as cluster:
        pw = tmp_path_factory.mktemp("acl-cluster") / "pw"
        pw.write_text(PASSWORD)
        code, out, err = cli("acl", "-n", "ns1", "--password-file", str(pw), "--json")
        assert code == 0, err
        urls = {}
        for node in cluster.nodes:
            c = redis.Redis(port=node.port)
            for u in json.loads(out)["users"]:
                c.execute_command("ACL", "SETUSER", u["user"], *u["rules"])
            c.execute_command("ACL", "LOG", "RESET")
            c.close()
        for u in json.loads(out)["users"]:
            urls[u["role"]] = cluster.url.replace("redis://", f"redis://{u['user']}:{PASSWORD}@")
        yield cluster, urls


@pytest.mark.anyio
async def test_on_a_cluster_each_role_runs_under_its_user(
    cluster_users: tuple[Any, dict[str, str]],
) -> None:
    cluster, users = cluster_users
    agents = [make_agent(f"acl-c{i}-{uuid.uuid4().hex[:4]}") for i in range(4)]
    async with anyio.create_task_group() as tg:
        for a in agents:
            tg.start_soon(
                lambda a=a: a.run(
                    redis_url=users["agent"], namespace="ns1", handle_signals=False, **FAST
                )
            )
        async with reach.Client(redis_url=users["caller"], namespace="ns1") as client:

            async def ready() -> bool:
                try:
                    return len(await client.eligible("acl.echo")) == len(agents)
                except reach.NoAgentAvailable:
                    return False

            await wait_until(ready, timeout_s=15, what="the agents routable on the cluster")
            got = await client.request_many("acl.echo", list(range(8)), timeout_s=10)
            assert got == [{"echo": i} for i in range(8)]
            streamed = client.stream("acl.echo", "stream", timeout_s=10)
            assert [c async for c in streamed] == ["one", "two", "three"]
            resumed = client.resume(streamed.msg_id, after=2, timeout_s=10)
            assert [c async for c in resumed] == ["three"] and resumed.result == "streamed"
        op = ("--redis-url", users["operator"], "-n", "ns1")
        for args in (
            ("agents", *op),
            ("caps", *op),
            ("queues", *op),
            ("dlq", "list", *op),
            ("sweep", *op),
            ("top", "--once", *op),
            ("doctor", "--acl-role", "operator", *op),
        ):
            code, out, err = await anyio.to_thread.run_sync(lambda a=args: cli(*a))
            assert code == 0 or (args[0] == "doctor" and code == 1), (args, out, err)
        for a in agents:
            a.stop()
    log = []
    for node in cluster.nodes:
        c = redis.Redis(port=node.port)
        log += refused(c)
        c.close()
    assert not log, log


def test_doctor_on_a_cluster_checks_the_users_of_every_node(
    cluster_users: tuple[Any, dict[str, str]],
) -> None:
    cluster, _ = cluster_users
    res = runner.invoke(
        app,
        ["doctor", "--redis-url", cluster.url, "--json", "-n", "ns1"]
        + ["--acl-user", acl.default_user("ns1", "agent"), "--acl-role", "agent"],
    )
    rep = json.loads(res.stdout)
    assert not [f for f in rep["findings"] if "could not run" in f["message"]], rep
    assert [f["level"] for f in rep["findings"] if f["check"] == "acl"] == ["ok"], rep
    c = redis.Redis(port=cluster.nodes[0].port)
    c.execute_command("ACL", "SETUSER", "lonely", "on", "nopass", "~*", "+@all")
    c.close()
    res = runner.invoke(
        app, ["doctor", "--redis-url", cluster.url, "--json", "-n", "ns1", "--acl-user", "lonely"]
    )
    (f,) = [f for f in json.loads(res.stdout)["findings"] if f["check"] == "acl"]
    assert (
        f["level"] == "error"
        and "every server" in f["message"]
        and "every Cluster node" in f["fix"]
    )


def test_a_worker_under_the_wrong_user_ends_in_one_error_line(users: dict[str, str]) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    for url, ns, needle in (
        (users["caller"], "ns1", "script"),  # a caller may not run the registry's writes
        (users["agent"], "ns2", "key"),  # an ns1 agent may not serve ns2
    ):
        p = subprocess.run(
            [sys.executable, "-m", "reach_cli.app", "worker", "tests.cli.worker_targets:factory"]
            + ["--redis-url", url, "-n", ns, "--log-level", "error"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
        assert p.returncode == 2 and len(errors) == 1, p.stderr
        assert needle in errors[0] and "reach acl" in errors[0] and "Traceback" not in p.stderr
        assert PASSWORD not in p.stderr


def test_the_lines_piped_to_redis_cli_make_the_users(
    server: RedisServer, admin: redis.Redis
) -> None:
    import shutil
    import subprocess

    if shutil.which("redis-cli") is None:
        pytest.skip("no redis-cli on this machine")
    ns = "team.q-1"  # the namespace alphabet's punctuation
    code, out, err = cli("acl", "-n", ns)
    assert code == 0, err
    p = subprocess.run(
        ["redis-cli", "-p", str(server.port)],
        input=out,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert p.stdout.split() == ["OK"] * 3, p.stdout + p.stderr
    user = acl.default_user(ns, "caller")
    assert user == "reach-team.q-1-caller"
    for key in every_key(ns):
        assert admin.acl_dryrun(user, "GET", key) == b"OK"
    for other in ("team.q-1x", "team.q-1:x", "team.q", "team"):
        for key in every_key(other):
            assert admin.acl_dryrun(user, "GET", key) != b"OK", key
    # a namespace outside the alphabet (white space, a quote) is refused with the reason
    for bad in ("team a", 'team"q'):
        code, _, err = cli("acl", "-n", bad)
        assert code == 2 and err.startswith("error:") and "Invalid namespace" in err


# -- the HTTP faces under their users: the gateway a caller, the console an operator ------
@pytest.mark.anyio
@pytest.mark.timeout(300)
async def test_the_gateway_runs_as_a_caller_and_the_console_as_an_operator(
    admin: redis.Redis, users: dict[str, str], tmp_path: Path
) -> None:
    """docs/security.md: the gateway's Redis user is a ``caller``, the console's an
    ``operator``. A ``reach gateway`` process under the caller user serves A2A calls that
    touch every part of its task store (a blocking send, a stream, get, list, cancel), a
    ``reach web`` process under the operator user serves its pages, and Redis refuses
    nothing."""
    import httpx
    from a2a.helpers.proto_helpers import new_data_part, new_text_part
    from a2a.types.a2a_pb2 import (
        CancelTaskRequest,
        GetTaskRequest,
        ListTasksRequest,
        Message,
        Role,
        SendMessageRequest,
        TaskState,
    )

    from reach.embedded import free_port
    from reach.envelope import new_id
    from tests.support.gateway import (
        a2a_client,
        start_gateway_process,
        start_web_process,
        stop_process,
        wait_card,
    )
    from tests.support.workers import Workers

    def message(part: Any) -> SendMessageRequest:
        return SendMessageRequest(
            message=Message(role=Role.ROLE_USER, message_id=new_id(), parts=[part])
        )

    token = "acl-gateway-token-0123456789"
    admin.acl_log_reset()
    workers = Workers(users["agent"], "ns1", "tests.support.agents_gateway")
    for name in ("echo_agent", "words_agent", "slow_agent"):
        workers.start(name)
    gw_port, web_port = free_port(), free_port()
    gw_log, web_log = tmp_path / "gateway.log", tmp_path / "web.log"
    # with a rate per caller: its bucket (reach:ns1:{h:gateway/t}:rate) is the caller's too
    gw = start_gateway_process(
        users["caller"], "ns1", gw_port, "--rate-per-caller", "1000/s", "--burst", "1000",
        log=gw_log, env={"REACH_GATEWAY_TOKENS": f"t:{token}"},
    )  # fmt: skip
    web = start_web_process(users["operator"], "ns1", web_port, log=web_log)
    url = f"http://127.0.0.1:{gw_port}"
    try:
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(headers=auth, timeout=60) as h:
            for cap in ("gw.echo", "gw.words", "gw.slow"):
                await wait_card(h, f"{url}/caps/{cap}", gw, gw_log)
            echo, _ = await a2a_client(h, f"{url}/caps/gw.echo", streaming=False)
            [resp] = [e async for e in echo.send_message(message(new_data_part({"k": "v"})))]
            task = resp.task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
            got = await echo.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            listed = await echo.list_tasks(ListTasksRequest())
            assert task.id in [t.id for t in listed.tasks]
            words, _ = await a2a_client(h, f"{url}/caps/gw.words")
            seen = [e async for e in words.send_message(message(new_text_part("a b c")))]
            last = seen[-1]
            final = (
                last.task.status.state if last.HasField("task") else last.status_update.status.state
            )
            assert final == TaskState.TASK_STATE_COMPLETED, seen[-1]
            slow, _ = await a2a_client(h, f"{url}/caps/gw.slow", streaming=False)
            req = message(new_data_part(60))
            req.configuration.return_immediately = True
            [first] = [e async for e in slow.send_message(req)]
            done = await slow.cancel_task(CancelTaskRequest(id=first.task.id))
            assert done.status.state == TaskState.TASK_STATE_CANCELED
        async with httpx.AsyncClient(timeout=60) as h:

            async def served() -> bool:
                assert web.poll() is None, web_log.read_text()
                try:
                    return (await h.get(f"http://127.0.0.1:{web_port}/")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_until(served, timeout_s=60, what="the console to serve")
            agent_page = "/agent?id=gw-echo-1"
            for path in ("/messages", f"/message?id={task.id}", "/dlq", "/events", agent_page):
                r = await h.get(f"http://127.0.0.1:{web_port}{path}")
                assert r.status_code == 200, (path, r.text[-500:])
    finally:
        assert stop_process(gw) == 0, gw_log.read_text()[-3000:]
        stop_process(web)
        workers.stop_all()
    log = refused(admin)
    assert not log, log

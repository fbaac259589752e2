"""``reach caps allow|deny|access`` and the security level of ``reach caps`` (reach.authz):
the operator's rules as stored in Redis, listed and cleared, and what a worker's cache of
them sees after a change."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anyio
import pytest
from reach_cli.app import app
from typer.testing import CliRunner

from reach import Agent, Context
from reach.authz import OperatorRules, RulesCache, read_rules
from reach.connection import connect
from reach.keys import Keys
from reach.registry import Registry

runner = CliRunner()


@pytest.fixture
def registered(redis_url: str, ns: str) -> Iterator[None]:
    agent = Agent("pay-1", capabilities=["pay.refund", "pay.quote"])

    async def run(payload: object, ctx: Context) -> None: ...

    agent.handler("pay.refund", allow=["role:billing"], security="sensitive")(run)
    agent.handler("pay.quote")(run)

    async def setup() -> None:
        r = await connect(redis_url)
        await Registry(r, ns).register(
            agent.agent_id,
            instance_id="i1",
            version=1,
            ready=True,
            capabilities=agent.capabilities,
            metadata=agent.metadata,
            lease_ms=60_000,
            evict_after_ms=120_000,
        )
        await r.aclose()

    anyio.run(setup)
    yield


def cli(url: str, ns: str, *args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, [*args, "--redis-url", url, "--namespace", ns])
    return res.exit_code, res.stdout, res.stderr


def stored(url: str, ns: str) -> tuple[int, dict[str, OperatorRules]]:
    async def read() -> tuple[int, dict[str, OperatorRules]]:
        r = await connect(url)
        try:
            return await read_rules(r, Keys(ns))
        finally:
            await r.aclose()

    return anyio.run(read)


def test_the_level_is_a_column_of_reach_caps(registered: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "caps", "--json")
    assert code == 0
    levels = {row["capability"]: row["security"] for row in json.loads(out)}
    assert levels == {"pay.refund": "sensitive", "pay.quote": "public"}
    code, out, _ = cli(redis_url, ns, "caps")
    assert code == 0 and "security" in out and "sensitive" in out


def test_allow_deny_list_and_clear(registered: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "caps", "allow", "pay.refund", "id:alice", "role:ops")
    assert code == 0 and "role:ops" in out and "within a second" in out
    code, out, _ = cli(redis_url, ns, "caps", "deny", "Pay.Refund", "id:mallory", "--json")
    assert code == 0
    assert json.loads(out) == {
        "capability": "pay.refund",
        "operator_allow": ["id:alice", "role:ops"],
        "operator_deny": ["id:mallory"],
    }
    version, rules = stored(redis_url, ns)
    assert version == 2
    assert rules["pay.refund"] == OperatorRules(("id:alice", "role:ops"), ("id:mallory",))

    code, out, _ = cli(redis_url, ns, "caps", "access", "pay.refund", "--json")
    assert code == 0
    assert json.loads(out) == {
        "capability": "pay.refund",
        "security": "sensitive",
        "declared_allow": ["role:billing"],
        "operator_allow": ["id:alice", "role:ops"],
        "operator_deny": ["id:mallory"],
    }
    # Every capability, a rule for one no agent serves (yet) included.
    assert cli(redis_url, ns, "caps", "deny", "pay.later", "*")[0] == 0
    code, out, _ = cli(redis_url, ns, "caps", "access", "--json")
    rows = {row["capability"]: row for row in json.loads(out)}
    assert sorted(rows) == ["pay.later", "pay.quote", "pay.refund"]
    assert rows["pay.quote"]["declared_allow"] is None and rows["pay.later"]["operator_deny"] == [
        "*"
    ]
    code, out, _ = cli(redis_url, ns, "caps", "access")
    assert code == 0 and "id:mallory" in out and "role:billing" in out

    code, out, _ = cli(redis_url, ns, "caps", "allow", "pay.refund", "--clear")
    assert code == 0 and "allow list is empty" in out
    _, rules = stored(redis_url, ns)
    assert rules["pay.refund"] == OperatorRules((), ("id:mallory",))
    assert cli(redis_url, ns, "caps", "deny", "pay.refund", "--clear")[0] == 0
    version, rules = stored(redis_url, ns)
    assert "pay.refund" not in rules and version == 5
    # every change is in the audit trail, as its operator made it
    code, out, _ = cli(redis_url, ns, "--as", "dana", "caps", "deny", "pay.quote", "id:eve")
    assert code == 0
    code, out, _ = cli(redis_url, ns, "audit", "--json")
    trail = [(e["action"], e["target"], e["outcome"]) for e in json.loads(out)]
    assert sorted(trail) == sorted(
        [("caps.allow", "pay.refund", "ok"), ("caps.deny", "pay.refund", "ok"),
         ("caps.deny", "pay.later", "ok"), ("caps.allow", "pay.refund", "ok"),
         ("caps.deny", "pay.refund", "ok"), ("caps.deny", "pay.quote", "ok")]
    )  # fmt: skip
    assert [e["who"] for e in json.loads(out) if e["target"] == "pay.quote"] == ["dana"]


@pytest.mark.parametrize(
    ("args", "err"),
    [
        (["allow", "pay.refund"], "give entries to allow"),
        (["deny", "pay.refund", "id:a", "--clear"], "not both"),
        (["allow", "pay.refund", "billing"], "is not an entry"),
        (["deny", "Not A Cap", "id:a"], "Invalid capability name"),
    ],
)
def test_unclear_commands_say_what_to_do(
    redis_url: str, ns: str, args: list[str], err: str
) -> None:
    code, _, stderr = cli(redis_url, ns, "caps", *args)
    assert code != 0 and err in stderr
    assert stored(redis_url, ns) == (0, {})


def test_a_workers_cache_sees_a_change_after_its_refresh(redis_url: str, ns: str) -> None:
    async def body() -> None:
        r = await connect(redis_url)
        try:
            cache = RulesCache(refresh_s=0.0)  # every look reads the version
            assert await cache.current(r, Keys(ns)) == {}
            await anyio.to_thread.run_sync(cli, redis_url, ns, "caps", "deny", "pay.x", "id:b")
            assert await cache.current(r, Keys(ns)) == {"pay.x": OperatorRules(deny=("id:b",))}
            slow = RulesCache(refresh_s=3600.0)
            await slow.current(r, Keys(ns))
            await anyio.to_thread.run_sync(cli, redis_url, ns, "caps", "deny", "pay.x", "--clear")
            # Within its refresh a cache answers from memory; the new rules come after it.
            assert await slow.current(r, Keys(ns)) == {"pay.x": OperatorRules(deny=("id:b",))}
            assert await cache.current(r, Keys(ns)) == {}
        finally:
            await r.aclose()

    anyio.run(body)


def test_the_help_teaches_the_entries() -> None:
    res = runner.invoke(app, ["caps", "allow", "--help"])
    assert res.exit_code == 0
    assert "id:NAME" in res.stdout and "role:NAME" in res.stdout and "--clear" in res.stdout
    res = runner.invoke(app, ["caps", "deny", "--help"])
    assert "forbidden" in res.stdout and "reach caps deny payments.refund id:mallory" in res.stdout


def test_garbage_in_the_rules_hash_never_stops_the_rules_around_it(redis_url: str, ns: str) -> None:
    """Fields reach did not write (not UTF-8, a version that is no number) are skipped:
    the deny rule written beside them still applies, and a later change still shows."""

    async def body() -> None:
        r = await connect(redis_url)
        try:
            k = Keys(ns).access
            await anyio.to_thread.run_sync(cli, redis_url, ns, "caps", "deny", "pay.x", "id:b")
            await r.hset(k, mapping={b"\xff\xfe": b"1", "deny:pay.x:\xff": b"\xff"})
            await r.hset(k, "version", "not a number")
            cache = RulesCache(refresh_s=0.0)
            assert (await cache.current(r, Keys(ns)))["pay.x"].deny[0] == "id:b"
            await r.hset(k, "version", "7")
            await r.hset(k, "deny:pay.y:id:c", "1")
            assert (await cache.current(r, Keys(ns)))["pay.y"] == OperatorRules(deny=("id:c",))
        finally:
            await r.aclose()

    anyio.run(body)

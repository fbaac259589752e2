"""Idempotency scoped to its owner (issue 13, item 4), against a real Redis and real agents:
a caller's idempotency key names a record of (namespace, capability, signing identity), so
the same key sent to another capability, or by another Ed25519 identity, runs afresh and
never receives the first caller's stored result; the same caller's resend still replays."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from reach import Agent, Client, Context
from reach.connection import AnyRedis
from reach.envelope import caller_key, scoped_key
from reach.keys import Keys
from tests.integration.test_signing import _identity
from tests.support.agents_messaging import serving
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

AGENT = "scope-1"
ECHO, SLOW = "scope.echo", "scope.slow"
SECRET = "team-secret-0123456789abcdef"

needs_cryptography = pytest.mark.skipif(
    find_spec("cryptography") is None, reason="the Ed25519 mode needs `cryptography`"
)


@pytest.fixture(autouse=True)
def _no_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACH_SECRET", raising=False)
    monkeypatch.delenv("REACH_REQUIRE_SIGNED", raising=False)


def agent(runs: list[tuple[str, Any, str | None]]) -> Agent:
    app = Agent(AGENT, capabilities=[ECHO, SLOW])

    @app.handler(ECHO)
    async def echo(payload: Any, ctx: Context) -> Any:
        runs.append((ECHO, payload, ctx.sender))
        return {"echo": payload, "key": ctx.idempotency_key}

    @app.handler(SLOW)
    async def slow(payload: Any, ctx: Context) -> Any:
        runs.append((SLOW, payload, ctx.sender))
        return {"slow": payload}

    return app


def test_a_scoped_key_names_capability_identity_and_key() -> None:
    assert scoped_key(ECHO, "k-1") == "scope.echo||k-1"
    assert scoped_key(ECHO, "k|1", "alice") == "scope.echo|alice|k|1"
    # The caller's own key comes back whole, '|' in it included.
    assert caller_key(scoped_key(ECHO, "k|1", "a/b:c")) == "k|1"
    assert caller_key("m-123") == "m-123"  # a msg_id names its own record


async def test_a_key_used_for_another_capability_runs_that_capability(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    runs: list[tuple[str, Any, str | None]] = []
    async with serving(redis_url, ns, agent(runs)) as c:
        assert await c.request(ECHO, "alice's", idempotency_key="K", timeout_s=20) == {
            "echo": "alice's",
            "key": "K",  # the handler sees the caller's key, not the record's name
        }
        # Before scoping, this returned the echo result stored under "K".
        assert await c.request(SLOW, "other", idempotency_key="K", timeout_s=20) == {
            "slow": "other"
        }
        # The same capability and key: the stored result, the handler not run again.
        assert await c.request(ECHO, "again", idempotency_key="K", timeout_s=20) == {
            "echo": "alice's",
            "key": "K",
        }
        assert [(cap, p) for cap, p, _ in runs] == [(ECHO, "alice's"), (SLOW, "other")]
        keys = Keys(ns)
        assert await r.hget(keys.idem(scoped_key(ECHO, "K")), "status") == b"succeeded"
        assert await r.hget(keys.idem(scoped_key(SLOW, "K")), "status") == b"succeeded"
        assert not await r.exists(keys.idem("K"))  # no unscoped record is written


async def test_task_status_shows_the_callers_own_key(redis_url: str, ns: str) -> None:
    runs: list[tuple[str, Any, str | None]] = []
    async with serving(redis_url, ns, agent(runs)) as c:
        msg_id = await c.send(ECHO, "x", idempotency_key="order-7")

        async def done() -> bool:
            return (await c.task(msg_id)).status == "succeeded"

        await wait_until(done, timeout_s=20)
        st = await c.task(msg_id)
        assert st.idempotency_key == "order-7" and st.capability == ECHO


@needs_cryptography
async def test_another_identitys_key_never_returns_the_first_callers_result(
    redis_url: str, ns: str, r: AnyRedis, tmp_path: Path
) -> None:
    # Both callers are trusted (each may call the agent); they use the same key. Mallory
    # guessing Alice's key must get a run of her own, never Alice's stored result.
    agent_key, agent_line = _identity(tmp_path, AGENT)
    alice_key, alice_line = _identity(tmp_path, "alice")
    mallory_key, mallory_line = _identity(tmp_path, "mallory")
    trusted = tmp_path / "trusted"
    trusted.write_text(agent_line + alice_line + mallory_line)
    t = str(trusted)
    runs: list[tuple[str, Any, str | None]] = []
    async with (
        serving(
            redis_url,
            ns,
            agent(runs),
            identity_file=agent_key,
            require_signed=True,
            trusted_keys_file=t,
        ),
        Client(
            redis_url=redis_url, namespace=ns, identity_file=alice_key, trusted_keys_file=t
        ) as alice,
        Client(
            redis_url=redis_url, namespace=ns, identity_file=mallory_key, trusted_keys_file=t
        ) as mallory,
    ):
        secret_result = {"echo": "alice's secret", "key": "K"}
        assert await alice.request(ECHO, "alice's secret", idempotency_key="K") == secret_result
        got = await mallory.request(ECHO, "mallory's", idempotency_key="K", timeout_s=20)
        assert got == {"echo": "mallory's", "key": "K"}
        # Alice's resend is still a replay of her own result.
        assert await alice.request(ECHO, "changed", idempotency_key="K") == secret_result
        assert runs == [(ECHO, "alice's secret", "alice"), (ECHO, "mallory's", "mallory")]
        keys = Keys(ns)
        assert await r.exists(keys.idem(scoped_key(ECHO, "K", "alice")))
        assert await r.exists(keys.idem(scoped_key(ECHO, "K", "mallory")))


async def test_callers_sharing_a_secret_share_a_scope(redis_url: str, ns: str) -> None:
    # A shared secret proves "a member of the team", not which one: its holders are one
    # scope, as unsigned callers are (docs/concepts.md, *Idempotency scope*).
    runs: list[tuple[str, Any, str | None]] = []
    async with (
        serving(redis_url, ns, agent(runs), secret=SECRET, require_signed=True),
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as one,
        Client(redis_url=redis_url, namespace=ns, secret=SECRET) as two,
    ):
        first = await one.request(ECHO, "first", idempotency_key="K", timeout_s=20)
        assert await two.request(ECHO, "second", idempotency_key="K", timeout_s=20) == first
        assert [p for _, p, _ in runs] == ["first"]

"""A secret given as text is read by the rule ``REACH_SECRET`` is read by: ``"new,old"`` is
a rollover pair for ``Client(secret=...)`` as for the variable, so a client given the
variable's value agrees with the workers that read it (else every reply looks forged)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from reach.client import Client
from reach.errors import NoAgentAvailable
from reach.signing import Keyring, key_id
from tests.support.workers import Workers

NEW = "the-new-team-secret-0123456789"
OLD = "the-old-team-secret-0123456789"


def test_text_secret_and_the_variable_give_the_same_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACH_SECRET", f"{NEW}, {OLD}")
    from_env = Keyring.from_option("ns", None)
    from_text = Keyring.from_option("ns", f"{NEW}, {OLD}")
    assert from_env is not None and from_text is not None
    assert from_text.secrets == from_env.secrets == [NEW.encode(), OLD.encode()]
    assert from_text.kid == key_id(NEW.encode())  # the first signs
    # bytes are one raw key, taken as they are (a random key may hold a comma byte)
    raw = b"0123456789,abcdef-raw-key"
    one = Keyring.from_option("ns", raw)
    assert one is not None and one.secrets == [raw]


async def ready(c: Client) -> None:
    with anyio.fail_after(60):
        while True:
            c.invalidate()
            try:
                if await c.eligible("route.echo"):
                    return
            except NoAgentAvailable:
                pass
            await anyio.sleep(0.05)


@pytest.fixture
def workers(redis_url: str, ns: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workers]:
    monkeypatch.setenv("REACH_SECRET", f"{NEW},{OLD}")  # the worker process reads it
    w = Workers(redis_url, ns, "tests.support.agents_routing")
    yield w
    w.stop_all()


@pytest.mark.anyio
async def test_a_client_given_the_rollover_pair_as_text_gets_its_replies(
    workers: Workers, redis_url: str, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers.start("fast")
    monkeypatch.delenv("REACH_SECRET")  # the client has only its secret= text
    async with Client(redis_url=redis_url, namespace=ns, secret=f"{NEW},{OLD}") as c:
        await ready(c)
        assert await c.request("route.echo", 1, timeout_s=20) == "fast"
        assert c.forged_replies == 0

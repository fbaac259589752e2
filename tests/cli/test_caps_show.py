"""``reach caps show CAP``: a capability's agents, timeout, limit and schemas (what its
handlers' annotations publish with their registration, reach.schemas)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anyio
import msgspec
import pytest
from reach_cli.app import app
from typer.testing import CliRunner

from reach import Agent, Context
from reach.connection import connect
from reach.registry import Registry

runner = CliRunner()


class Doc(msgspec.Struct):
    text: str


@pytest.fixture
def registered(redis_url: str, ns: str) -> Iterator[None]:
    agent = Agent("doc-1", capabilities=["doc.count", "doc.any"])

    @agent.handler("doc.count", timeout_s=12)
    async def count(payload: Doc, ctx: Context) -> int:
        return len(payload.text)

    @agent.handler("doc.any")
    async def anything(payload, ctx):  # type: ignore[no-untyped-def]
        return payload

    async def setup() -> None:
        r = await connect(redis_url)
        # what the worker registers: the agent's capabilities and metadata
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


def test_caps_show_json_and_table(registered: None, redis_url: str, ns: str) -> None:
    code, out, _ = cli(redis_url, ns, "caps", "show", "doc.count", "--json")
    assert code == 0
    got = json.loads(out)
    assert got == {
        "capability": "doc.count",
        "agents": [{"agent_id": "doc-1", "state": "active", "routable": True}],
        "timeout_s": 12.0,
        "limit": None,
        "input_schema": msgspec.json.schema(Doc),
        "output_schema": {"type": "integer"},
    }
    code, out, _ = cli(redis_url, ns, "caps", "show", "doc.any", "--json")
    assert code == 0
    assert json.loads(out)["input_schema"] is None
    code, out, _ = cli(redis_url, ns, "caps", "show", "doc.count")
    assert code == 0
    assert "input schema:" in out and '"required": [' in out and "doc-1 (active)" in out
    assert "output schema:" in out and '"integer"' in out
    code, out, _ = cli(redis_url, ns, "caps", "show", "doc.any")
    assert "input schema: (none published)" in out


def test_caps_show_of_a_capability_nobody_has(redis_url: str, ns: str) -> None:
    code, _, err = cli(redis_url, ns, "caps", "show", "no.such")
    assert code == 2 and "no live agent has capability 'no.such'" in err

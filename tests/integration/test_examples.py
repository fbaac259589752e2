"""Every example runs: the planner, the summariser and the reviewer as real `reach worker`
processes (sub-second leases) hold a two-turn session, and `examples/run_all.py` exits 0."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from reach_cli.app import app
from typer.testing import CliRunner

import reach
from reach.connection import connect
from reach.keys import Keys
from reach.registry import Registry
from tests.unit.test_card import validate_a2a_card

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "--heartbeat-s",
    "0.1",
    "--lease-s",
    "0.3",
    "--evict-after-s",
    "0.6",
    "--sweep-interval-s",
    "0.1",
]
EXAMPLES = {"summarizer-1": "summarizer", "reviewer-1": "reviewer", "planner-1": "planner"}
DOCUMENT = (
    "Consumer groups let several workers share one stream. Each entry stays pending until a "
    "worker acknowledges it. A worker that crashes leaves its entries pending, and they are "
    "delivered again when it comes back. Idempotency keys make sure a handler that already "
    "finished is not run a second time. Deadlines are absolute, so a message that waited too "
    "long is never run. Failed handlers are retried with backoff and then dead-lettered."
)


@pytest.fixture
def example_workers(redis_url: str, ns: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = []
    for module in EXAMPLES.values():
        cmd = [
            sys.executable,
            "-m",
            "reach_cli.app",
            "worker",
            f"examples.{module}:app",
            "--redis-url",
            redis_url,
            "--namespace",
            ns,
            "--log-level",
            "warning",
            *FAST,
        ]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL))
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


async def _all_ready(redis_url: str, ns: str) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)
    try:
        with anyio.fail_after(30):
            while True:
                agents = {a.agent_id: a for a in await reg.agents()}
                if all(i in agents and agents[i].routable for i in EXAMPLES):
                    return
                await anyio.sleep(0.05)
    finally:
        await r.aclose()


@pytest.mark.anyio
async def test_three_examples_hold_a_two_turn_session(
    example_workers: list[subprocess.Popen[bytes]], redis_url: str, ns: str
) -> None:
    await _all_ready(redis_url, ns)
    sid = f"s-{uuid.uuid4().hex[:8]}"
    async with reach.Client(redis_url=redis_url, namespace=ns) as client:
        first = await client.request(
            "assistant.chat", {"text": DOCUMENT, "max_words": 30}, session_id=sid, timeout_s=20
        )
        second = await client.request(
            "assistant.chat", {"ask": "shorter"}, session_id=sid, timeout_s=20
        )
        # without a session, and a follow-up with nothing to summarise: refused for good
        with pytest.raises(reach.Rejected, match="session_id"):
            await client.request("assistant.chat", {"text": DOCUMENT}, timeout_s=20)
        with pytest.raises(reach.Rejected, match="nothing to summarise"):
            await client.request(
                "assistant.chat", {"ask": "shorter"}, session_id=f"{sid}-empty", timeout_s=20
            )

    assert first["turn"] == 1 and first["max_words"] == 30
    assert 0 < len(first["summary"].split()) <= 30
    assert all(s in DOCUMENT for s in re.split(r"(?<=\.) ", first["summary"])), "extractive"
    assert first["review"]["ok"] is True and 0 <= first["review"]["score"] <= 1
    assert first["agents"] == ["planner-1", "summarizer-1", "reviewer-1"]
    # turn 2 had no text: the planner took the document from the session, halved the budget
    assert second["turn"] == 2 and second["max_words"] == 15
    assert 0 < len(second["summary"].split()) <= 15
    assert second["review"]["ok"] is True

    r = await connect(redis_url)
    try:
        history = await reach.Session(r, Keys(ns), sid).history()
    finally:
        await r.aclose()
    assert [h["answer"]["turn"] for h in history] == [1, 2]
    assert [h["request"] for h in history] == [
        {"text": DOCUMENT, "max_words": 30},
        {"ask": "shorter"},
    ]
    assert history[0]["document"] == history[1]["document"] == DOCUMENT
    assert history[1]["answer"] == second


def test_example_agents_publish_their_given_cards(
    example_workers: list[subprocess.Popen[bytes]], redis_url: str, ns: str
) -> None:
    anyio.run(_all_ready, redis_url, ns)
    runner = CliRunner()
    for agent_id, module in EXAMPLES.items():
        res = runner.invoke(
            app, ["agents", "card", agent_id, "--json", "--redis-url", redis_url, "--namespace", ns]
        )
        assert res.exit_code == 0, res.output
        card = json.loads(res.stdout)
        validate_a2a_card(card)
        given = __import__(f"examples.{module}", fromlist=["app"]).app.card
        assert card["description"] == given["description"]
        assert card["version"] == "1.0.0"  # from the agent's metadata
        # The skills as given, plus the schemas reach adds from the handlers' annotations.
        schemas = {"inputSchema", "outputSchema"}
        assert [
            {k: v for k, v in skill.items() if k not in schemas} for skill in card["skills"]
        ] == given["skills"]
        if agent_id == "summarizer-1":  # its payload is a msgspec Struct
            skill = next(s for s in card["skills"] if s["id"] == "text.summarize")
            assert skill["inputSchema"]["$defs"]["SummarizeRequest"]["required"] == ["text"]
        assert card["supportedInterfaces"][-1]["url"] == f"reach://{ns}/{agent_id}"


def test_run_all_script_exits_0() -> None:
    """examples/run_all.py as a user runs it: its own embedded Redis (REACH_REDIS_URL unset)."""
    env = {k: v for k, v in os.environ.items() if k != "REACH_REDIS_URL"}
    res = subprocess.run(
        [sys.executable, "examples/run_all.py"],
        check=False,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "turn 1" in res.stdout and "turn 2" in res.stdout
    assert "2 turns kept in Redis" in res.stdout and "conversation ok" in res.stdout

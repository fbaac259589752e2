"""Run the three example agents and hold a two-turn conversation with the planner.

    python examples/run_all.py            # on an embedded Redis (or $REACH_REDIS_URL)

It starts ``reach worker examples.<name>:app`` for the summariser, the reviewer and the
planner as separate processes, waits until all three are ready, sends two turns of one
session to ``assistant.chat``, prints the answers and the session history, then stops
the workers (SIGTERM: they drain and deregister) and the embedded Redis. Exit code 0
when the conversation went as expected.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import anyio

import reach
from reach.connection import connect
from reach.embedded import resolve_url
from reach.keys import Keys

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "examples"
AGENTS = {"summarizer-1": "summarizer", "reviewer-1": "reviewer", "planner-1": "planner"}
DOCUMENT = (
    "Redis Streams keep an append-only log of entries in memory. Consumer groups let "
    "several workers share one stream, and each entry stays pending until a worker "
    "acknowledges it. reach uses one stream per priority for every agent, so a message "
    "waits in the inbox of the agent that was chosen for it. Agents register their "
    "capabilities and renew a lease with heartbeats. When an agent stops renewing its "
    "lease, it goes on probation and is then evicted, and callers stop routing to it. "
    "Every message carries an idempotency key, so a redelivered message never runs its "
    "handler twice."
)


def start_workers(url: str) -> list[subprocess.Popen[bytes]]:
    procs = []
    for module in AGENTS.values():
        cmd = [
            sys.executable,
            "-m",
            "reach_cli.app",
            "worker",
            f"examples.{module}:app",
            "--redis-url",
            url,
            "--namespace",
            NAMESPACE,
            "--log-level",
            "warning",
        ]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL))
    return procs


async def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    r = await connect(url)
    try:
        reg = reach.Registry(r, NAMESPACE)
        with anyio.fail_after(timeout_s):
            while True:
                agents = {a.agent_id: a for a in await reg.agents()}
                if all(a in agents and agents[a].routable for a in AGENTS):
                    return
                await anyio.sleep(0.05)
    finally:
        await r.aclose()


async def conversation(url: str) -> int:
    session_id = f"chat-{uuid.uuid4().hex[:8]}"
    async with reach.Client(redis_url=url, namespace=NAMESPACE) as client:
        first = await client.request(
            "assistant.chat", {"text": DOCUMENT}, session_id=session_id, timeout_s=20
        )
        print(f"turn 1 ({first['max_words']} words max): {first['summary']}")
        print(f"        review: {json.dumps(first['review'])}")
        second = await client.request(
            "assistant.chat", {"ask": "shorter"}, session_id=session_id, timeout_s=20
        )
        print(f"turn 2 ({second['max_words']} words max): {second['summary']}")
        print(f"        review: {json.dumps(second['review'])}")
    r = await connect(url)
    try:
        history = await reach.Session(r, Keys(NAMESPACE), session_id).history()
    finally:
        await r.aclose()
    print(f"session {session_id}: {len(history)} turns kept in Redis")
    ok = (
        [h["answer"]["turn"] for h in history] == [1, 2]
        and first["turn"] == 1
        and second["turn"] == 2
        and second["max_words"] < first["max_words"]
        and len(second["summary"].split()) <= second["max_words"]
        and first["review"]["ok"]
        and second["review"]["ok"]
    )
    print("conversation ok" if ok else "conversation NOT as expected")
    return 0 if ok else 1


def main() -> int:
    url, server = resolve_url(None)
    if server is not None:
        print(f"embedded {server.binary.origin} server {server.binary.version_str} at {url}")
    procs = start_workers(url)
    try:
        anyio.run(wait_ready, url)
        print("agents ready: " + ", ".join(AGENTS))
        return anyio.run(conversation, url)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())

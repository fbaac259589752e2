"""The gateway's SSE ids and ``Last-Event-ID`` (issue 29 item 6): every event of an A2A
stream carries ``<task_id>/<chunks so far>``; a caller whose connection broke sends the
same ``message/stream`` (or ``tasks/resubscribe``) again with ``Last-Event-ID`` and gets
the chunks after that event, each once, then the end, the message not sent again. Raw HTTP:
the official a2a-sdk client (1.3) neither reads SSE ids nor sends the header."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from reach import Agent, Context
from reach.client import Client
from reach.envelope import new_id
from reach.gateway import Gateway, Tokens
from tests.support.agents_messaging import Gate, effects, serving
from tests.support.gateway import gateway_served, http

pytestmark = pytest.mark.anyio
TOKEN = "t0ken-of-the-resume-tests-0123456789"
BEFORE, AFTER = 5, 300


def gated(gate: Gate) -> Agent:
    """``gw.gated``: counts its runs, streams ``w0``..``w{BEFORE-1}``, waits for ``gate``,
    streams ``w{BEFORE}``..``w{BEFORE+AFTER-1}``, result ``"done"``."""
    app = Agent("gw-gated-1", capabilities=["gw.gated"])

    @app.handler("gw.gated")
    async def words(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        await ctx.redis.hincrby(ctx.keys.effects("gated.runs"), ctx.msg_id, 1)
        for i in range(BEFORE):
            yield f"w{i}"
        await gate.hold()
        for i in range(BEFORE, BEFORE + AFTER):
            yield f"w{i}"
        ctx.result = "done"

    return app


def v03_stream(message_id: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0", "id": 1, "method": "message/stream",
        "params": {"message": {"messageId": message_id, "role": "user", "kind": "message",
                               "parts": [{"kind": "text", "text": "\"go\""}]}},
    }  # fmt: skip


async def events(resp: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The (id, data) of each SSE event of ``resp``."""
    event_id, data = "", ""
    async for line in resp.aiter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()
        elif line == "" and data:
            yield event_id, json.loads(data)
            event_id, data = "", ""


def chunk_text(result: dict[str, Any]) -> str | None:
    """The text of a v0.3 artifact update of the stream artifact, else None."""
    if result.get("kind") == "artifact-update" and result["artifact"]["name"] == "stream":
        [part] = result["artifact"]["parts"]
        return str(part["text"])
    return None


@pytest.fixture
async def fabric(redis_url: str, ns: str) -> AsyncIterator[tuple[str, Client, Gate]]:
    gate = Gate()
    async with serving(redis_url, ns, gated(gate)) as client:
        gw = Gateway(Client(redis_url=redis_url, namespace=ns), tokens=Tokens([("tests", TOKEN)]))
        async with gateway_served(gw) as url:
            yield url, client, gate


async def test_a_broken_stream_continues_after_its_last_event_id(
    fabric: tuple[str, Client, Gate], ns: str
) -> None:
    url, client, gate = fabric
    body = v03_stream(new_id())
    seen: list[tuple[str, dict[str, Any]]] = []
    async with http(TOKEN) as h:
        async with h.stream("POST", f"{url}/caps/gw.gated", json=body) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for event_id, data in events(resp):
                seen.append((event_id, data["result"]))
                if sum(chunk_text(r) is not None for _, r in seen) == 3:
                    break  # the connection breaks after chunk 3
        task_id = seen[0][1]["id"]
        # Every event has an id: the task's, and the chunks sent up to it.
        assert [i for i, _ in seen] == [f"{task_id}/{n}" for n in (0, 1, 2, 3)]
        gate.open()  # chunks 4.. are written while nobody reads
        got: list[str] = []
        ids: list[str] = []
        last: dict[str, Any] = {}
        headers = {"Last-Event-ID": seen[-1][0]}
        async with h.stream("POST", f"{url}/caps/gw.gated", json=body, headers=headers) as resp:
            async for event_id, data in events(resp):
                last = data["result"]
                ids.append(event_id)
                text = chunk_text(last)
                if text is not None:
                    got.append(text)
        assert got == [f"w{i}" for i in range(3, BEFORE + AFTER)]  # each once, in order
        assert ids[: len(got)] == [f"{task_id}/{n}" for n in range(4, BEFORE + AFTER + 1)]
        assert last["kind"] == "status-update" and last["status"]["state"] == "completed"
        assert ids[-1] == f"{task_id}/{BEFORE + AFTER}"
        # The message ran once: the reconnect did not send it again.
        assert await effects(client.redis, ns, "gated.runs") == {task_id: 1}

        # tasks/resubscribe with Last-Event-ID, after the end: the chunks after it, the end.
        sub = {"jsonrpc": "2.0", "id": 2, "method": "tasks/resubscribe", "params": {"id": task_id}}
        headers = {"Last-Event-ID": f"{task_id}/{BEFORE + AFTER - 2}"}
        async with h.stream("POST", f"{url}/caps/gw.gated", json=sub, headers=headers) as resp:
            rows = [(i, d["result"]) async for i, d in events(resp)]
        texts = [t for _, r in rows if (t := chunk_text(r)) is not None]
        assert texts == [f"w{BEFORE + AFTER - 2}", f"w{BEFORE + AFTER - 1}"]
        assert [i for i, _ in rows][:2] == [
            f"{task_id}/{BEFORE + AFTER - 1}",
            f"{task_id}/{BEFORE + AFTER}",
        ]
        results = [r for _, r in rows if r.get("kind") == "artifact-update"]
        assert results[-1]["artifact"]["name"] == "result"
        assert rows[-1][1]["status"]["state"] == "completed"


async def test_v1_streams_carry_ids_and_a_foreign_last_event_id_is_refused(
    fabric: tuple[str, Client, Gate],
) -> None:
    url, _, gate = fabric
    gate.open()
    body = {
        "jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": {"messageId": new_id(), "role": "ROLE_USER",
                               "parts": [{"text": "\"go\""}]}},
    }  # fmt: skip
    async with http(TOKEN, headers={"A2A-Version": "1.0"}) as h:
        async with h.stream("POST", f"{url}/caps/gw.gated", json=body) as resp:
            rows = [(i, d) async for i, d in events(resp)]
        task_id = rows[0][1]["result"]["task"]["id"]
        assert rows[-1][0] == f"{task_id}/{BEFORE + AFTER}"
        assert all(i.startswith(f"{task_id}/") for i, _ in rows)
        # An id the gateway did not write: refused, nothing sent.
        with anyio.fail_after(30):
            r = await h.post(
                f"{url}/caps/gw.gated", json=body, headers={"Last-Event-ID": "not-an-id"}
            )
        text = r.text
        assert "Last-Event-ID" in text and "not an event id" in text
        # Another caller's task: not found.
        async with http("wrong", headers={"A2A-Version": "1.0"}) as other:
            r = await other.post(
                f"{url}/caps/gw.gated", json=body, headers={"Last-Event-ID": f"{task_id}/3"}
            )
            assert r.status_code == 401


async def test_a_late_subscriber_in_the_running_process_gets_true_chunk_numbers(
    fabric: tuple[str, Client, Gate],
) -> None:
    """tasks/resubscribe without Last-Event-ID of a task this gateway process runs (the SDK's
    queue, joined after five chunks): each chunk's id carries its number in the stream, not
    a count from the subscription, so a reconnect from it loses and repeats nothing."""
    url, _, gate = fabric
    body = v03_stream(new_id())
    async with http(TOKEN) as h:
        async with h.stream("POST", f"{url}/caps/gw.gated", json=body) as resp:
            async for _, data in events(resp):
                task_id = data["result"]["id"]
                break
        await gate.entered.wait()  # five chunks written, the handler held
        sub = {"jsonrpc": "2.0", "id": 2, "method": "tasks/resubscribe", "params": {"id": task_id}}
        rows: list[tuple[str, dict[str, Any]]] = []
        async with h.stream("POST", f"{url}/caps/gw.gated", json=sub) as resp:
            async for event_id, data in events(resp):
                rows.append((event_id, data["result"]))
                if len(rows) == 1:
                    gate.open()
        numbered = [(i, t) for i, r in rows if (t := chunk_text(r)) is not None]
        assert numbered, rows
        for event_id, text in numbered:  # chunk k is w{k-1}
            assert event_id == f"{task_id}/{int(text[1:]) + 1}"
        assert numbered[-1][1] == f"w{BEFORE + AFTER - 1}"

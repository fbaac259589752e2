"""``reach mcp``: the official MCP client (``mcp`` SDK), over stdio and streamable HTTP,
against a real ``reach mcp`` process and real ``reach worker`` processes: it lists the live
capabilities with their schemas, calls one, gets progress from a streaming handler,
cancels a running call (the handler sees it), gets a tool error for a refused call, and
sees the tool list follow an agent that comes and goes (docs/mcp.md)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent

from reach.client import Client as ReachClient
from reach.keys import Keys
from tests.support.agents_mcp import Add, Sum
from tests.support.agents_messaging import wait_eligible
from tests.support.gateway import stop_process
from tests.support.waiting import wait_until
from tests.support.workers import ROOT, Workers

pytestmark = pytest.mark.anyio

TOKEN = "mcp-test-token-0123456789abcdef"
FAST_FACE = ["--poll-s", "0.1", "--log-level", "warning"]


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_mcp")
    try:
        yield w
    finally:
        w.stop_all()


def _face_cmd(redis_url: str, ns: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "reach_cli.app", "mcp", "--redis-url", redis_url,
            "--namespace", ns, *FAST_FACE, *extra]  # fmt: skip


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def mcp_client(
    transport: str, redis_url: str, ns: str, tmp_path: Path, *extra: str, **kw: Any
) -> AsyncIterator[Client]:
    """The official client of a ``reach mcp`` process (stdio: the client starts it; http:
    started here, with a token)."""
    if transport == "stdio":
        cmd = _face_cmd(redis_url, ns, "--stdio", *extra)
        params = StdioServerParameters(command=cmd[0], args=cmd[1:], cwd=str(ROOT))
        async with Client(params, **kw) as c:
            yield c
        return
    port = _free_port()
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"model:{TOKEN}\n")
    log = tmp_path / "mcp.log"
    proc = _start(
        _face_cmd(redis_url, ns, "--port", str(port), "--token-file", str(tokens), *extra), log
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:

        async def serving() -> bool:
            assert proc.poll() is None, log.read_text()
            return "serving http://" in log.read_text()

        await wait_until(serving, timeout_s=60, what="reach mcp serving")
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        async with http, Client(streamable_http_client(url, http_client=http), **kw) as c:
            yield c
    finally:
        stop_process(proc)


TRANSPORTS = ["stdio", "http"]


async def _ready(redis_url: str, ns: str, cap: str, agent_id: str) -> None:
    async with ReachClient(redis_url=redis_url, namespace=ns) as rc:
        await wait_eligible(rc, cap, [agent_id])


def _text(result: Any) -> str:
    [content] = result.content
    assert isinstance(content, TextContent)
    return str(content.text)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tools_schemas_call_progress_and_refusal(
    transport: str, workers: Workers, redis_url: str, ns: str, tmp_path: Path
) -> None:
    workers.start("tools_agent")
    await _ready(redis_url, ns, "mcp.add", "mcp-tools-1")
    async with mcp_client(transport, redis_url, ns, tmp_path) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == {"mcp.add", "mcp.words", "mcp.wait", "mcp.refuse"}
        add = tools["mcp.add"]
        # the payload's Struct as an object schema; the result's as the output schema
        assert add.input_schema["type"] == "object"
        assert add.input_schema["required"] == ["a", "b"]
        assert (
            add.input_schema["properties"] == msgspec.json.schema(Add)["$defs"]["Add"]["properties"]
        )
        assert add.output_schema is not None
        assert add.output_schema["properties"]["total"] == {"type": "integer"}
        assert "20 s" in (add.description or "")  # the advertised timeout
        # a str payload is wrapped as {"value": ...}
        assert tools["mcp.wait"].input_schema["properties"]["value"] == {"type": "string"}

        res = await c.call_tool("mcp.add", {"a": 2, "b": 3})
        assert not res.is_error
        got = msgspec.convert(res.structured_content, Sum)
        assert got.total == 5
        assert got.session.startswith("mcp-")  # a reach session per MCP session
        assert got.caller == ("model" if transport == "http" else "")
        again = await c.call_tool("mcp.add", {"a": 1, "b": 1})
        # stdio: one client, one session; a 2026-era HTTP call has no MCP session (the
        # handshake-era one's is tested below)
        same = msgspec.convert(again.structured_content, Sum).session == got.session
        assert same == (transport == "stdio")

        # a streaming handler: each chunk a progress notification, then the result
        seen: list[tuple[float, str | None]] = []

        async def progress(p: float, total: float | None, message: str | None) -> None:
            seen.append((p, message))

        res = await c.call_tool("mcp.words", {"text": "one two three"}, progress_callback=progress)
        assert not res.is_error and _text(res) == "3"
        assert seen == [(1, "one"), (2, "two"), (3, "three")]

        # refused by the agent: a tool error naming the reach error, its reason, what to do
        res = await c.call_tool("mcp.refuse", {"text": "this"})
        assert res.is_error
        text = _text(res)
        assert "Rejected (rejected)" in text and "will not take 'this'" in text
        assert "do not retry as is" in text
        # arguments that do not fit the schema: refused by the worker's validation
        res = await c.call_tool("mcp.add", {"a": "two", "b": 3})
        assert res.is_error
        assert "Rejected (invalid_payload)" in _text(res) and "Expected `int`" in _text(res)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cancelling_a_call_cancels_the_reach_message(
    transport: str, workers: Workers, redis_url: str, ns: str, tmp_path: Path
) -> None:
    workers.start("tools_agent")
    await _ready(redis_url, ns, "mcp.wait", "mcp-tools-1")
    key = Keys(ns).effects("mcp.wait")
    async with (
        ReachClient(redis_url=redis_url, namespace=ns) as rc,
        mcp_client(transport, redis_url, ns, tmp_path) as c,
    ):

        async def marked(value: str) -> bool:
            return await rc.redis.hget(key, "w1") == value.encode()

        async with anyio.create_task_group() as tg:
            tg.start_soon(c.call_tool, "mcp.wait", {"value": "w1"})
            await wait_until(lambda: marked("running"), timeout_s=30, what="the handler running")
            tg.cancel_scope.cancel()  # the MCP client gives the call up
        # the handler saw ctx.cancelled (well before its 30 s)
        await wait_until(lambda: marked("cancelled"), timeout_s=30, what="the handler cancelled")
        # the session goes on: another call is answered
        res = await c.call_tool("mcp.add", {"a": 1, "b": 2})
        assert not res.is_error and res.structured_content["total"] == 3  # type: ignore[index]


async def _tool_names(c: Client) -> set[str]:
    return {t.name for t in (await c.list_tools(cache_mode="refresh")).tools}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_tool_list_follows_agents_coming_and_going(
    transport: str, workers: Workers, redis_url: str, ns: str, tmp_path: Path
) -> None:
    """2026-era clients hear of it on their subscriptions/listen stream."""
    workers.start("tools_agent")
    await _ready(redis_url, ns, "mcp.add", "mcp-tools-1")
    async with mcp_client(transport, redis_url, ns, tmp_path, "--cap", "mcp.add",
                          "--cap", "mcp.extra") as c:  # fmt: skip
        assert await _tool_names(c) == {"mcp.add"}  # --cap: only those named
        async with c.listen(tools_list_changed=True) as sub:
            events = sub.__aiter__()
            extra = workers.start("extra_agent")
            with anyio.fail_after(30):
                await events.__anext__()
            assert await _tool_names(c) == {"mcp.add", "mcp.extra"}
            res = await c.call_tool("mcp.extra", {"text": "here"})
            assert _text(res) == "here"
            assert stop_process(extra) == 0  # drains and deregisters
            with anyio.fail_after(30):
                await events.__anext__()
            assert await _tool_names(c) == {"mcp.add"}


async def test_handshake_era_clients_get_list_changed_and_a_session(
    workers: Workers, redis_url: str, ns: str, tmp_path: Path
) -> None:
    """A handshake-era (2025) client over HTTP: notifications/tools/list_changed on its
    standing stream, and one reach session for its MCP session."""
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", "") == "notifications/tools/list_changed":
            changed.set()

    workers.start("tools_agent")
    await _ready(redis_url, ns, "mcp.add", "mcp-tools-1")
    async with mcp_client(
        "http", redis_url, ns, tmp_path, mode="legacy", message_handler=on_message
    ) as c:
        assert c.server_capabilities.tools is not None
        assert c.server_capabilities.tools.list_changed
        first = await c.call_tool("mcp.add", {"a": 1, "b": 1})
        second = await c.call_tool("mcp.add", {"a": 2, "b": 2})
        s1 = msgspec.convert(first.structured_content, Sum).session
        assert s1 == msgspec.convert(second.structured_content, Sum).session
        workers.start("extra_agent")
        with anyio.fail_after(30):
            await changed.wait()
        assert "mcp.extra" in await _tool_names(c)


async def test_the_face_signs_with_its_own_identity(
    workers: Workers, redis_url: str, ns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Signing on: the worker takes signed messages only, and the face's calls are signed
    with the face's own Ed25519 identity (ctx.sender names it)."""
    from reach.signing import keygen

    lines = []
    for name in ("mcp-face", "mcp-tools"):
        private, line = keygen(name)
        (tmp_path / name).write_text(private)
        lines.append(line)
    trusted = tmp_path / "trusted"
    trusted.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("REACH_IDENTITY_FILE", str(tmp_path / "mcp-tools"))
    monkeypatch.setenv("REACH_TRUSTED_KEYS_FILE", str(trusted))
    monkeypatch.setenv("REACH_REQUIRE_SIGNED", "1")
    workers.start("tools_agent")
    await _ready(redis_url, ns, "mcp.add", "mcp-tools-1")
    face = ["--identity-file", str(tmp_path / "mcp-face"), "--trusted-keys-file", str(trusted)]
    async with mcp_client("stdio", redis_url, ns, tmp_path, *face) as c:
        res = await c.call_tool("mcp.add", {"a": 1, "b": 2})
        assert not res.is_error, res
        assert msgspec.convert(res.structured_content, Sum).signed_by == "mcp-face"
    # without the face's identity, the worker refuses its calls (unauthenticated)
    async with mcp_client("stdio", redis_url, ns, tmp_path) as c:
        res = await c.call_tool("mcp.add", {"a": 1, "b": 2})
        assert res.is_error and "unauthenticated" in _text(res)

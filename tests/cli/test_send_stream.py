"""`reach send --stream`: a real CLI process prints each chunk as it comes (the first while
the handler still runs), then the final result; --json prints one JSON line per chunk."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from reach import Agent, Context
from tests.support.agents_messaging import Gate, serving
from tests.support.workers import ROOT

pytestmark = pytest.mark.anyio


def agent(gate: Gate) -> Agent:
    app = Agent("cli-stream-1", capabilities=["docs.stream", "docs.fail"])

    @app.handler("docs.stream")
    async def stream(payload: dict[str, Any], ctx: Context) -> AsyncIterator[Any]:
        yield "first words"
        await gate.hold()
        yield {"n": 2}
        ctx.result = {"words": payload["words"]}

    @app.handler("docs.fail")
    async def fail(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        yield "before"
        raise ValueError("it broke")

    return app


def send_cmd(redis_url: str, ns: str, cap: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reach_cli.app",
        "send",
        cap,
        '{"words": 3}',
        "--stream",
        "--timeout-s",
        "30",
        "--redis-url",
        redis_url,
        "--namespace",
        ns,
        *extra,
    ]


async def test_send_stream_prints_each_chunk_as_it_comes(redis_url: str, ns: str) -> None:
    gate = Gate()
    async with (
        serving(redis_url, ns, agent(gate)),
        await anyio.open_process(
            send_cmd(redis_url, ns, "docs.stream"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as proc,
    ):
        assert proc.stdout is not None
        out = b""
        with anyio.fail_after(30):  # the first chunk is printed while the handler is held
            while b"\n" not in out:
                out += await proc.stdout.receive()
        assert out == b"first words\n" and not gate._open.is_set()
        gate.open()
        with anyio.fail_after(30):
            async for data in proc.stdout:
                out += data
            assert await proc.wait() == 0
    assert out.decode().splitlines() == ["first words", '{"n": 2}', '{"words": 3}']


async def test_send_stream_json_and_a_failing_handler(redis_url: str, ns: str) -> None:
    gate = Gate()
    gate.open()
    async with serving(redis_url, ns, agent(gate)):
        ok = await anyio.run_process(send_cmd(redis_url, ns, "docs.stream", "--json"), cwd=ROOT)
        lines = [json.loads(line) for line in ok.stdout.decode().splitlines()]
        assert lines == [
            {"chunk": "first words"},
            {"chunk": {"n": 2}},
            {"result": {"words": 3}},
        ]
        bad = await anyio.run_process(
            send_cmd(redis_url, ns, "docs.fail", "--json"), cwd=ROOT, check=False
        )
        assert bad.returncode == 2
        assert [json.loads(line) for line in bad.stdout.decode().splitlines()] == [
            {"chunk": "before"}
        ]
        assert "it broke" in bad.stderr.decode()

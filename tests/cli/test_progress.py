"""Progress of long CLI operations: a rich bar on a terminal, plain lines when piped;
`reach dlq replay --all` uses it."""

from __future__ import annotations

import io

import anyio
import pytest
from reach_cli import common
from reach_cli.app import app
from rich.console import Console
from typer.testing import CliRunner

from reach import scripts
from reach.connection import connect
from reach.envelope import Envelope, encode, new_id
from reach.keys import Keys
from reach.registry import Registry
from reach.tasks import dead_letter_op

runner = CliRunner()


def test_plain_lines_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    with common.progress(250, "replayed") as step:
        for _ in range(250):
            step()
    assert capsys.readouterr().err.splitlines() == [
        "replayed 100/250",
        "replayed 200/250",
        "replayed 250/250",
    ]
    with common.progress(1, "replayed") as step:  # one item: no progress at all
        step()
    assert capsys.readouterr().err == ""


def test_a_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=buf, force_terminal=True, width=100))
    with common.progress(3, "replayed") as step:
        for _ in range(3):
            step()
    out = buf.getvalue()
    assert "replayed" in out and "3/3" in out and "━" in out  # a rich bar
    assert "\n" in out  # the finished bar stays on screen


def test_dlq_replay_all_reports_progress(redis_url: str, ns: str) -> None:
    keys = Keys(ns)

    async def setup() -> None:
        r = await connect(redis_url)
        await Registry(r, ns).register(
            "rp-1",
            instance_id="i",
            version=1,
            capabilities=["t.replay"],
            ready=True,
            lease_ms=60_000,
            evict_after_ms=120_000,
        )
        ops = []
        for _ in range(3):
            env = Envelope(msg_id=new_id(), capability="t.replay")
            ops.append(
                dead_letter_op(
                    keys,
                    capability="t.replay",
                    reason="rejected",
                    data=encode(env),
                    msg_id=env.msg_id,
                )
            )
        await scripts.run_pipeline(r, ops)
        await r.aclose()

    anyio.run(setup)
    res = runner.invoke(
        app, ["dlq", "replay", "--all", "--redis-url", redis_url, "--namespace", ns]
    )
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[0] == "replayed 3, failed 0"
    assert res.stdout.count("no reply stream (no caller)") == 3  # sent without reply_to
    assert res.stderr.splitlines()[-1] == "replayed 3/3"  # piped: plain lines

    async def inbox_len() -> int:
        r = await connect(redis_url)
        try:
            return int(await r.xlen(keys.inbox("rp-1", "normal")))
        finally:
            await r.aclose()

    assert anyio.run(inbox_len) == 3

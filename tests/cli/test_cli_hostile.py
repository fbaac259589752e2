"""Listings print whatever Redis holds safely: anyone holding a namespace's keys can write
its events stream, records and key names. Undecodable bytes are replaced, control
characters (terminal escapes) escaped, rich markup shown as text, a time that is not one
shown as '?' or as it is; never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from reach_cli.app import _print_event, app
from reach_cli.common import json_line, safe_text, table
from typer.testing import CliRunner

from reach.keys import Keys

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

# Values a field may hold once read: what a tolerant reader makes of bytes, or worse.
HOSTILE_VALUES: list[Any] = [
    "abc",
    "",
    None,
    -1,
    0,
    10**30,
    2**63,
    1.5,
    float("nan"),
    float("inf"),
    True,
    b"\xff\xfe",
    "\udcff\udcfe",
    "\ud800",
    "\x1b[31mred\x1b[0m",
    "\x1b]0;owned\x07",
    "a\nb\tc",
    "[/red]",
    "[bold]x[/bold]",
    "[link=file:///etc/passwd]x[/link]",
    "é🤖",
    "x" * 5000,
    ["a", 1],
    {"k": b"\xff"},
]


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=repr)
@pytest.mark.parametrize("as_json", [False, True])
def test_print_event_prints_any_field_value(
    value: Any, as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    for field in ("ts", "agent_id", "type", "id", "instance_id"):
        e = SimpleNamespace(id="1-0", type="registered", agent_id="a-1", instance_id="i", ts=1)
        setattr(e, field, value)
        _print_event(e, as_json)
        out = capsys.readouterr().out
        out.encode("utf-8")  # printable: no lone surrogates
        assert "\x1b" not in out and "\x07" not in out
        if as_json:
            json.loads(out)  # strict JSON: one object
        else:
            assert out.count("\n") == 1  # one event, one line


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=repr)
def test_table_cells_and_titles_are_plain_text(
    value: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    table(f"title {safe_text(value)}", ["a", "b"], [(value, "ok"), ("ok", value)])
    out = capsys.readouterr().out
    assert "\x1b]" not in out and "\x07" not in out
    if value == "[/red]":
        assert "[/red]" in out  # shown, not taken as markup
    json.loads(json_line({"v": value}))


def test_json_of_a_deeply_nested_value_is_cut_not_a_crash() -> None:
    deep: Any = None
    for _ in range(990):  # as deep as a stored result decodes
        deep = [deep]
    out = json.loads(json_line({"result": deep}))
    depth = 0
    node = out["result"]
    while isinstance(node, list):
        node, depth = node[0], depth + 1
    assert 50 < depth < 990 and "nested deeper" in node


def _xadd_raw(sync_r: redis.Redis, key: str, fields: dict[bytes, bytes]) -> None:
    sync_r.execute_command("XADD", key, "*", *[x for kv in fields.items() for x in kv])


@pytest.fixture
def hostile_events(sync_r: redis.Redis, ns: str) -> str:
    key = Keys(ns).events
    _xadd_raw(
        sync_r,
        key,
        {
            b"type": b"registered",
            b"agent_id": b"good-1",
            b"instance_id": b"i",
            b"ts": b"1700000000000",
        },
    )
    _xadd_raw(sync_r, key, {b"type": b"registered", b"agent_id": b"bad-ts", b"ts": b"abc"})
    _xadd_raw(sync_r, key, {b"type": b"registered", b"agent_id": b"huge-ts", b"ts": b"9" * 40})
    _xadd_raw(
        sync_r,
        key,
        {
            b"type": b"\x1b[31m[/red]",
            b"agent_id": b"\xff\xfe-bytes",
            b"instance_id": b"\xc1",
            b"ts": b"-5",
        },
    )
    _xadd_raw(sync_r, key, {b"junk": b"\x00"})  # no field it expects at all
    _xadd_raw(sync_r, key, {b"type": b"ready", b"agent_id": b"good-2", b"ts": b"1700000000001"})
    return key


def test_events_lists_hostile_entries_safely(hostile_events: str, redis_url: str, ns: str) -> None:
    res = runner.invoke(app, ["events", "--redis-url", redis_url, "-n", ns])
    assert res.exception is None, repr(res.exception)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert len(lines) == 6, res.stdout
    assert "good-1" in lines[0] and "good-2" in lines[-1]
    assert "bad-ts" in lines[1] and lines[1].startswith("?")
    assert "\ufffd" in lines[3] and "\x1b" not in res.stdout and "[/red]" in lines[3]

    res = runner.invoke(app, ["events", "--json", "--redis-url", redis_url, "-n", ns])
    assert res.exception is None, repr(res.exception)
    rows = json.loads(res.stdout)
    assert [r["agent_id"] for r in rows][:3] == ["good-1", "bad-ts", "huge-ts"]
    assert rows[-1]["agent_id"] == "good-2"


def test_events_follow_prints_hostile_entries_safely(
    hostile_events: str, redis_url: str, ns: str
) -> None:
    # --follow prints the past ones first, one line each (with --json one object each),
    # then waits: a process of its own, stopped once the last past entry is out.
    for extra in ([], ["--json"]):
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reach_cli.app",
                "events",
                "--follow",
                *extra,
                "--redis-url",
                redis_url,
                "-n",
                ns,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert p.stdout is not None
            lines = [p.stdout.readline() for _ in range(6)]
            assert b"good-2" in lines[-1], (lines, p.poll())
            for ln in lines:
                ln.decode("utf-8")  # valid UTF-8 whatever was stored
                assert b"\x1b" not in ln
                if extra:
                    json.loads(ln)
        finally:
            p.terminate()
            _, err = p.communicate(timeout=20)
        assert b"Traceback" not in err, err


def test_listings_survive_hostile_key_names(sync_r: redis.Redis, redis_url: str, ns: str) -> None:
    keys = Keys(ns)
    sync_r.xadd(keys.inbox("ok-1", "high"), {"x": "1"})
    sync_r.execute_command("XADD", keys.dlq("cap").encode() + b"\xff", "*", "reason", "x")
    sync_r.execute_command(
        "XADD", f"reach:{ns}:{{a:".encode() + b"\xff\xfe}:in:high", "*", "x", "1"
    )
    for args in (
        ["queues"],
        ["queues", "--json"],
        ["dlq", "list"],
        ["dlq", "list", "--json"],
        ["top", "--once", "--interval", "0"],
        ["top", "--once", "--json", "--interval", "0"],
    ):
        res = runner.invoke(app, [*args, "--redis-url", redis_url, "-n", ns])
        assert res.exception is None, (args, repr(res.exception))
        assert res.exit_code == 0, (args, res.output)
        res.stdout.encode("utf-8")

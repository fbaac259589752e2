"""The console's parts that need no server: its guard, its charts, its command's checks,
and the core staying free of the web framework."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from reach_cli.app import app
from typer.testing import CliRunner

from reach.web.charts import _nice_max, line_chart
from reach.web.security import Guard, Session, is_loopback, loopback_hosts

ROOT = Path(__file__).resolve().parents[2]


def test_import_reach_loads_no_web_framework() -> None:
    code = (
        "import sys, reach, reach.admin, reach.overview, reach_cli.app\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('starlette', 'uvicorn', 'jinja2', 'reach.web') or m.startswith('reach.web'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_session_cookie_cannot_be_forged() -> None:
    g = Guard(token="x" * 20)
    s = g.new_session(signed_in=True)
    value = g.cookie_value(s)
    assert g.read_cookie(f"reach_web={value}") == s
    sid, _, mac = value.split(".")
    assert g.read_cookie(f"reach_web={sid}.1.{'0' * len(mac)}") is None
    # A signed-out cookie with its flag turned to "signed in" keeps the wrong signature.
    out_mac = g.cookie_value(Session(sid, False)).rsplit(".", 1)[1]
    assert g.read_cookie(f"reach_web={sid}.0.{out_mac}") == Session(sid, False)
    assert g.read_cookie(f"reach_web={sid}.1.{out_mac}") is None
    assert Guard(token="x" * 20).read_cookie(f"reach_web={value}") is None  # another secret
    for junk in ("", "reach_web=", "reach_web=a.b.c", 'reach_web="\\x00', "other=1"):
        assert g.read_cookie(junk) is None


def test_csrf_tokens_belong_to_their_session() -> None:
    g = Guard(token=None)
    a, b = g.new_session(), g.new_session()
    assert g.csrf_ok(a, g.csrf_token(a))
    assert not g.csrf_ok(b, g.csrf_token(a))
    assert not g.csrf_ok(a, "")


def test_bearer_and_hosts() -> None:
    g = Guard(token="s3cret-token-0123456789", allowed_hosts=loopback_hosts("127.0.0.1"))
    assert g.bearer_ok("Bearer s3cret-token-0123456789")
    assert g.bearer_ok("bearer  s3cret-token-0123456789 ")
    assert not g.bearer_ok("Basic s3cret-token-0123456789")
    assert not g.bearer_ok("Bearer s3cret")
    assert not Guard(token=None).bearer_ok("Bearer ")
    for ok in ("127.0.0.1:8090", "localhost", "LOCALHOST:1", "[::1]:8090"):
        assert g.host_ok(ok), ok
    for bad in ("evil.example", "127.0.0.1.evil.example:8090", "", None):
        assert not g.host_ok(bad), bad
    assert g.origin_ok(None, "127.0.0.1:8090")
    assert g.origin_ok("http://127.0.0.1:8090", "127.0.0.1:8090")
    assert not g.origin_ok("http://evil.example", "127.0.0.1:8090")
    assert not g.origin_ok("null", "127.0.0.1:8090")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]")
    assert is_loopback("localhost") and not is_loopback("0.0.0.0")
    assert not is_loopback("192.0.2.1") and not is_loopback("example.org")


def test_charts_escape_and_leave_gaps() -> None:
    svg = line_chart(
        "a <b> & c",
        [1000, 2000, 3000, 4000],
        [("x<y", [1.0, None, 3.0, 4.0]), ("z", [None, None, None, None])],
        window_s=10,
    )
    assert "<b>" not in svg and "a &lt;b&gt; &amp; c" in svg and "x&lt;y 4" in svg
    assert svg.count("<polyline") == 1  # 3.0 -> 4.0; the lone 1.0 is a dot
    assert svg.count("<circle") == 1
    assert "z -" in svg
    assert line_chart("empty", [], [("a", [])]).endswith("</svg>")
    assert [_nice_max(v) for v in (0, 0.3, 1, 7, 12, 4500)] == [1, 0.5, 1, 10, 20, 5000]


runner = CliRunner()


def test_a_console_open_to_the_network_needs_a_token(tmp_path: Path) -> None:
    res = runner.invoke(app, ["web", "--host", "0.0.0.0", "--redis-url", "redis://127.0.0.1:1"])
    assert res.exit_code == 2
    assert "token" in res.stderr and "REACH_WEB_TOKEN" in res.stderr
    short = tmp_path / "token"
    short.write_text("short\n")
    res = runner.invoke(
        app, ["web", "--token-file", str(short), "--redis-url", "redis://127.0.0.1:1"]
    )
    assert res.exit_code == 2 and "at least 16" in res.stderr
    res = runner.invoke(app, ["web", "--interval", "0", "--redis-url", "redis://127.0.0.1:1"])
    assert res.exit_code == 2 and "--interval" in res.stderr


@pytest.mark.parametrize("name", ["console.js", "console.css"])
def test_the_static_files_are_small_and_fetch_nothing_elsewhere(name: str) -> None:
    text = (ROOT / "reach" / "web" / "static" / name).read_text()
    assert len(text) < 8_000
    assert "http://" not in text and "https://" not in text and "//cdn" not in text


def test_totals_count_a_shared_inbox_once_and_cancelled_apart() -> None:
    from reach.overview import Sample, frame_data
    from reach.registry import AgentInfo

    agent = AgentInfo(agent_id="a-1", capabilities=["text.a", "text.b"], state="active")
    s = Sample(
        mono=1.0,
        ts_ms=1,
        agents=[agent],
        capabilities=[("text.a", 1), ("text.b", 1)],
        depth={"a-1": {"high": 0, "normal": 35, "low": 0}},
        dlq={"text.a": 5},
        dlq_cancelled={"text.a": 2},
    )
    f = frame_data(s, None, "ns")
    a, b = f["capabilities"]
    assert (a["queued"], a["shared"], b["queued"], b["shared"]) == (35, ["text.b"], 35, ["text.a"])
    assert f["totals"]["queued"] == 35  # one inbox, counted once
    assert (a["dead_letters"], a["failed"], a["cancelled"]) == (5, 3, 2)
    assert (f["totals"]["failed"], f["totals"]["cancelled"]) == (3, 2)


def test_times_read_relative_with_the_exact_time_on_hover() -> None:
    from reach.web.app import _ago

    now = 1_700_000_000_000
    html = str(_ago(now - 90_000, now))
    assert ">1 min ago</time>" in html
    assert 'title="2023-11-14T22:11:50.000Z"' in html and 'datetime="2023-11-14T' in html
    assert ">just now<" in str(_ago(now, now)) and ">in 5 s<" in str(_ago(now + 5000, now))
    assert str(_ago(0, now)) == "-" and str(_ago("x", now)) == "-"

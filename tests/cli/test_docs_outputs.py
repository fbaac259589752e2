"""Every command docs/cli.md documents is run by a test, and prints what the document
shows: here, each one against a real Redis with an agent serving (tables by their title
and columns, lines by their documented form, --json by its keys); the long-running ones
(a worker, a Redis server, benchmarks, the chaos run, the tour) by the tests named in
ELSEWHERE, which check their output."""

from __future__ import annotations

import json
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

import reach
from reach import Agent, Context
from tests.support.agents_messaging import serving, wait_status

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
CLI_MD = ROOT / "docs" / "cli.md"

# Commands whose run takes a process of its own or minutes: the test that runs each one
# and checks its output.
ELSEWHERE = {
    "redis": ("tests/cli/test_cli_redis.py", '"redis"'),
    "worker": ("tests/cli/test_routable_gauge.py", '"worker"'),
    "bench": ("tests/cli/test_cli_bench.py", '"bench"'),
    "bench-scaling": ("tests/cli/test_scaling.py", "bench-scaling"),
    "chaos": ("tests/chaos/test_chaos.py", '"chaos"'),
    "demo": (".ci/run", "reach demo --fast"),  # a minute of worker processes: CI runs it
    "acl": ("tests/integration/test_acl_roles.py", '"acl"'),
    "web": ("tests/cli/test_web_browser.py", '"web"'),  # a server, read in a browser
    "gateway": ("tests/cli/test_gateway_cmd.py", "start_gateway_process"),
    "mcp": ("tests/integration/test_mcp.py", '"mcp"'),
    "mcp-proxy": ("tests/integration/test_mcp_remote.py", '"mcp-proxy"'),
    "tasks": ("tests/cli/test_tasks_cmd.py", '"tasks"'),
    "caps split": ("tests/cli/test_split_cmd.py", '"split"'),
    "task answer": ("tests/cli/test_answer_cmd.py", '"answer"'),
    "audit": ("tests/cli/test_audit_cmd.py", '"audit", "--json"'),
    # with an agent whose handlers declare rules (reach.authz)
    "caps allow": ("tests/cli/test_caps_access.py", '"allow"'),
    "caps deny": ("tests/cli/test_caps_access.py", '"deny"'),
    "caps access": ("tests/cli/test_caps_access.py", '"access"'),
}
RUN_HERE = {
    "init",
    "doctor",
    "caps",
    "caps limit",
    "caps show",
    "quota set",
    "quota show",
    "quota clear",
    "keys secret",
    "keys keygen",
    "agents",
    "agents show",
    "agents card",
    "agents drain",
    "events",
    "queues",
    "top",
    "send",
    "task show",
    "cancel",
    "dlq list",
    "dlq show",
    "dlq replay",
    "dlq purge",
    "sweep",
}


def documented() -> set[str]:
    return set(
        re.findall(r"^### `reach ([a-z -]+?)(?: [A-Z_\[\]]+)*`$", CLI_MD.read_text(), re.MULTILINE)
    )


def test_every_documented_command_is_run_by_a_test() -> None:
    assert documented() == RUN_HERE | set(ELSEWHERE)
    for name, (path, needle) in ELSEWHERE.items():
        assert needle in (ROOT / path).read_text(), f"{path} does not run reach {name}"


def agent() -> Agent:
    app = Agent("docs-1", capabilities=["docs.echo", "docs.refuse"], metadata={"region": "eu"})

    @app.handler("docs.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        return {"echo": payload}

    @app.handler("docs.refuse")
    async def refuse(payload: Any, ctx: Context) -> Any:
        raise reach.Reject("no")

    return app


class Cli:
    def __init__(self, url: str, ns: str) -> None:
        self.url, self.ns = url, ns

    async def __call__(self, *args: str, code: int | None = 0, common: bool = True) -> str:
        """The command's stdout, its exit code checked (``code`` None: 1 when its output
        names an ERROR, else 0)."""
        extra = ["--redis-url", self.url, "--namespace", self.ns] if common else []
        res = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli_app, [*args, *extra]))
        want = code if code is not None else (1 if "ERROR" in res.stdout else 0)
        assert res.exit_code == want, (args, res.exit_code, res.output, res.exception)
        return str(res.stdout)

    async def json(self, *args: str, code: int = 0) -> Any:
        return json.loads(await self(*args, "--json", code=code))


def title_and_columns(out: str, title: str, *columns: str) -> None:
    lines = out.splitlines()
    assert lines[0].strip() == title, out
    header = next(ln for ln in lines if ln.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == list(columns), header


async def test_documented_outputs(
    redis_url: str, ns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = Cli(redis_url, ns)
    monkeypatch.chdir(tmp_path)
    # reach init: "wrote /path/reach.toml: redis_url = URL"
    out = await cli("init", "--redis-url", redis_url, common=False)
    assert out.strip() == f"wrote {tmp_path.resolve() / 'reach.toml'}: redis_url = {redis_url}"
    # reach doctor: a heading line, one line per check, a summary; --json status
    out = await cli("doctor", code=None)
    lines = out.splitlines()
    assert lines[0] == f"reach doctor: {redis_url}, namespace {ns!r}"
    assert re.fullmatch(r"\d+ error\(s\), \d+ warning\(s\)", lines[-1]), lines[-1]
    assert any(re.match(r"\s*(ok|warn|ERROR|info)\s+version\s", ln) for ln in lines), out

    # reach quota set / show / clear: "quotas of 'NS': ..." (one line), --json its fields
    out = await cli("quota", "set", "--max-inbox", "1000")
    assert out.strip() == (
        f"quotas of {ns!r}: max inbox 1000 messages per agent; clients apply it within a second"
    )
    out = await cli("quota", "set", "--send-rate", "100/s", "--burst", "20")
    shown = (
        f"quotas of {ns!r}: max inbox 1000 messages per agent; send rate 100/s (burst 20) "
        "per caller identity"
    )
    assert out.strip() == shown + "; clients apply it within a second"
    assert (await cli("quota", "show")).strip() == shown
    assert await cli.json("quota", "show") == {
        "max_inbox": 1000, "send_rate": "100/s", "send_rate_per_s": 100.0, "burst": 20,
    }  # fmt: skip
    out = await cli("quota", "clear", "--send-rate")
    assert out.strip() == f"quotas of {ns!r}: max inbox 1000 messages per agent"
    assert (await cli("quota", "clear")).strip() == f"quotas of {ns!r}: none"

    async with serving(redis_url, ns, agent()) as client:
        # reach caps limit: "CAP: at most LIMIT (N starts/s over every agent)..."
        out = await cli("caps", "limit", "docs.echo", "600/m", "--burst", "10")
        assert out.strip() == (
            "docs.echo: at most 600/m (burst 10) (10 starts/s over every agent); workers "
            "apply it within a second"
        )
        assert await cli.json("caps", "limit", "docs.echo") == {
            "capability": "docs.echo", "limit": "600/m (burst 10)", "per_second": 10.0, "burst": 10,
        }  # fmt: skip
        title_and_columns(
            await cli("caps"), f"capabilities in {ns!r}", "capability", "agents", "routable",
            "timeout", "limit", "security",
        )  # fmt: skip
        assert await cli.json("caps") == [
            {"capability": "docs.echo", "agents": 1, "routable": 1, "timeout_s": None,
             "limit": "600/m (burst 10)", "security": "public"},
            {"capability": "docs.refuse", "agents": 1, "routable": 1, "timeout_s": None,
             "limit": None, "security": "public"},
        ]  # fmt: skip
        # caps show: a field/value table, then the schemas; --json its fields
        title_and_columns(
            await cli("caps", "show", "docs.echo"), "docs.echo",
            "field", "value",
        )  # fmt: skip
        assert set(await cli.json("caps", "show", "docs.echo")) == {
            "capability", "agents", "timeout_s", "limit", "input_schema", "output_schema",
        }  # fmt: skip
        out = await cli("caps", "limit", "docs.echo", "--clear")
        assert out.strip() == "docs.echo: no rate limit (removed)"
        [a] = await cli.json(
            "agents", "--cap", "docs.echo", "--state", "active", "--where", "region=eu"
        )
        assert (a["agent_id"], a["state"], a["routing"], a["ready"], a["draining"]) == (
            "docs-1",
            "active",
            "routable",
            True,
            False,
        )
        out = await cli("agents")
        assert "docs-1" in out and "routable" in out and "region=eu" in out
        shown = await cli.json("agents", "show", "docs-1")
        assert {"lease_ms", "evict_after_ms", "max_queue", "card", "metadata"} <= set(shown)
        card = await cli.json("agents", "card", "docs-1")
        assert card["name"] and isinstance(card.get("skills"), list)
        # events: "HH:MM:SS.mmm  registered    docs-1"
        out = await cli("events")
        assert re.search(r"^\d\d:\d\d:\d\d\.\d{3}  registered\s+docs-1$", out, re.MULTILINE), out
        # send: a msg_id; --wait: the result as JSON; task: its status
        msg_id = (await cli("send", "docs.echo", '{"text": "hi"}')).strip()
        assert re.fullmatch(r"[0-9a-f]{32}", msg_id)
        await wait_status(client, msg_id, "succeeded")
        out = await cli("send", "docs.echo", '{"text": "hi"}', "--wait", "--timeout-s", "10")
        assert json.loads(out) == {"echo": {"text": "hi"}}
        t = await cli.json("task", msg_id)
        assert (t["status"], t["result"], t["agent_id"]) == (
            "succeeded",
            {"echo": {"text": "hi"}},
            "docs-1",
        )
        # cancel: a finished message is left as it is (exit 1); an unknown one too
        c = await cli.json("cancel", msg_id, code=1)
        assert c == {"msg_id": msg_id, "outcome": "already_done", "status": "succeeded"}
        title_and_columns(await cli("cancel", "nope", code=1), "cancel nope", "field", "value")
        [q] = await cli.json("queues")
        assert set(q) == {
            "agent_id",
            "high",
            "normal",
            "low",
            "pending",
            "oldest_pending_ms",
            "oldest_pending_age_ms",
        }
        title_and_columns(
            await cli("queues"),
            f"inboxes in {ns!r}",
            "agent",
            "high",
            "normal",
            "low",
            "pending",
            "oldest pending",
        )
        frame = await cli.json("top", "--once", "--interval", "0")
        assert isinstance(frame, dict) and frame
        # dead letters: list (table and JSON), show, replay, purge
        dead = await client.send("docs.refuse", "x")
        await wait_status(client, dead, "dead")
        [d] = await cli.json("dlq", "list", "--cap", "docs.refuse")
        assert set(d) == {
            "id",
            "capability",
            "reason",
            "attempts",
            "agent_id",
            "msg_id",
            "error",
            "error_type",
            "ts",
        }
        title_and_columns(
            await cli("dlq", "list"),
            f"dead letters in {ns!r}",
            "id",
            "capability",
            "reason",
            "attempts",
            "agent",
            "msg_id",
            "error",
        )
        title_and_columns(
            await cli("dlq", "show", d["id"]), f"dead letter {d['id']}", "field", "value"
        )
        out = await cli("dlq", "replay", d["id"], "--wait", code=1)  # refused again
        assert out.splitlines()[0] == "replayed 1, failed 0"
        assert re.search(r"^    dead: no$", out, re.MULTILINE), out
        out = await cli("dlq", "purge", "--cap", "docs.refuse", "--yes")
        assert out.strip() == "purged 1 dead letters"
        # drain: "AGENT_ID: draining", then "AGENT_ID: already draining"
        assert (await cli("agents", "drain", "docs-1")).strip() == "docs-1: draining"
        assert (await cli("agents", "drain", "docs-1")).strip() == "docs-1: already draining"
    # sweep: one line of counts
    out = await cli("sweep")
    assert re.fullmatch(
        r"probation: \d+  evicted: \d+ ?\S*  shadows deleted: \d+  retries moved: \d+  "
        r"rerouted: \d+  parked: \d+  released: \d+  expired: \d+",
        out.strip(),
    ), out


async def test_keys_outputs(tmp_path: Path) -> None:
    cli = Cli("", "")
    # reach keys secret: one line, 32 random bytes as URL-safe text; --json {"secret"}
    one = (await cli("keys", "secret", common=False)).strip()
    two = (await cli("keys", "secret", common=False)).strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", one) and one != two
    shown = json.loads(await cli("keys", "secret", "--json", common=False))
    assert set(shown) == {"secret"} and len(shown["secret"]) == 43
    if find_spec("cryptography") is None:
        return
    # reach keys keygen NAME -o FILE: the trusted-keys line; the file 0600, never overwritten
    key = tmp_path / "billing.key"
    line = await cli("keys", "keygen", "billing-service", "-o", str(key), common=False)
    assert re.fullmatch(r"billing-service [A-Za-z0-9+/]{43}=\n", line)
    assert key.stat().st_mode & 0o777 == 0o600 and key.read_text().startswith("reach-ed25519")
    await cli("keys", "keygen", "billing-service", "-o", str(key), code=2, common=False)
    other = tmp_path / "other.key"
    got = json.loads(await cli("keys", "keygen", "other", "-o", str(other), "--json", common=False))
    assert got["name"] == "other" and got["private_key_file"] == str(other)
    assert got["trusted_line"].startswith("other ")
    await cli("keys", "keygen", "bad name", "-o", str(tmp_path / "x"), code=2, common=False)

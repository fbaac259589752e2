"""`reach caps split` (version canaries): what it writes is what clients route by, it
shows the split with each version's agents (--json too), --clear removes it, its mistakes
are one `error:` line; `reach agents` shows each agent's version, and `reach worker
--version` / REACH_AGENT_VERSION register it (real worker processes)."""

from __future__ import annotations

import json

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner, Result

from reach import audit
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.registry import Registry
from reach.splits import Split, get_split
from tests.support.registry_helpers import register
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

CAP = "demo.work"


class Cli:
    def __init__(self, redis_url: str, ns: str) -> None:
        self.common = ["--redis-url", redis_url, "--namespace", ns]

    async def __call__(self, *args: str) -> Result:
        runner = CliRunner()
        return await anyio.to_thread.run_sync(lambda: runner.invoke(cli_app, [*args, *self.common]))


def one_error_line(res: Result, *needles: str) -> None:
    assert res.exit_code != 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    for n in needles:
        assert n in lines[0], lines[0]


async def fleet(r: AnyRedis, ns: str) -> None:
    reg = Registry(r, ns)
    await register(reg, "w-old", [CAP], app_version="1.4", ready=True)
    await register(reg, "w-new", [CAP], app_version="1.5", ready=True)
    await register(reg, "w-next", [CAP], app_version="1.6", ready=True)


async def test_set_show_and_clear(redis_url: str, ns: str, r: AnyRedis) -> None:
    cli = Cli(redis_url, ns)
    await fleet(r, ns)
    res = await cli("caps", "split", CAP, "1.4=90", "1.5=10")
    assert res.exit_code == 0, res.output
    assert await get_split(r, Keys(ns), CAP) == Split.parse("1.4=90 1.5=10")
    assert "90%" in res.output and "within a second" in res.output
    assert "warning" not in res.output

    res = await cli("caps", "split", CAP, "--json")
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    assert body["capability"] == CAP and body["split"] == "1.4=90 1.5=10"
    rows = {v["version"]: v for v in body["versions"]}
    assert rows["1.4"] == {"version": "1.4", "share": 90, "percent": 90, "agents": 1, "routable": 1}
    assert rows["1.6"]["share"] == 0 and rows["1.6"]["agents"] == 1  # running, not named

    res = await cli("caps", "split", CAP)
    assert res.exit_code == 0 and "1.4=90 1.5=10" in res.output, res.output

    # a version no agent runs yet: set, with a warning
    res = await cli("caps", "split", CAP, "1.4=50", "2.0=50")
    assert res.exit_code == 0 and "warning" in res.output and "'2.0'" in res.output, res.output

    res = await cli("caps", "split", CAP, "--clear")
    assert res.exit_code == 0 and "not split" in res.output, res.output
    assert await get_split(r, Keys(ns), CAP) is None
    res = await cli("caps", "split", CAP, "--json")
    assert json.loads(res.output)["split"] is None
    # each change is in the audit trail (showing one is not a change)
    trail = await audit.read_audit(r, Keys(ns), kind="operator", limit=10)
    assert [(e.action, e.target, e.outcome) for e in trail] == [("caps.split", CAP, "ok")] * 3
    assert [json.loads(e.detail) for e in trail] == [
        {"split": "1.4=90 1.5=10"}, {"split": "1.4=50 2.0=50"}, {"split": None}
    ]  # fmt: skip


@pytest.mark.parametrize(
    "args,needle",
    [
        (("1.4",), "VERSION=SHARE"),
        (("1.4=x",), "Invalid share"),
        (("1.4=0",), "--clear"),
        (("1 4=1",), "VERSION=SHARE"),
        (("1.4=1", "--clear"), "not both"),
    ],
)
async def test_mistakes_are_one_error_line(
    redis_url: str, ns: str, r: AnyRedis, args: tuple[str, ...], needle: str
) -> None:
    res = await Cli(redis_url, ns)("caps", "split", CAP, *args)
    one_error_line(res, needle)
    assert await get_split(r, Keys(ns), CAP) is None


async def test_reach_agents_shows_the_version(redis_url: str, ns: str, r: AnyRedis) -> None:
    cli = Cli(redis_url, ns)
    await fleet(r, ns)
    await register(Registry(r, ns), "w-bare", [CAP], ready=True)
    res = await cli("agents", "--json")
    got = {a["agent_id"]: a["app_version"] for a in json.loads(res.output)}
    assert got == {"w-old": "1.4", "w-new": "1.5", "w-next": "1.6", "w-bare": ""}
    res = await cli("agents")
    assert "version" in res.output and "1.5" in res.output, res.output


async def test_reach_worker_registers_its_version(
    redis_url: str, ns: str, r: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--version overrides the agent's own; REACH_AGENT_VERSION applies without either."""
    workers = Workers(redis_url, ns, "tests.support.agents_doctor")
    reg = Registry(r, ns)
    try:
        workers.start("ops_agent", "--agent-id", "v-flag", "--version", "1.5")
        monkeypatch.setenv("REACH_AGENT_VERSION", "2.0-rc1")
        workers.start("ops_agent", "--agent-id", "v-env")
        monkeypatch.delenv("REACH_AGENT_VERSION")

        async def both() -> dict[str, str] | None:
            got = {a.agent_id: a.app_version for a in await reg.agents()}
            return got if {"v-flag", "v-env"} <= set(got) else None

        got = await wait_until(both, timeout_s=30, what="the two workers registered")
        assert got == {"v-flag": "1.5", "v-env": "2.0-rc1"}
    finally:
        workers.stop_all()

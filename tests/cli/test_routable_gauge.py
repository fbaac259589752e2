"""``reach_registry_agents_routable`` equals the routable agents `reach agents` shows.

Real `reach worker` processes serving ``/metrics``, and two runtimes in this process: the
runtime holding the sweeper lock exports the namespace's counts, every other process
exports the series without samples (never a 0 while agents are routable); in one process,
the runtime sweeping the namespace withdraws its counts when it stops and the one taking
the sweeper over counts anew.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

import reach
from reach.connection import connect
from reach.embedded import free_port
from reach.registry import Registry
from tests.support.waiting import wait_until
from tests.support.workers import FAST, ROOT

pytestmark = pytest.mark.anyio
runner = CliRunner()
ROUTABLE = "reach_registry_agents_routable"


def gauge_one() -> reach.Agent:
    return _agent("gauge-1")


def gauge_two() -> reach.Agent:
    return _agent("gauge-2")


def _agent(agent_id: str) -> reach.Agent:
    a = reach.Agent(agent_id, capabilities=["gauge.echo"])

    @a.handler("gauge.echo")
    async def echo(payload: Any, ctx: reach.Context) -> Any:
        return payload

    return a


async def agents_json(url: str, ns: str) -> list[dict[str, Any]]:
    """`reach agents --json` (in a thread: the command runs its own event loop)."""

    def invoke() -> Any:
        return runner.invoke(cli_app, ["agents", "--json", "--redis-url", url, "--namespace", ns])

    res = await anyio.to_thread.run_sync(invoke)
    assert res.exit_code == 0, res.output
    rows: list[dict[str, Any]] = json.loads(res.stdout)
    return rows


async def routable_in_cli(url: str, ns: str) -> int:
    return sum(1 for a in await agents_json(url, ns) if a["routing"] == "routable")


class MetricsWorker:
    def __init__(self, url: str, ns: str, target: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "reach_cli.app",
                    "worker",
                    f"tests.cli.test_routable_gauge:{target}",
                    "--redis-url",
                    url,
                    "--namespace",
                    ns,
                    *FAST,
                    "--metrics-port",
                    str(self.port),
                    "--metrics-addr",
                    "127.0.0.1",
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stderr=err,
            )

    async def gauges(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The registry gauges' samples as this worker's /metrics shows them."""
        assert self.proc.poll() is None, self.log.read_text()

        def get() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as f:
                return str(f.read().decode())

        try:
            text = await anyio.to_thread.run_sync(get)
        except OSError:  # not listening yet
            return {}
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            if fam.name.startswith("reach_registry_agents"):
                out[fam.name] = [(s.labels, s.value) for s in fam.samples]
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def workers(redis_url: str, ns: str, tmp_path: Path) -> Iterator[list[MetricsWorker]]:
    ws = [
        MetricsWorker(redis_url, ns, "gauge_one", tmp_path / "one.log"),
        MetricsWorker(redis_url, ns, "gauge_two", tmp_path / "two.log"),
    ]
    yield ws
    for w in ws:
        w.stop()


async def register_starting(url: str, ns: str) -> None:
    """An active agent that is not ready: counted as active, not as routable."""
    r = await connect(url)
    try:
        await Registry(r, ns).register(
            "cold-1",
            instance_id="cold",
            version=1,
            ready=False,
            capabilities=["gauge.echo"],
            lease_ms=600_000,
            evict_after_ms=1_200_000,
        )
    finally:
        await r.aclose()


async def test_the_routable_gauge_of_worker_processes_equals_reach_agents(
    workers: list[MetricsWorker], redis_url: str, ns: str
) -> None:
    await register_starting(redis_url, ns)

    async def both_routable() -> tuple[int, int] | None:
        rows = await agents_json(redis_url, ns)
        routable = sum(1 for a in rows if a["routing"] == "routable")
        active = sum(1 for a in rows if a["state"] == "active")
        return (routable, active) if routable == 2 else None

    routable, active = await wait_until(both_routable, what="both workers routable")
    assert active == 3  # the two workers and cold-1 (starting)

    async def exported() -> list[dict[str, list[tuple[dict[str, str], float]]]] | None:
        scraped = [await w.gauges() for w in workers]
        if not all(ROUTABLE in g for g in scraped):  # declared by every process
            return None
        with_samples = [g for g in scraped if g[ROUTABLE]]
        if not with_samples or any(g[ROUTABLE][0][1] != routable for g in with_samples):
            return None
        return scraped

    scraped = await wait_until(exported, what=f"{ROUTABLE} == {routable} from the lock holder")
    holders = [g for g in scraped if g[ROUTABLE]]
    assert len(holders) == 1, scraped  # one sweeper lock: one process counts
    states = {labels["state"]: v for labels, v in holders[0]["reach_registry_agents"]}
    assert states == {"active": active, "probation": 0, "evicted": 0}
    # the other process shows no sample at all, not a 0 that reads as "nothing routable"
    others = [g for g in scraped if not g[ROUTABLE]]
    assert all(not g["reach_registry_agents"] for g in others), scraped
    assert await routable_in_cli(redis_url, ns) == routable


class Reports(reach.Hooks):
    """What the sweeper task reported to one runtime's hooks (None: not the lock holder;
    nothing: the process's other runtime sweeps the namespace)."""

    def __init__(self) -> None:
        self.seen: list[int | None] = []

    def on_registry_counts(self, counts: Any, routable: int) -> None:
        self.seen.append(None if counts is None else routable)


async def test_runtimes_of_one_process_hand_the_counts_on_and_withdraw_them(
    redis_url: str, ns: str
) -> None:
    reports = [Reports(), Reports()]
    apps = [_agent("inproc-1"), _agent("inproc-2")]
    for a, rep in zip(apps, reports, strict=True):
        a.add_hooks(rep)
    started = [threading.Event() for _ in apps]
    fast: dict[str, Any] = {
        "heartbeat_s": 0.1,
        "lease_s": 0.3,
        "evict_after_s": 0.6,
        "sweep_interval_s": 0.05,
        "handle_signals": False,
    }

    def gauge() -> float | None:
        return REGISTRY.get_sample_value(ROUTABLE)

    async def run(a: reach.Agent, ev: threading.Event) -> None:
        await a.run(redis_url=redis_url, namespace=ns, ready_event=ev, **fast)

    async with anyio.create_task_group() as tg:
        for a, ev in zip(apps, started, strict=True):
            tg.start_soon(run, a, ev)
        with anyio.fail_after(30):
            for ev in started:
                await anyio.to_thread.run_sync(ev.wait)

        async def counted_two() -> bool:
            return await routable_in_cli(redis_url, ns) == 2 and gauge() == 2

        await wait_until(counted_two, what="the gauge counts both runtimes")
        # One runtime of the process sweeps the namespace (and counts); the other never
        # clears what it counted. Stopped, the sweeping one withdraws its counts and hands
        # the sweeper on: the other counts, and the gauge follows `reach agents`.
        [sweeping] = [i for i, rep in enumerate(reports) if rep.seen]
        assert all(x in (None, 2) for rep in reports for x in rep.seen[-1:])
        apps[sweeping].stop()
        other = reports[1 - sweeping]

        async def counted_one() -> bool:
            return (
                await routable_in_cli(redis_url, ns) == 1
                and other.seen[-1:] == [1]
                and gauge() == 1
            )

        await wait_until(counted_one, what="the other runtime counts after the hand-over")
        apps[1 - sweeping].stop()
    # both runtimes stopped: this process no longer exports the namespace's counts
    assert gauge() is None

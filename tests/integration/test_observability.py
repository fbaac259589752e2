"""Observability of a real `reach worker` process: /metrics scraped over HTTP while
messages flow, and JSON log lines that carry the handled message's ids (never its payload).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reach import Agent, Context
from reach.client import Client
from reach.connection import connect
from reach.embedded import free_port
from reach.errors import Rejected
from reach.registry import Registry
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "--heartbeat-s",
    "0.1",
    "--lease-s",
    "0.3",
    "--evict-after-s",
    "0.6",
    "--sweep-interval-s",
    "0.1",
]
SECRET = "s3cr3t-payload-text"

pytestmark = pytest.mark.anyio


def obs_agent() -> Agent:
    """The worker's agent (``tests.integration.test_observability:obs_agent``)."""
    app = Agent("obs-1", capabilities=["obs.echo", "obs.reject"])
    hlog = logging.getLogger("obs.handler")

    @app.handler("obs.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        hlog.info("echoing a payload of %d keys", len(payload))  # the handler's own logging
        return payload

    @app.handler("obs.reject")
    def reject(payload: Any, ctx: Context) -> Any:  # sync: runs in a thread
        hlog.warning("rejecting")
        from reach.errors import Reject

        raise Reject("not today")

    return app


class Worker:
    def __init__(self, url: str, ns: str, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        cmd = [
            sys.executable,
            "-m",
            "reach_cli.app",
            "worker",
            "tests.integration.test_observability:obs_agent",
            "--redis-url",
            url,
            "--namespace",
            ns,
            *FAST,
            "--metrics-port",
            str(self.port),
            "--metrics-addr",
            "127.0.0.1",
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=self._log)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()

    def log_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]

    async def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        def get() -> str:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as f:
                return f.read().decode()

        text = await anyio.to_thread.run_sync(get)
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }


def m(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def worker(redis_url: str, ns: str, tmp_path: Path) -> Iterator[Worker]:
    w = Worker(redis_url, ns, tmp_path / "worker.log")
    yield w
    w.stop()


async def ready(redis_url: str, ns: str, worker: Worker) -> None:
    r = await connect(redis_url)
    reg = Registry(r, ns)

    async def is_ready() -> bool:
        assert worker.proc.poll() is None, worker.log_path.read_text()
        a = await reg.get("obs-1")
        return bool(a and a.ready)

    try:
        await wait_until(is_ready)
    finally:
        await r.aclose()


async def test_metrics_scraped_from_a_worker_change_as_messages_flow(
    worker: Worker, redis_url: str, ns: str
) -> None:
    await ready(redis_url, ns, worker)
    before = await worker.scrape()
    assert m(before, "reach_messages_acked_total", capability="obs.echo", outcome="succeeded") == 0
    n = 5
    async with Client(redis_url=redis_url, namespace=ns) as c:
        for i in range(n):
            assert await c.request("obs.echo", {"i": i}, timeout_s=20) == {"i": i}
        await c.request("obs.echo", {"hi": 1}, priority="high", timeout_s=20)
        with pytest.raises(Rejected):
            await c.request("obs.reject", {}, timeout_s=20)

    async def settled() -> dict[Any, float] | None:
        s = await worker.scrape()  # acks are counted after the settle, just after the reply
        ok = m(s, "reach_messages_acked_total", capability="obs.echo", outcome="succeeded")
        dead = m(s, "reach_messages_acked_total", capability="obs.reject", outcome="dead")
        return s if ok == n + 1 and dead == 1 else None

    after = await wait_until(settled)
    assert m(after, "reach_messages_delivered_total", capability="obs.echo", priority="normal") == n
    assert m(after, "reach_messages_delivered_total", capability="obs.echo", priority="high") == 1
    assert (
        m(
            after,
            "reach_handler_duration_seconds_count",
            capability="obs.echo",
            outcome="succeeded",
            version="",
        )
        == n + 1
    )
    assert (
        m(
            after,
            "reach_handler_duration_seconds_count",
            capability="obs.reject",
            outcome="rejected",
            version="",
        )
        == 1
    )
    assert (
        m(after, "reach_messages_dead_lettered_total", capability="obs.reject", reason="rejected")
        == 1
    )
    assert m(after, "reach_queue_wait_seconds_count", priority="normal") >= n + 1
    assert m(after, "reach_queue_wait_seconds_count", priority="high") >= 1
    assert m(after, "reach_inflight_messages", agent_id="obs-1") == 0
    # the heartbeat's XLEN per priority, and the registry seen by the sweeper lock holder
    s = await wait_until(
        lambda: _has(worker, "reach_inbox_depth", agent_id="obs-1", priority="low")
    )
    assert m(s, "reach_inbox_depth", agent_id="obs-1", priority="high") == 0
    s = await wait_until(lambda: _has(worker, "reach_registry_agents", state="active"))
    assert m(s, "reach_registry_agents", state="active") == 1
    # no per-message label anywhere
    assert not any(k in dict(lbl) for _, lbl in after for k in ("msg_id", "session_id", "trace_id"))


async def _has(worker: Worker, name: str, **labels: str) -> dict[Any, float] | None:
    s = await worker.scrape()
    return s if (name, tuple(sorted(labels.items()))) in s else None


async def test_log_lines_of_a_handled_message_carry_its_ids(
    worker: Worker, redis_url: str, ns: str
) -> None:
    await ready(redis_url, ns, worker)
    async with Client(redis_url=redis_url, namespace=ns) as c:
        env = c.build("obs.echo", {"text": SECRET}, session_id="sess-42", timeout_s=20)
        assert await c.call(env) == {"text": SECRET}
        bad = c.build("obs.reject", {"text": SECRET}, timeout_s=20)
        with pytest.raises(Rejected):
            await c.call(bad)

    def mine(recs: list[dict[str, Any]], msg_id: str) -> list[dict[str, Any]]:
        return [x for x in recs if x.get("msg_id") == msg_id]

    async def logged() -> list[dict[str, Any]] | None:
        recs = worker.log_records()  # every line parses as one JSON object
        done = [x for x in mine(recs, bad.msg_id) if x["logger"] == "reach.runtime"]
        return recs if mine(recs, env.msg_id) and done else None

    recs = await wait_until(logged)
    handler_lines = [x for x in mine(recs, env.msg_id) if x["logger"] == "obs.handler"]
    assert len(handler_lines) == 1
    line = handler_lines[0]
    assert line["message"] == "echoing a payload of 1 keys"
    assert line["level"] == "INFO" and line["ts"]
    assert (line["trace_id"], line["session_id"], line["agent_id"]) == (
        env.trace_id,
        "sess-42",
        "obs-1",
    )
    # the runtime's own line about the outcome carries them too
    assert any(
        "succeeded" in x["message"]
        for x in mine(recs, env.msg_id)
        if x["logger"] == "reach.runtime"
    )
    # a sync handler (worker thread) logs with its message's ids
    rej = mine(recs, bad.msg_id)
    assert any(x["logger"] == "obs.handler" and x["message"] == "rejecting" for x in rej)
    assert all(x["agent_id"] == "obs-1" and x["trace_id"] == bad.trace_id for x in rej)
    # lines outside any message have no ids; payloads are never logged
    assert any("msg_id" not in x for x in recs)
    assert SECRET not in worker.log_path.read_text()

"""The scaling figures (reach_cli.tools.scaling, bench/scaling_bench.py): a tiny run of
every figure set, checked for the output's shape and for every message processed
(counts only: timings are not asserted)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis.asyncio as aredis
from reach_cli.tools import scaling

from reach.envelope import encode_payload
from reach.errors import ConfigError
from reach.keys import Keys


def test_payload_pad_makes_the_encoded_payload_the_size_asked() -> None:
    for size in (100, 1024, 65536, 200_000):
        pad = scaling.payload_pad(size)
        assert len(encode_payload({"i": 0, "pad": pad})) == size
    assert scaling.payload_pad(0) == b""


@pytest.mark.anyio
async def test_drain_polls_the_inboxes_left_and_all_of_them_before_answering_0(
    redis_url: str,
) -> None:
    keys = Keys(f"scaling-test-{uuid.uuid4().hex[:8]}")
    a1, a2, a3 = (keys.inbox(a, "normal") for a in ("a1", "a2", "a3"))
    r: Any = aredis.Redis.from_url(redis_url)
    try:
        e1 = [await r.xadd(a1, {"x": 1}) for _ in range(2)]
        e2 = [await r.xadd(a2, {"x": 1})]
        drain = scaling._Drain(keys, ["a1", "a2", "a3"])
        assert await drain.entries_left(r) == 3 and drain.left == ["a1", "a2"]
        await r.xdel(a2, *e2)
        assert await drain.entries_left(r) == 2 and drain.left == ["a1"]
        # An inbox seen empty gets an entry (an evicted agent's inbox moved): the final
        # check over every inbox finds it.
        e3 = [await r.xadd(a3, {"x": 1})]
        await r.xdel(a1, *e1)
        assert await drain.entries_left(r) == 1 and drain.left == ["a3"]
        await r.xdel(a3, *e3)
        assert await drain.entries_left(r) == 0
    finally:
        await r.delete(a1, a2, a3)
        await r.aclose()


def test_unknown_set_and_bad_sizes_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="Unknown figure set"):
        scaling.run_scaling(sets=["workers", "nope"])
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        scaling.run_scaling(sets=["workers"], workers=[0])


def test_tiny_run_of_every_set_processes_every_message() -> None:
    n, fan = 200, 200
    out = scaling.run_scaling(
        workers=(1, 2), agents=(3,), payload_bytes=(1024,), messages=n, fanout=fan, concurrency=8
    )
    assert [f["workers"] for f in out["workers"]] == [1, 2]
    assert [f["agents"] for f in out["agents"]] == [3]
    runs = [*out["workers"], *out["agents"], *out["payloads"]]
    for fig in runs:
        # Every message sent reached an inbox once, was acknowledged, and was handled once.
        assert fig["messages"] == fig["processed"] == n, fig
        assert fig["unacked"] == 0 and fig["send_errors"] == {} and fig["rounds_ok"] == 1
        assert fig["worker_stats"]["handled"] == n
        assert fig["msgs_per_s"] > 0
        assert set(fig["cpu_s"]) == {"caller", "workers", "redis"}
    # Routing used every agent sharing the capability.
    assert out["workers"][1]["per_agent_min"] >= 1
    agents = out["agents"][0]
    assert agents["processes"] == 1 and agents["per_agent_min"] >= 1
    assert out["payloads"][0]["encoded_payload_bytes"] == 1024
    fo = out["fanout"]
    # Every request answered (the warm-up one too, by the worker), none failed.
    assert fo["requests"] == fo["answered"] == fan and fo["errors"] == {}
    assert fo["worker_stats"]["handled"] == fan + 1
    assert fo["caller_exit_code"] == 0 and "error" not in fo
    # Redis saw the caller's connections (the fan-out may be shorter than one sample, so
    # the count during it is not asserted); the caller measured its own memory.
    assert fo["connections_distinct"] >= 1
    assert fo["connections_counted_by"] in ("address", "name")
    assert 0 < fo["rss_before_mb"] <= fo["rss_max_mb"]
    report = scaling.format_report(out)
    assert "2 worker process(es)" in report and "3 agent(s) sharing" in report
    assert f"{fan} answered" in report


def test_reach_bench_scaling_passes_its_options_to_the_tool() -> None:
    """`reach bench-scaling` is the same tool as bench/scaling_bench.py: its --help lists
    the tool's options under the command's name."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", "bench-scaling", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "usage: reach bench-scaling" in out.stdout
    assert "--fanout" in out.stdout and "--workers" in out.stdout

"""Throughput with inboxes spread over the masters of a Redis Cluster: 3 masters vs 1
(issue 12, item 6).

Each run starts a fresh test cluster (``tests/support/cluster.py``: ``--masters`` 3, then
1, alternating over ``--repeat`` rounds, the order reversed every other round) and runs
the streaming workload of ``bench/scaling_bench.py``'s ``workers`` set on it
(:func:`reach_cli.tools.scaling._workers_run`): ``--workers`` real ``reach worker``
processes, one agent each (``scale-1``, ``scale-2``, ...), one caller sending
``--messages`` messages with ``Client.send``, 50 in flight, the clock stopping when every
inbox is drained. The agents' inboxes are one slot each (``{a:<agent_id>}``): with 4
agents on 3 masters they land on masters 0, 2, 2, 1 (printed per run), on 1 master all on
it. Also reported: the Redis CPU seconds of each master during the workload (``INFO cpu``
of every node), and the caller's and the workers' CPU.

On a machine with fewer cores than processes (this project's 2-core VM runs the caller,
the workers and every master on the same 2 cores), spreading inboxes cannot add CPU: the
figure to read is how each master's share of the work changes, which is what a machine
with a core per master would turn into throughput.

Run:  python bench/cluster_spread.py [--workers 4] [--messages 20000] [--repeat 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis
from reach_cli.tools import scaling
from redis.crc import key_slot

from reach.embedded import find_server_binary
from reach.keys import Keys
from tests.support.cluster import RedisTestCluster, master_of_slot


def _node_cpu(urls: list[str]) -> list[float]:
    out = []
    for url in urls:
        r = redis.Redis.from_url(url)
        try:
            info = r.info("cpu")
            out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
        finally:
            r.close()
    return out


_OWN_CPU = scaling._cpu


def _patch_cpu(urls: list[str]) -> None:
    """Make the scaling engine's CPU sample read every node of the cluster (its own reads
    only the node its client asks first)."""
    own = _OWN_CPU

    async def cpu(r: Any, worker_pids: list[int]) -> dict[str, float | None]:
        out = await own(r, worker_pids)
        nodes = _node_cpu(urls)
        out["redis"] = sum(nodes)
        for i, v in enumerate(nodes):
            out[f"redis_master_{i}"] = v
        return out

    scaling._cpu = cpu


def one_run(
    masters: int, k: int, *, workers: int, messages: int, concurrency: int
) -> dict[str, Any]:
    cluster = RedisTestCluster(binary=find_server_binary(), masters=masters)
    with cluster, tempfile.TemporaryDirectory(prefix="reach-spread-") as t:
        urls = [n.url for n in cluster.nodes]
        _patch_cpu(urls)
        fig = scaling._workers_run(
            cluster.url, Path(t), k, workers, n=messages, concurrency=concurrency, progress=None
        )
    ns = Keys(f"scaling-workers-{workers}-{k}")
    fig["inbox_masters"] = [
        master_of_slot(key_slot(ns.inbox(f"scale-{i + 1}", "normal").encode()), masters)
        for i in range(workers)
    ]
    fig["masters"] = masters
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4, help="worker processes, one agent each")
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2, help="rounds of 3 masters and 1 master")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    runs: dict[int, list[dict[str, Any]]] = {3: [], 1: []}
    for k in range(a.repeat):
        for m in (3, 1) if k % 2 == 0 else (1, 3):
            print(f"round {k + 1}: {m} master(s)...", file=sys.stderr)
            runs[m].append(
                one_run(m, k, workers=a.workers, messages=a.messages, concurrency=a.concurrency)
            )
    out: dict[str, Any] = {
        "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "runs": runs,
    }
    if a.json:
        print(json.dumps(out, indent=2, default=str))
        return
    print(f"load average {out['load_avg_1m'][0]} -> {out['load_avg_1m'][1]}")
    for m, figs in runs.items():
        rates = [f["msgs_per_s"] for f in figs]
        print(
            f"{m} master(s), {a.workers} workers, {a.messages} msgs: median "
            f"{statistics.median(rates):,.0f} msgs/s (rounds: "
            + ", ".join(f"{r:,.0f}" for r in rates)
            + ")"
        )
        for f in figs:
            cpu = f["cpu_s"]
            per = [cpu.get(f"redis_master_{i}") for i in range(m)]
            print(
                f"  inboxes on masters {f['inbox_masters']}; CPU s: caller {cpu['caller']:.2f}, "
                f"workers {cpu['workers']:.2f}, Redis per master "
                + " / ".join(f"{x:.2f}" for x in per if x is not None)
            )


if __name__ == "__main__":
    main()

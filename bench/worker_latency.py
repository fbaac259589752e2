"""Where a lone request's time goes, caller and worker: the benchmark agent in a worker
process of its own, one sequential caller (``Client.request``), and per request the time of
each step, from stamps taken in both processes (``time.perf_counter``: CLOCK_MONOTONIC, the
same clock in every process of the machine).

Steps, in order: the caller builds the envelope; routes it (the pick, encoding); the inbox
write is sent (send.lua) -> the worker's blocking read returns (the send and the worker's
wake-up); -> the batch goes to execution (decode); -> the handler starts (the claim round
trip, unless send.lua claimed the message for this worker, and the hand-off to the
handler pool; the claim round trip is also shown alone for the requests that made one); the handler with its hooks and outcome; -> settle sent; -> the
caller's reply reader has the reply (settle.lua publishes it, the reader's XREAD wakes);
-> ``request()`` returns (the waiter's wake-up and the outcome). Also shown: the caller's
send round trip and the worker's settle round trip (both overlap later steps). Each
process's steps are timed by wrapping private methods of that process.

Run:  python bench/worker_latency.py [requests, default 1000]
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import anyio

ROWS = os.path.join(tempfile.gettempdir(), f"reach-worker-latency-{os.getpid()}.json")


def worker(url: str, out: str) -> None:
    from reach_cli.tools.bench import bench_agent

    from reach._worker import consumer as c
    from reach._worker import execution as e
    from reach._worker import settlement as s

    rows = []
    cur = {}
    ob = c.Consumer._block

    async def block(self, n):
        got = await ob(self, n)
        if got:
            cur.clear()
            cur["read"] = time.perf_counter()
        return got

    c.Consumer._block = block
    oc = e.Execution._claim

    async def claim(self, items, **kw):
        cur["claim0"] = time.perf_counter()
        r = await oc(self, items, **kw)
        cur["claim1"] = time.perf_counter()
        return r

    e.Execution._claim = claim
    otake = e.Execution.take

    async def take(self, items):
        cur["take"] = time.perf_counter()
        cur["at_send"] = all(it.claimed_at_send for it in items)
        await otake(self, items)

    e.Execution.take = take
    orun = e.Execution._run

    async def run(self, it, **kw):
        cur["handle0"] = time.perf_counter()
        await orun(self, it, **kw)
        cur["handle1"] = time.perf_counter()

    e.Execution._run = run
    ost = s.Settlement._settle

    async def settle(self, batch):
        cur["settle0"] = time.perf_counter()
        await ost(self, batch)
        cur["settle1"] = time.perf_counter()
        rows.append(dict(cur))

    s.Settlement._settle = settle
    agent = bench_agent()

    def stop(*_):
        agent.stop()

    signal.signal(signal.SIGTERM, stop)
    try:
        anyio.run(
            lambda: agent.run(
                redis_url=url, namespace="bench", concurrency=64, handle_signals=False
            )
        )
    finally:
        with open(out, "w") as f:
            json.dump(rows, f)


STAMPS: dict[str, float] = {}


def stamp_caller() -> None:
    """Wrap the caller's steps (this process) to stamp them into STAMPS."""
    from reach import _replies, client
    from reach._sending import coalesce

    ob = client.Client.build

    def build(self, *a, **kw):
        env = ob(self, *a, **kw)
        STAMPS["built"] = time.perf_counter()
        return env

    client.Client.build = build
    # The inbox write: the coalescer's, which the full path and the plain send's fast path
    # (reach._sending.plain) both go through on standalone Redis.
    oadd = coalesce.Coalescer.send

    async def add(self, *a, **kw):
        STAMPS["add0"] = time.perf_counter()
        r = await oadd(self, *a, **kw)
        STAMPS["add1"] = time.perf_counter()
        return r

    coalesce.Coalescer.send = add
    orep = _replies.ReplyReader._on_reply

    def on_reply(self, *a, **kw):
        STAMPS["reply"] = time.perf_counter()
        return orep(self, *a, **kw)

    _replies.ReplyReader._on_reply = on_reply


async def caller(url: str, n: int) -> list[dict[str, float]]:
    from reach import Client
    from reach.connection import connect
    from reach.registry import Registry

    stamp_caller()

    r = await connect(url)
    with anyio.fail_after(30):
        while not await Registry(r, "bench").agents("bench.noop", ready=True):
            await anyio.sleep(0.02)
    await r.aclose()
    out = []
    async with Client(redis_url=url, namespace="bench") as c:
        for _ in range(200):
            await c.request("bench.noop", 1)
        for i in range(n):
            STAMPS.clear()
            t0 = time.perf_counter()
            await c.request("bench.noop", i)
            out.append({**STAMPS, "t0": t0, "t1": time.perf_counter()})
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit()
    from reach.embedded import RedisServer

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with RedisServer() as srv:
        p = subprocess.Popen([sys.executable, __file__, "worker", srv.url, ROWS])
        try:
            calls = anyio.run(caller, srv.url, n)
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    with open(ROWS) as f:
        rows = json.load(f)[-n:]
    os.unlink(ROWS)
    # Each call: caller t0 -> built -> add0 (routed) -> worker read -> claim -> handler ->
    # settle -> reply read by the caller -> caller end
    steps = {
        "caller: build": ("t0", "built"),
        "caller: route": ("built", "add0"),
        "send -> worker read": ("add0", "read"),
        "worker: decode": ("read", "take"),
        "worker: -> handler": ("take", "handle0"),
        "worker: handler": ("handle0", "handle1"),
        "worker: -> settle": ("handle1", "settle0"),
        "settle -> reply read": ("settle0", "reply"),
        "caller: reply -> return": ("reply", "t1"),
        "total": ("t0", "t1"),
        "(caller: send rt)": ("add0", "add1"),
        "(worker: settle rt)": ("settle0", "settle1"),
        "(worker: claim rt, if any)": ("claim0", "claim1"),
    }
    optional = {"(worker: claim rt, if any)"}
    parts: dict[str, list[float]] = {k: [] for k in steps}
    at_send = 0
    for c, w in zip(calls, rows):
        t = {**c, **w}
        if not all(a in t and b in t for k, (a, b) in steps.items() if k not in optional):
            continue
        at_send += bool(t.get("at_send"))
        for k, (a, b) in steps.items():
            if a in t and b in t:
                parts[k].append(t[b] - t[a])
    print(f"{len(parts['total'])} of {n} requests matched, {at_send} claimed at send")
    for k, v in parts.items():
        if not v:
            continue
        print(
            f"{k:26} p50 {1000 * statistics.median(v):6.3f} ms  mean {1000 * statistics.fmean(v):6.3f} ms"
        )

"""Redis away for 5 s under load: a Client holds its sends locally and flushes them, in
order, once Redis is back (restarted from its AOF on the same port); requests wait for
Redis up to their deadline. A real `reach worker` process handles everything.

Counted afterwards: every send applied exactly once (a message sent again under a new
msg_id would apply its label twice; the same msg_id twice is run once), the sends in the
order they were made, every request answered or told DeadlineExceeded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from reach import Client, DeadlineExceeded, metrics
from reach.connection import connect
from reach.embedded import RedisServer
from reach.keys import Keys
from tests.support.agents_buffer import AGENT_ID, CAPABILITY, EFFECTS
from tests.support.agents_messaging import REPO, wait_eligible

pytestmark = pytest.mark.anyio

OUTAGE_S = 5.0
SEND_EVERY_S = 0.01  # the producer: about 100 sends a second, outage or not
REQUESTERS = 4


@pytest.fixture
def worker(fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[Path]:
    """One worker process, default leases (a 5 s outage is within its 9 s lease), one
    handler at a time (so the handler runs in inbox order)."""
    log = tmp_path / "worker.log"
    cmd = [
        sys.executable,
        "-m",
        "reach_cli.app",
        "worker",
        "tests.support.agents_buffer:outage_agent",
        "--redis-url",
        fresh_redis.url,
        "--namespace",
        ns,
        "--concurrency",
        "1",
        "--log-level",
        "warning",
    ]
    with log.open("wb") as out:
        p = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stderr=out, stdout=out)
    try:
        yield log
    finally:
        p.kill()
        p.wait(timeout=10)


def dropped(reason: str) -> float:
    labels = {"capability": CAPABILITY, "reason": reason}
    return metrics.REGISTRY.get_sample_value("reach_client_buffer_dropped_total", labels) or 0.0


async def test_sends_survive_a_redis_outage_once_and_in_order(
    fresh_redis: RedisServer, ns: str, worker: Path
) -> None:
    sends: list[str] = []  # labels, in the order send() was called
    send_errors: list[BaseException] = []
    answered: list[str] = []
    told: list[tuple[str, float, float]] = []  # (label, made at, its timeout)
    other: list[BaseException] = []
    made_in_outage_answered = 0
    down_at = up_at = float("inf")
    peak_held = 0
    flushed_at: list[float] = []  # when the buffer emptied after the restart
    # Sends have no deadline: none may be dropped (age, error, closed); a request held
    # past its deadline is (reason deadline) and its caller told.
    dropped_before = {r: dropped(r) for r in ("age", "error", "closed", "deadline")}

    async with Client(redis_url=fresh_redis.url, namespace=ns, client_id="outage-caller") as c:
        await wait_eligible(c, CAPABILITY, [AGENT_ID], timeout=60)
        stop = anyio.Event()

        async def produce() -> None:
            i = 0
            while not stop.is_set():
                label = f"s:{i}"
                try:
                    await c.send(CAPABILITY, {"label": label})
                    sends.append(label)
                except Exception as e:  # noqa: BLE001 - counted: none is allowed
                    send_errors.append(e)
                i += 1
                await anyio.sleep(SEND_EVERY_S)

        async def ask(k: int) -> None:
            nonlocal made_in_outage_answered
            # Short deadlines run out in the outage (told); long ones wait it through.
            timeout = 2.0 if k % 2 == 0 else 12.0
            j = 0
            while not stop.is_set():
                label = f"r:{k}:{j}"
                j += 1
                t = time.monotonic()
                try:
                    res = await c.request(CAPABILITY, {"label": label}, timeout_s=timeout)
                except DeadlineExceeded:
                    told.append((label, t, timeout))
                    continue
                except Exception as e:  # noqa: BLE001 - counted: none is allowed
                    other.append(e)
                    continue
                assert res == {"label": label}
                answered.append(label)

        async def ask_in_outage() -> None:
            # Made while Redis is away: it waits for Redis (its deadline is far) and is
            # answered once Redis is back.
            nonlocal made_in_outage_answered
            await anyio.sleep(1.0)
            assert c.pending_local(), "the outage is on"
            res = await c.request(CAPABILITY, {"label": "r:outage"}, timeout_s=30)
            assert res == {"label": "r:outage"}
            assert time.monotonic() - down_at >= OUTAGE_S, "answered after the restart"
            answered.append("r:outage")
            made_in_outage_answered += 1

        async def outage() -> None:
            nonlocal down_at, up_at, peak_held
            await anyio.sleep(1.5)  # load before the outage
            down_at = time.monotonic()
            await anyio.to_thread.run_sync(fresh_redis.kill)
            tg.start_soon(ask_in_outage)
            with anyio.move_on_after(OUTAGE_S):
                while True:
                    peak_held = max(peak_held, len(c.pending_local()))
                    await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(fresh_redis.start)  # same port, from its AOF
            up_at = time.monotonic()
            while c.pending_local():
                await anyio.sleep(0.01)
            flushed_at.append(time.monotonic())
            await anyio.sleep(2.0)  # load after the outage
            stop.set()

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                for k in range(REQUESTERS):
                    tg.start_soon(ask, k)
                tg.start_soon(outage)
        flushed_s = flushed_at[0] - up_at

    # Every send applied once, in order; nothing else applied twice.
    r = await connect(fresh_redis.url)
    fx = Keys(ns).effects(EFFECTS)
    try:
        with anyio.fail_after(120):
            while True:
                got = await r.hmget(fx, [f"n:{s}" for s in sends])
                if all(got):
                    break
                await anyio.sleep(0.1)
        raw = await r.hgetall(fx)
    finally:
        await r.aclose()
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    applied = Counter({k[2:]: int(v) for k, v in fields.items() if k.startswith("n:")})
    where = {k[3:]: int(v) for k, v in fields.items() if k.startswith("at:")}
    log = worker.read_text(errors="replace")
    summary = (
        f"{len(sends)} sends, {len(answered)} requests answered ({made_in_outage_answered} "
        f"made during the outage), {len(told)} told, peak held {peak_held}, flushed "
        f"{flushed_s:.2f} s after the restart"
    )
    print(summary)

    assert not send_errors, send_errors[:3]
    assert not other, other[:3]
    assert peak_held > 50, f"the outage held sends locally: {summary}"
    assert [s for s in sends if applied[s] != 1] == [], f"not applied exactly once: {summary}"
    assert {k: n for k, n in applied.items() if n != 1} == {}, "a label applied twice"
    order = [where[s] for s in sends]
    assert order == sorted(order), "sends applied out of the order they were made"
    assert set(applied) <= {*sends, *answered, *(t[0] for t in told)}
    for label in answered:
        assert applied[label] == 1, label
    # The outage was seen from both sides: requests made during it waited and were
    # answered (long deadlines), or were told at their deadline (short ones).
    assert made_in_outage_answered > 0, summary
    assert any(down_at <= t and timeout == 2.0 for _, t, timeout in told), summary
    for reason in ("age", "error", "closed"):
        assert dropped(reason) == dropped_before[reason], reason
    assert dropped("deadline") - dropped_before["deadline"] <= len(told)
    assert "Traceback" not in log, log[-3000:]

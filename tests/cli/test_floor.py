"""The floor of `reach bench --floor` (reach_cli.tools.floor): its worker process answers
requests, acknowledges every entry, and ``remaining`` counts what it has not processed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis
from reach_cli.tools import floor

pytestmark = pytest.mark.anyio


async def test_remaining_counts_unread_and_pending_and_ignores_deleted(redis_url: str) -> None:
    r: Any = aredis.Redis.from_url(redis_url)
    s = f"floor-test:{uuid.uuid4().hex[:8]}"
    try:
        ids = [await r.xadd(s, {"p": b"x"}) for _ in range(5)]
        assert await floor.remaining(r, s, "g") == 5  # no group yet: nothing read
        await r.xgroup_create(s, "g", id="0")
        assert await floor.remaining(r, s, "g") == 5
        await r.xreadgroup("g", "c", {s: ">"}, count=3)
        assert await floor.remaining(r, s, "g") == 5  # 3 pending + 2 unread
        await r.xack(s, "g", *ids[:3])
        await r.xdel(s, *ids[:3])  # acked then deleted, as reach does: processed
        assert await floor.remaining(r, s, "g") == 2
        await r.xreadgroup("g", "c", {s: ">"})
        await r.xack(s, "g", *ids[3:])
        assert await floor.remaining(r, s, "g") == 0
    finally:
        await r.delete(s)
        await r.aclose()


def test_worker_process_replies_acks_and_reports_counts(redis_url: str) -> None:
    s = f"floor-test:{uuid.uuid4().hex[:8]}"

    async def drive() -> None:
        r: Any = aredis.Redis.from_url(redis_url)
        try:
            with anyio.fail_after(30):
                while not await r.get(floor.ready_key(s)):
                    await anyio.sleep(0.02)
            await floor.stream(r, s, 120, batch=50)
            last = b"0-0"
            for i in range(3):
                last = await floor.request(r, s, f"{s}:reply", last, i)
            replies = await r.xrange(f"{s}:reply")
            assert [f[b"p"] for _, f in replies] == [b"0", b"1", b"2"]
            with anyio.fail_after(30):
                while await floor.remaining(r, s, floor.GROUP):
                    await anyio.sleep(0.01)
        finally:
            await r.aclose()

    w = subprocess.Popen(
        [sys.executable, "-m", "reach_cli.tools.floor", "worker", "--redis-url", redis_url,
         "--stream", s],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        anyio.run(drive)
    finally:
        w.send_signal(signal.SIGTERM)
        _, err = w.communicate(timeout=30)

        async def clean() -> None:
            r: Any = aredis.Redis.from_url(redis_url)
            await r.delete(s, f"{s}:reply", floor.ready_key(s))
            await r.aclose()

        anyio.run(clean)
    assert w.returncode == 0, err
    line = next(x for x in err.decode().splitlines() if x.startswith("floor stats: "))
    stats = json.loads(line.removeprefix("floor stats: "))
    assert stats["handled"] == 123 and stats["replies"] == 3

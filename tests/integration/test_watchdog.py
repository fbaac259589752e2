"""The progress watchdog: a consumer that is alive but not reading is marked not ready."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from reach import Agent
from reach.registry import Registry

pytestmark = pytest.mark.anyio


async def test_stuck_consumer_is_marked_not_ready_and_back(redis_url: str, ns: str, r: Any) -> None:
    app = Agent("stuck-1", capabilities=["wd.work"])

    @app.handler("wd.work")
    async def work(payload: Any, ctx: Any) -> Any:
        return payload

    reg = Registry(r, ns)
    release = anyio.Event()

    async def wait(pred: Any) -> None:
        with anyio.fail_after(20):
            while not await pred():
                await anyio.sleep(0.02)

    async def ready_is(v: bool) -> bool:
        a = await reg.get("stuck-1")
        return a is not None and a.ready is v

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: app.run(
                redis_url=redis_url,
                namespace=ns,
                heartbeat_s=0.05,
                lease_s=0.5,
                evict_after_s=1,
                consumer_stall_s=0.3,
                block_ms=100,
                handle_signals=False,
                sweeper=False,
            )
        )
        await wait(lambda: ready_is(True))
        rt = app.runtime
        assert rt is not None and rt.consumer is not None
        consumer = rt.consumer
        real_block = consumer._block

        async def hung_read(n: int) -> Any:  # a read whose connection hangs
            await release.wait()
            return await real_block(n)

        consumer._block = hung_read  # type: ignore[method-assign]
        await wait(lambda: ready_is(False))
        a = await reg.get("stuck-1")
        assert a is not None and a.state == "active"  # alive (heartbeats go on), not routable
        release.set()
        await wait(lambda: ready_is(True))
        app.stop()

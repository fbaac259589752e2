"""An agent evicted because Redis was away while its handler ran is not yet gone: its
handler still runs, and no peer may run the message beside it.

With sub-second leases (heartbeat 0.1 s, lease 0.3 s, eviction after 0.6 s, as the chaos
harness runs them), a Redis restart that keeps the server away for longer than lease +
eviction leaves the running agent evicted by the first sweep after Redis is back; its inbox
(the running message's entry among it) is moved to the peer, whose claim meets the running
agent's claim. A run of `reach chaos --scenario rolling-deploy` once saw one message run on
two agents at once around a Redis restart (docs/reliability.md, "Rolling deploy"): these
cases walk that path, with and without a drain going on, and count the handler's starts
and overlapping runs in Redis.
"""

from __future__ import annotations

import signal
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import connect
from reach.embedded import RedisServer
from reach.registry import Registry
from tests.support.agents_messaging import effects
from tests.support.draining import running, start
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio

SHORT = [
    "--heartbeat-s", "0.1", "--lease-s", "0.3", "--evict-after-s", "0.6",
    "--sweep-interval-s", "0.1",
]  # fmt: skip


@pytest.mark.parametrize(
    ("outage_s", "drain"),
    [
        pytest.param(1.2, False, id="1.2s-outage"),
        pytest.param(1.2, True, id="1.2s-outage-while-draining"),
    ],
)
async def test_an_agent_evicted_by_an_outage_keeps_its_run_to_itself(
    fresh_redis: RedisServer, ns: str, outage_s: float, drain: bool
) -> None:
    url = fresh_redis.url
    w = Workers(url, ns, "tests.support.agents_lifecycle")
    try:
        r = await connect(url)
        procs = await start(w, Registry(r, ns), ["sleeper-a", "sleeper-b"], *SHORT)
        got: list[Any] = []
        async with (
            Client(redis_url=url, namespace=ns) as c,
            anyio.create_task_group() as tg,
        ):

            async def call() -> None:
                got.append(await c.request("test.sleep", {"seconds": 5}, timeout_s=60))

            tg.start_soon(call)
            key, agent = await running(r, ns, "sleep")
            if drain:
                procs[agent].send_signal(signal.SIGTERM)
            fresh_redis.kill()  # SIGKILL: the AOF keeps what it acknowledged
            await anyio.sleep(outage_s)
            fresh_redis.start()
        assert len(got) == 1 and got[0]["slept"] == 5, got
        assert await effects(r, ns, "drain.overlap") == {}, "no message ran on two agents at once"
        assert await effects(r, ns, "sleep.started") == {key: 1}, "the handler started once"
        await r.aclose()
    finally:
        w.stop_all()

"""A worker process hosting several echo agents in one event loop (issue 12 item 4: the
connections of a process hosting many agents):

    python -m tests.support.echo_host REDIS_URL NAMESPACE AGENT_ID [AGENT_ID ...]

Each agent is :func:`tests.support.agents_messaging.echo_agent` with concurrency 64 and
leases long enough (heartbeat 0.2 s, lease 8 s) that a busy loop on a loaded machine still
takes up its heartbeat rounds itself: the heartbeat thread waits up to 2.5 s for the loop's
round here (1 s in production) before sending it on a connection of its own. Runs until
SIGTERM (each agent drains), then prints ``heartbeat fallbacks: N``, the rounds the thread
sent itself, so a test can tell those connections from the loop's."""

from __future__ import annotations

import signal
import sys

import anyio

from reach._worker import liveness
from tests.support.agents_messaging import echo_agent

liveness.LOOP_PICKUP_S = 2.5


async def main(url: str, ns: str, ids: list[str]) -> None:
    agents = [echo_agent(agent_id) for agent_id in ids]
    async with anyio.create_task_group() as tg:
        for app in agents:
            tg.start_soon(
                lambda a=app: a.run(
                    redis_url=url,
                    namespace=ns,
                    concurrency=64,
                    heartbeat_s=0.2,
                    lease_s=8.0,
                    evict_after_s=16.0,
                    sweep_interval_s=0.2,
                    block_ms=500,
                    handle_signals=False,
                )
            )
        with anyio.open_signal_receiver(signal.SIGTERM) as sigs:
            async for _ in sigs:
                hub = liveness.Heartbeats._hubs.get(url)
                print(f"heartbeat fallbacks: {hub.fallbacks if hub else 0}", flush=True)
                for app in agents:
                    app.stop()
                return


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3:])

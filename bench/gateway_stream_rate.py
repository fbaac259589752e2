"""A long A2A stream read at full speed through a ``reach gateway`` process: events/s over
the first and the last ``--window`` chunks of ``--chunks`` (a cost per chunk that grows
with the stream shows as a last window slower than the first; docs/a2a.md, *Tasks*).

A redis-server (``reach.embedded.RedisServer``), a worker streaming ``--chunks`` chunks of
``--size`` characters, the gateway, and the official ``a2a-sdk`` client here::

    python bench/gateway_stream_rate.py --chunks 20000 --size 100
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "stream-rate-token-0123456789"


def agent() -> Any:
    """``rate.flood``: ``n`` chunks of ``size`` characters (``reach worker
    bench.gateway_stream_rate:agent``)."""
    from reach import Agent, Context

    app = Agent("rate-1", capabilities=["rate.flood"])

    @app.handler("rate.flood")
    async def flood(payload: Any, ctx: Context) -> AsyncIterator[Any]:
        chunk = "x" * int(payload["size"])
        for _ in range(int(payload["n"])):
            yield chunk

    return app


async def measure(url: str, chunks: int, size: int, window: int) -> tuple[float, float, float]:
    import httpx
    from a2a.client import ClientConfig, ClientFactory
    from a2a.helpers.proto_helpers import new_data_part
    from a2a.types.a2a_pb2 import Message, Role, SendMessageRequest

    from reach.envelope import new_id

    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600) as h:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = await h.get(f"{url}/caps/rate.flood/.well-known/agent-card.json")
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway did not serve rate.flood")
            await anyio.sleep(0.2)
        client = await ClientFactory(ClientConfig(httpx_client=h)).create_from_url(
            f"{url}/caps/rate.flood"
        )
        req = SendMessageRequest(
            message=Message(
                role=Role.ROLE_USER,
                message_id=new_id(),
                parts=[new_data_part({"n": chunks, "size": size})],
            )
        )
        stamps: list[float] = []
        t0 = time.perf_counter()
        async for event in client.send_message(req):
            if event.HasField("artifact_update"):
                stamps.append(time.perf_counter())
        total = time.perf_counter() - t0
    first = window / (stamps[window - 1] - stamps[0])
    last = window / (stamps[-1] - stamps[-window])
    return first, last, len(stamps) / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=20000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--window", type=int, default=1000)
    args = ap.parse_args()
    from reach.embedded import RedisServer, free_port

    print(f"python {' '.join(sys.argv)}")
    with RedisServer() as srv:
        port = free_port()
        env = {**os.environ, "REACH_GATEWAY_TOKENS": f"rate:{TOKEN}"}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")]
        )
        common = ["--redis-url", srv.url, "--namespace", "rate"]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "reach_cli.app", "worker",
                 "bench.gateway_stream_rate:agent", *common],
                cwd=ROOT, env=env,
            ),
            subprocess.Popen(
                [sys.executable, "-m", "reach_cli.app", "gateway", "--port", str(port),
                 "--timeout-s", "600", *common],
                cwd=ROOT, env=env,
            ),
        ]  # fmt: skip
        try:
            first, last, mean = anyio.run(
                measure, f"http://127.0.0.1:{port}", args.chunks, args.size, args.window
            )
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(30)
    print(
        f"{args.chunks} chunks of {args.size} B: first {args.window} at {first:.0f} events/s, "
        f"last {args.window} at {last:.0f} events/s, {mean:.0f} events/s overall"
    )


if __name__ == "__main__":
    main()

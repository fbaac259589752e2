"""A process that reads a stream: ``python -m tests.support.stream_reader URL NS stream CAP
JSON`` starts ``client.stream(CAP, payload)``; ``... resume MSG_ID AFTER`` runs
``client.resume(MSG_ID, after=AFTER)``. Either prints one JSON line per event, flushed as
it comes: ``{"msg_id"}`` first (stream), then ``{"seq", "chunk"}`` per chunk, then
``{"result"}`` or ``{"error", "type"}`` at the end."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from reach import Client, ReachError


def out(row: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


async def main(url: str, ns: str, mode: str, a: str, b: str) -> None:
    async with Client(redis_url=url, namespace=ns) as client:
        if mode == "stream":
            s: Any = client.stream(a, json.loads(b), timeout_s=120)
            await s.start()
            out({"msg_id": s.msg_id})
        else:
            s = client.resume(a, after=int(b), timeout_s=120)
        try:
            async for chunk in s:
                out({"seq": s.seq, "chunk": chunk})
        except ReachError as e:
            out({"error": str(e), "type": type(e).__name__})
            return
        out({"result": s.result})


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:6])

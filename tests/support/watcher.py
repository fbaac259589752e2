"""A second process that watches a task: ``python -m tests.support.watcher URL NS MSG_ID``
prints each change ``reach.Client.watch`` yields as one JSON line, as it comes, and exits
after the final one."""

from __future__ import annotations

import json
import sys

import anyio

from reach import Client


async def main(url: str, ns: str, msg_id: str) -> None:
    async with Client(redis_url=url, namespace=ns) as client:
        async for change in client.watch(msg_id, timeout_s=120):
            row = {
                "kind": change.kind,
                "status": change.status,
                "progress": change.progress,
                "note": change.note,
                "final": change.final,
                "error": change.task.error if change.final and change.task else "",
            }
            sys.stdout.write(json.dumps(row) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:4])

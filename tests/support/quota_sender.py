"""A sender process for tests/integration/test_quotas.py: one Client (``client_id`` given,
so every process sends as the same identity), ready once it can route, then, when the
test says go, ``n`` concurrent sends; prints one JSON line: the accepted, the refused by
which quota, and any other error.

    python -m tests.support.quota_sender URL NS CLIENT_ID CAP N READY_KEY GO_KEY
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import anyio

from reach.client import Client
from reach.connection import connect
from reach.errors import NoAgentAvailable, Overloaded


async def main(url: str, ns: str, client_id: str, cap: str, n: int, ready: str, go: str) -> None:
    r = await connect(url)
    out: Counter[str] = Counter()
    try:
        async with Client(redis_url=url, namespace=ns, client_id=client_id) as c:
            with anyio.fail_after(30):
                while True:
                    try:
                        await c.eligible(cap)
                        break
                    except NoAgentAvailable:
                        await anyio.sleep(0.05)
            await c._delivery.quotas()  # read before the go: the race is the sends'
            await r.rpush(ready, client_id)
            if await r.blpop([go], timeout=60) is None:
                raise SystemExit("no go")

            async def one(i: int) -> None:
                try:
                    await c.send(cap, i)
                    out["sent"] += 1
                except Overloaded as e:
                    out[e.limit] += 1
                except Exception as e:  # noqa: BLE001 - reported, the test fails on it
                    out[f"other: {type(e).__name__}: {e}"] += 1

            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
    finally:
        await r.aclose()
    print(json.dumps(dict(out)), flush=True)


if __name__ == "__main__":
    url, ns, client_id, cap, n, ready, go = sys.argv[1:8]
    anyio.run(main, url, ns, client_id, cap, int(n), ready, go)

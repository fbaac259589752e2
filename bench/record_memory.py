"""Bytes of Redis memory per completed message record: reach's idempotency record beside
the lean floor's (issue 27's target: at most 300 bytes with a 50-byte result).

    .venv/bin/python bench/record_memory.py [--messages 200] [--result-bytes 50]
        [--batch 1] [--json]

An embedded Redis. reach: a worker (an ``Agent`` run in this process) answers
``--messages`` requests whose handler returns a string of ``--result-bytes`` characters
(``--batch N`` > 1: sent with ``request_many`` in calls of N, so the records are written
by ``send.lua``'s batch form, where each after a call's first is a ``COPY`` of it);
every idempotency record then holds its completed state (status, fence, runs, the stored
reply). The lean floor (reach_cli.tools.lean_floor): the same number of messages sent with
its send script and completed with its completion script, each with the same result.
Printed for each: ``MEMORY USAGE`` of the records (median, min, max, in bytes), the
encoding Redis chose for them (``listpack`` is compact; ``hashtable`` costs a dict entry
and two strings per field), their field count, and the largest field value (a value past
``hash-max-listpack-value``, 64 bytes by default, turns a hash into a hashtable).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
from typing import Any

import redis
import redis.asyncio as aredis
from reach_cli.tools import lean_floor

import reach
from reach.connection import connect
from reach.embedded import RedisServer
from reach.keys import Keys
from reach.registry import Registry

NS = "bench-mem"
CAP = "mem.echo"
LEAN_STREAM = "lean:{mem}"  # the lean floor's inbox; its records share the hash tag


def _agent() -> reach.Agent:
    app = reach.Agent("mem-1", capabilities=[CAP])

    @app.handler(CAP)
    async def echo(payload: Any, ctx: reach.Context) -> Any:
        return payload

    return app


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _sizes(r: redis.Redis, keys: list[bytes]) -> dict[str, Any]:
    """What ``keys`` (hashes) cost: MEMORY USAGE figures, encodings, fields, largest value."""
    sizes = [int(r.memory_usage(k, samples=0) or 0) for k in keys]
    encodings = sorted({_text(r.object("encoding", k)) for k in keys})
    raw: dict[Any, Any] = r.hgetall(keys[-1])  # type: ignore[assignment]
    sample = {_text(f): len(v) for f, v in raw.items()}
    return {
        "records": len(keys),
        "bytes_median": statistics.median(sizes),
        "bytes_min": min(sizes),
        "bytes_max": max(sizes),
        "encodings": encodings,
        "fields": len(sample),
        "largest_value_bytes": max(sample.values()),
        "largest_field": max(sample, key=lambda f: sample[f]),
    }


async def _reach(url: str, n: int, result: str, batch: int) -> None:
    texts = [(result + f"{i:06d}")[-len(result) :] for i in range(n)]
    async with reach.Client(redis_url=url, namespace=NS) as c:
        if batch <= 1:
            for text in texts:
                got = await c.request(CAP, text, timeout_s=30)
                assert got == text, got
            return
        for first in range(0, n, batch):
            part = texts[first : first + batch]
            assert await c.request_many(CAP, part, timeout_s=30) == part


async def _lean(url: str, n: int, result: bytes) -> None:
    r: Any = aredis.Redis.from_url(url)
    stream = LEAN_STREAM
    try:
        await lean_floor.ensure_group(r, stream)
        sender = lean_floor.Sender(r, stream)
        completer = lean_floor.Completer(r, stream)
        await sender.send([result] * n, reply=lean_floor.reply_key(stream, "c1"))
        done = 0
        while done < n:
            entries = await lean_floor.read(r, stream, lean_floor.OWNER)
            codes = await completer.complete([(e, f, result) for e, f in entries])
            done += sum(1 for c in codes if c == lean_floor.DONE)
    finally:
        await r.aclose()


def _wait_eligible(url: str) -> None:
    async def wait() -> None:
        r = await connect(url)
        try:
            for _ in range(600):
                if await Registry(r, NS).agents(CAP, ready=True):
                    return
                await asyncio.sleep(0.05)
        finally:
            await r.aclose()
        raise TimeoutError("the benchmark's agent did not become ready within 30 s")

    asyncio.run(wait())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--result-bytes", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1, help="requests per request_many call")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    result = "r" * a.result_bytes
    out: dict[str, Any] = {
        "messages": a.messages,
        "result_bytes": a.result_bytes,
        "batch": a.batch,
    }
    with RedisServer() as srv:
        app = _agent()
        t = threading.Thread(
            target=lambda: asyncio.run(
                app.run(redis_url=srv.url, namespace=NS, handle_signals=False)
            ),
            daemon=True,
        )
        t.start()
        _wait_eligible(srv.url)
        asyncio.run(_reach(srv.url, a.messages, result, a.batch))
        app.stop()
        t.join(timeout=30)
        sync = redis.Redis.from_url(srv.url)
        conf: dict[Any, Any] = sync.config_get("hash-max-listpack-value")  # type: ignore[assignment]
        out["hash_max_listpack_value"] = int(_text(conf["hash-max-listpack-value"]))
        idem = Keys(NS).idem("*")
        out["reach"] = _sizes(sync, list(sync.scan_iter(match=idem, count=1000)))
        asyncio.run(_lean(srv.url, a.messages, result.encode()))
        out["lean_floor"] = _sizes(
            sync, list(sync.scan_iter(match=lean_floor.record_key(LEAN_STREAM, "*"), count=1000))
        )
        sync.close()
    out["ratio"] = out["reach"]["bytes_median"] / out["lean_floor"]["bytes_median"]
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for name in ("reach", "lean_floor"):
            f = out[name]
            print(
                f"{name:<11} {f['bytes_median']:>6.0f} bytes per record (min {f['bytes_min']}, "
                f"max {f['bytes_max']}), {f['fields']} fields, {'/'.join(f['encodings'])}, "
                f"largest value {f['largest_value_bytes']} bytes ({f['largest_field']})"
            )
        print(f"reach / lean floor: {out['ratio']:.2f}x (target: reach <= 300 bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

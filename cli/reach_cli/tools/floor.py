"""The floor of ``reach bench --floor``: the bare redis-py loop on Redis Streams that reach
is measured against, with none of reach's guarantees.

No routing, no idempotency record, no claim or fence, no retries, no dead letters, no
deadline: a stream, one consumer group, and

* the caller (:func:`stream`): pipelines ``XADD`` of ``batch`` entries at a time (one
  pipeline in flight) for the throughput workload, each naming a reply stream that
  nobody reads during the run (the floor's counterpart of reach recording every outcome
  in the message's record); :func:`request` sends one request at a time (``XADD`` with a
  reply stream) and waits for its reply with ``XREAD BLOCK``;
* the worker (``python -m reach_cli.tools.floor worker --redis-url ... --stream ...``, a
  process of its own as ``reach worker`` is): ``XREADGROUP COUNT 100 BLOCK``, then one
  pipeline per batch: a reply ``XADD`` for each entry that names a reply stream (the
  payload sent back, as reach's no-op handler returns its input) and one ``XACK`` of the
  batch. Nothing is decoded: a payload is bytes in, bytes out.

Both ends use redis-py's asyncio client (the same library, parser and event loop as
reach). "Processed" is measured as for reach (see :func:`remaining`): every entry added to
the stream was delivered to the group and acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aredis

GROUP = "floor"
READ_COUNT = 100  # entries per XREADGROUP, as the floor
BLOCK_MS = 100  # a blocked read returns this often, so SIGTERM is seen promptly
REPLY_FIELD = b"r"  # the reply stream of a request; absent for fire-and-forget
PAYLOAD_FIELD = b"p"
ID_FIELD = b"i"  # in a reply: the id of the request entry it answers


def ready_key(stream: str) -> str:
    """The key the worker sets once its group exists and it is about to read."""
    return f"{stream}:ready"


async def remaining(r: Any, stream: str, group: str) -> int:
    """Entries of ``stream`` not yet processed by ``group``: unread (the group's lag) plus
    read but not acknowledged (its pending count). 0 means every entry added was
    delivered and XACKed. Deleted entries are no obstacle: an acked entry that was then
    XDELed counts as processed. This is the definition ``reach bench`` uses for reach's
    inbox and for the floor's stream alike."""
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("XINFO", "STREAM", stream)
    pipe.execute_command("XINFO", "GROUPS", stream)
    info, groups = await pipe.execute()
    last = _field(info, "last-generated-id")
    added = int(_field(info, "entries-added"))
    for g in groups:
        if _text(_field(g, "name")) == group:
            pending = int(_field(g, "pending"))
            if _text(_field(g, "last-delivered-id")) == _text(last):
                return pending
            read = _field(g, "entries-read")
            # entries-read is exact unless entries were deleted past the group's position
            # (not the case here: only acked entries are deleted); at least 1 is unread.
            unread = max(1, added - int(read)) if read is not None else max(1, added)
            return pending + unread
    return added  # no group yet: nothing read


def _field(reply: Any, name: str) -> Any:
    # XINFO replies come as a dict (RESP3 / redis-py's parsing) or a flat list.
    if isinstance(reply, dict):
        for k, v in reply.items():
            if _text(k) == name:
                return v
        return None
    it = iter(reply)
    for k in it:
        v = next(it, None)
        if _text(k) == name:
            return v
    return None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# -- caller ------------------------------------------------------------------------------


async def stream(
    r: Any,
    stream_key: str,
    n: int,
    *,
    batch: int,
    reply_key: str = "",
    on_sent: Callable[[int], None] | None = None,
) -> None:
    """Add ``n`` entries to ``stream_key``, ``batch`` per pipeline, one pipeline at a time
    (``on_sent(total so far)`` after each). With ``reply_key`` each names that stream for
    its reply (nobody waits for it); without, the worker only acknowledges it."""
    to = (REPLY_FIELD, reply_key) if reply_key else ()
    for start in range(0, n, batch):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(start + batch, n)):
            pipe.execute_command("XADD", stream_key, "*", PAYLOAD_FIELD, b'{"i":%d}' % i, *to)
        await pipe.execute()
        if on_sent:
            on_sent(min(start + batch, n))


async def request(r: Any, stream_key: str, reply_key: str, last: bytes, i: int) -> bytes:
    """One request/reply: XADD the request naming ``reply_key``, then read the reply
    (``XREAD BLOCK`` after entry ``last``). Returns the reply's entry id (the next
    ``last``). Replies come in order: there is one request in flight."""
    req_id = await r.execute_command(
        "XADD", stream_key, "*", PAYLOAD_FIELD, b"%d" % i, REPLY_FIELD, reply_key
    )
    while True:
        got = await r.execute_command("XREAD", "BLOCK", 10_000, "STREAMS", reply_key, last)
        if not got:
            raise TimeoutError(f"floor: no reply to {req_id!r} within 10 s (is the worker up?)")
        entries = got[0][1] if isinstance(got, list) else next(iter(got.values()))[0]
        for entry_id, fields in entries:
            last = entry_id
            if fields.get(ID_FIELD) == req_id:
                return last


# -- worker ------------------------------------------------------------------------------


async def work(url: str, stream_key: str, *, consumer: str = "floor-1") -> dict[str, int]:
    """The worker loop until SIGTERM or SIGINT; returns its counts."""
    r: Any = aredis.Redis.from_url(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    counts = {"handled": 0, "replies": 0, "batches": 0, "round_trips": 0}
    try:
        try:
            await r.xgroup_create(stream_key, GROUP, id="0", mkstream=True)
        except aredis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        await r.set(ready_key(stream_key), 1)
        while not stop.is_set():
            got = await r.execute_command(
                "XREADGROUP", "GROUP", GROUP, consumer, "COUNT", READ_COUNT,
                "BLOCK", BLOCK_MS, "STREAMS", stream_key, ">",
            )  # fmt: skip
            counts["round_trips"] += 1
            if not got:
                continue
            entries = got[0][1] if isinstance(got, list) else next(iter(got.values()))[0]
            pipe = r.pipeline(transaction=False)
            ids = []
            for entry_id, fields in entries:
                ids.append(entry_id)
                to = fields.get(REPLY_FIELD)
                if to:  # a request: the no-op handler's result is its payload
                    pipe.execute_command(
                        "XADD", to, "*", ID_FIELD, entry_id, PAYLOAD_FIELD, fields[PAYLOAD_FIELD]
                    )
                    counts["replies"] += 1
            pipe.execute_command("XACK", stream_key, GROUP, *ids)
            await pipe.execute()
            counts["round_trips"] += 1
            counts["batches"] += 1
            counts["handled"] += len(ids)
    finally:
        await r.aclose()
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reach_cli.tools.floor worker --redis-url URL --stream KEY``: run the
    floor's worker until SIGTERM, then print ``floor stats: {...}`` on stderr."""
    ap = argparse.ArgumentParser(prog="python -m reach_cli.tools.floor", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run the bare XREADGROUP/XADD/XACK worker")
    w.add_argument("--redis-url", required=True)
    w.add_argument("--stream", required=True)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    counts = asyncio.run(work(a.redis_url, a.stream))
    print(
        f"floor stats: {json.dumps({**counts, 'seconds': round(time.perf_counter() - t0, 3)})}",
        file=sys.stderr,
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

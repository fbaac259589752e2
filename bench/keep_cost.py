"""Redis's own time per chunk entry for keeping a stream resumable (``keep_chunks.lua``),
beside the write every chunk entry costs anyway (its ``XADD`` to the caller's reply
stream).

An embedded Redis (a free port) gets, per round, ``--entries`` chunk entries of one chunk
each (the worst case per chunk: a slow producer's entries hold one chunk; a fast one's hold
up to 256): first as the worker writes them without keeping (``XADD <replies> MAXLEN ~
100000 * r <entry>``), then through ``keep_chunks.lua`` alone, one entry a call: once
within its bounds and once past them (every entry then deletes the oldest: the steady
state of a long stream); and ten entries a call (a slow producer's entries of 0.1 s, the
worker's keep interval, at 100 chunks/s).
``INFO commandstats`` is reset before each phase and read after it: microseconds per entry
(``xadd``; ``evalsha`` for the script, whose own commands it includes). Rounds alternate
the phases; medians.

Run:  python bench/keep_cost.py [--entries 5000] [--rounds 9] [--chunk-bytes 40]

Redis's clock counts the time a command holds the server, so a busy machine inflates the
figures: compare the phases of one run.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import anyio

from reach.connection import connect
from reach.embedded import RedisServer
from reach.envelope import CHUNK, Reply, encode
from reach.keys import Keys
from reach.scripts import script
from reach.scripts.keeping import keep_call

BATCH = 100


async def _us_per(r: Any, command: str, n: int) -> float:
    stats = await r.info("commandstats")
    return float(stats[f"cmdstat_{command}"]["usec"]) / n


async def _phase(r: Any, keys: Keys, mode: str, n: int, entry: bytes, round_no: int) -> float:
    """Microseconds of Redis per entry for ``n`` entries written as ``mode`` does."""
    msg = f"m{round_no}-{mode}"
    record, kept, replies = keys.idem(msg), keys.kept_chunks(msg), keys.replies("bench")
    await r.hset(record, mapping={"status": "running", "fence": "1"})
    max_chunks = n // 2 if mode == "keep past bounds" else 10**9
    await r.config_resetstat()
    per_call = 10 if mode == "keep, 10 a call" else 1
    for first in range(0, n, BATCH):
        async with r.pipeline(transaction=False) as p:
            for seq in range(first, min(n, first + BATCH), per_call):
                if mode == "reply write":
                    p.xadd(replies, {"r": entry}, maxlen=100_000, approximate=True)
                    continue
                entries = [(i, 1, entry) for i in range(seq, min(n, seq + per_call))]
                call = keep_call(
                    record,
                    kept,
                    entries,
                    max_chunks=max_chunks,
                    max_bytes=2**40,
                    keep_ms=3_600_000,
                )
                p.execute_command("EVALSHA", _sha(), 2, *call.keys, *call.args)
            await p.execute()
    us = await _us_per(r, "xadd" if mode == "reply write" else "evalsha", n)
    await r.delete(record, kept, replies)
    return us


def _sha() -> str:
    return script("keep_chunks").sha


async def main(entries: int, rounds: int, chunk_bytes: int) -> None:
    keys = Keys("bench")
    entry = encode(
        Reply(
            msg_id="0" * 32,
            status=CHUNK,
            result=encode(["x" * chunk_bytes]),  # type: ignore[arg-type]
            agent_id="bench-1",
            seq=1,
        )
    )
    modes = ("reply write", "keep within bounds", "keep past bounds", "keep, 10 a call")
    got: dict[str, list[float]] = {m: [] for m in modes}
    with RedisServer() as srv:
        r: Any = await connect(srv.url)
        try:
            await r.script_load(script("keep_chunks").source)
            for i in range(rounds):
                for mode in modes if i % 2 == 0 else modes[::-1]:
                    got[mode].append(await _phase(r, keys, mode, entries, entry, i))
        finally:
            await r.aclose()
    print(
        f"python bench/keep_cost.py --entries {entries} --rounds {rounds} "
        f"--chunk-bytes {chunk_bytes}  (entry {len(entry)} bytes, one chunk each)"
    )
    base = statistics.median(got["reply write"])
    for mode in modes:
        med = statistics.median(got[mode])
        print(
            f"{mode:<20} {med:6.2f} µs/entry (min {min(got[mode]):.2f}, max {max(got[mode]):.2f})"
            + (
                ""
                if mode == "reply write"
                else f"   write + keep / write: {(base + med) / base:.2f}x"
            )
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--chunk-bytes", type=int, default=40)
    a = ap.parse_args()
    anyio.run(main, a.entries, a.rounds, a.chunk_bytes)

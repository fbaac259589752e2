"""The cost of guards, per message: µs a guarded handler adds around a trivial async
handler (reach._worker.guarding.guarded, no Redis), for no guards (not wrapped), Size,
a JSON Schema, and Size with five deny patterns on input and output.

    .venv/bin/python bench/guards_bench.py [--text-chars 400] [--n 20000] [--rounds 5]

Each figure is the median of ``--rounds`` timings of ``--n`` calls (µs per message).
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from typing import Any

import anyio

from reach._worker.guarding import guarded
from reach.envelope import Envelope, encode_payload
from reach.guards import Deny, Guard, Schema, Size

PATTERNS = [
    r"ignore (all )?previous instructions",
    r"system prompt",
    r"you are now",
    r"sk-[a-z0-9]{20}",
    r"BEGIN PRIVATE KEY",
]
SETS: dict[str, list[Guard]] = {
    "none": [],
    "Size": [Size(max_input_bytes=65536, max_output_bytes=65536)],
    "Schema (JSON Schema, input)": [
        Schema(
            input={
                "type": "object",
                "required": ["text"],
                "properties": {"text": {"type": "string"}},
            }
        )
    ],
    "Size + Deny (5 patterns, input and output)": [
        Size(max_input_bytes=65536, max_output_bytes=65536),
        Deny(PATTERNS, on=["input", "output"]),
    ],
}


async def handler(payload: Any, ctx: Any) -> Any:
    return {"summary": payload["text"][:20]}


async def main(text_chars: int, n: int, rounds: int) -> None:
    base = "Redis Streams keep an append-only log of entries. "
    payload = {"text": (base * (text_chars // len(base) + 1))[:text_chars]}
    env = Envelope(msg_id="m", capability="x.y", payload=encode_payload(payload))
    for name, guards in SETS.items():
        fn = guarded(handler, True, guards, "x.y", handler, Any)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                await fn(payload, types.SimpleNamespace(envelope=env, _guards=None))
            times.append((time.perf_counter() - t0) / n * 1e6)
        print(f"{name:45s} {statistics.median(times):7.1f} µs/message")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text-chars", type=int, default=400)
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    anyio.run(main, a.text_chars, a.n, a.rounds)

"""What the call path costs per message, in-process (no Redis): encode + decode of an
envelope, and HMAC sign + check, for a top-level message (no ``hops``/``path``: what every
message sent outside a handler is) and for a handler's call 16 hops deep; and the loop
check a handler's call runs per agent proposed.

    python bench/callpath_bench.py                   # this tree
    PYTHONPATH=/path/to/older/checkout python bench/callpath_bench.py   # a baseline

The top-level figures of two trees compared show what the fields cost a message that
does not use them (docs/concepts.md, *Call graphs*). Best of 5 runs of 20,000 each, in µs.
"""

from __future__ import annotations

import timeit
from typing import Any

from reach import envelope as E
from reach.signing import Keyring

N, REPEAT = 20_000, 5


def best_us(fn: Any) -> float:
    return min(timeit.repeat(fn, number=N, repeat=REPEAT)) / N * 1e6


def main() -> None:
    ring = Keyring("bench", [b"0123456789abcdef0123456789abcdef"])
    top = E.Envelope(
        msg_id=E.new_id(),
        capability="text.summarize",
        payload=E.encode_payload({"text": "a short text to summarise"}),
        trace_id=E.new_id(),
        source="c-bench",
        reply_to="c-bench",
        deadline_ms=E.now_ms() + 30_000,
        sent_ms=E.now_ms(),
    )
    cases = {"top-level": top}
    hop = getattr(E, "Hop", None)
    if hop is not None:  # this tree has call paths
        child = E.Envelope(**{f: getattr(top, f) for f in top.__struct_fields__})
        child.hops = 16
        child.path = [hop(f"cap.n{i}", f"agent-{i}", True) for i in range(16)]
        cases["child, 16 hops"] = child
    for name, env in cases.items():
        data = E.encode(env)
        codec = best_us(lambda env=env: E.decode_envelope(E.encode(env)))

        def sign_check(env: Any = env) -> None:
            ring.sign_envelope(env)
            assert ring.check_envelope(env) is None

        signing = best_us(sign_check)
        print(
            f"{name:16} {len(data):5d} bytes  encode+decode {codec:6.2f} µs  "
            f"sign+check {signing:6.2f} µs"
        )
    if hop is not None:
        from reach.callpath import find_loop

        path = cases["child, 16 hops"].path
        loop = best_us(lambda: find_loop(path, "text.summarize", "agent-x"))
        print(f"find_loop over a 16-hop waiting path: {loop:.2f} µs")


if __name__ == "__main__":
    main()

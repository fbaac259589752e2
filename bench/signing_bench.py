"""The cost of signing, per message: µs to sign and to verify an envelope (HMAC-SHA256,
reach.signing) next to what encoding and decoding it costs anyway, and the same canonical
bytes signed and verified with Ed25519 (the `cryptography` package, if installed), to size
the per-identity mode before building it.

    .venv/bin/python bench/signing_bench.py [--payload-bytes 100] [--rounds 7]

Each figure is the median of ``--rounds`` timings of ``--n`` operations (µs per operation).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import msgspec

from reach.envelope import Envelope, Reply, decode_envelope, encode, encode_payload, new_id
from reach.signing import Keyring


def _per_op_us(fn: Callable[[], object], n: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def envelope(payload_bytes: int) -> Envelope:
    msg_id = new_id()
    return Envelope(
        msg_id=msg_id,
        capability="bench.echo",
        payload=encode_payload({"text": "x" * payload_bytes}),
        trace_id=msg_id,
        source="c-" + new_id(),
        reply_to="c-" + new_id(),
        deadline_ms=1_900_000_000_000,
        sent_ms=1_800_000_000_000,
    )


def run(payload_bytes: int, n: int, rounds: int) -> dict[str, float]:
    keys = Keyring.from_option("bench", "bench-secret-0123456789abcdef")
    assert keys is not None
    env = envelope(payload_bytes)
    keys.sign_envelope(env)
    wire = encode(env)
    unsigned_wire = encode(msgspec.structs.replace(env, kid="", sig=b""))
    decoded = decode_envelope(wire)
    reply = keys.sign_reply(
        Reply(msg_id=env.msg_id, status="succeeded", result=env.payload, agent_id="a-1")
    )
    out = {
        "encode_unsigned_us": _per_op_us(lambda: encode(env), n, rounds),
        "decode_unsigned_us": _per_op_us(lambda: decode_envelope(unsigned_wire), n, rounds),
        "hmac_sign_envelope_us": _per_op_us(lambda: keys.sign_envelope(env), n, rounds),
        "hmac_verify_envelope_us": _per_op_us(lambda: keys.check_envelope(decoded), n, rounds),
        "hmac_sign_reply_us": _per_op_us(lambda: keys.sign_reply(reply), n, rounds),
        "hmac_verify_reply_us": _per_op_us(lambda: keys.check_reply(reply), n, rounds),
        "wire_bytes_unsigned": float(len(unsigned_wire)),
        "wire_bytes_signed": float(len(wire)),
    }
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        return out
    sk = Ed25519PrivateKey.generate()
    pk = sk.public_key()
    data = keys._env_data(env)  # the same canonical bytes the HMAC covers
    sig = sk.sign(data)
    out["ed25519_sign_envelope_us"] = _per_op_us(
        lambda: sk.sign(keys._env_data(env)), max(n // 10, 100), rounds
    )
    out["ed25519_verify_envelope_us"] = _per_op_us(
        lambda: pk.verify(sig, keys._env_data(env)), max(n // 10, 100), rounds
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload-bytes", type=int, nargs="+", default=[100, 1000, 10_000])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    for size in a.payload_bytes:
        res = run(size, a.n, a.rounds)
        print(f"payload {size} bytes:")
        for k, v in res.items():
            print(f"  {k:28s} {v:9.2f}")


if __name__ == "__main__":
    main()

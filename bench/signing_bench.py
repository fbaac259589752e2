"""The cost of signing, per message: µs to sign and to verify an envelope (HMAC-SHA256,
reach.signing) next to what encoding and decoding it costs anyway, and the same canonical
bytes signed and verified with Ed25519 (the `cryptography` package, if installed), to size
the per-identity mode before building it.

    .venv/bin/python bench/signing_bench.py [--payload-bytes 100] [--rounds 7]
    .venv/bin/python bench/signing_bench.py --latency [--requests 2000] [--rounds 3]

Each figure is the median of ``--rounds`` timings of ``--n`` operations (µs per operation).
``--latency``: request/reply p50 with HMAC signing off and on (required), an agent and a
Client in this process on an embedded Redis, the two alternated ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import os
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


def latency(requests: int, rounds: int) -> dict[str, list[float]]:
    """p50 request/reply latency (ms) per round, HMAC signing off and on, alternated."""
    import threading
    from functools import partial

    import anyio

    from reach import Agent, Client, Context
    from reach.embedded import RedisServer

    secret = "bench-secret-0123456789abcdef"
    out: dict[str, list[float]] = {"off": [], "on": []}
    for var in ("REACH_SECRET", "REACH_REQUIRE_SIGNED", "REACH_IDENTITY_FILE"):
        os.environ.pop(var, None)  # "off" means off, whatever this shell exports

    async def one(url: str, ns: str, signed: bool) -> float:
        app = Agent("sig-bench-1", capabilities=["bench.echo"])

        @app.handler("bench.echo")
        async def echo(payload: object, ctx: Context) -> object:
            return payload

        kw: dict[str, object] = {"secret": secret, "require_signed": True} if signed else {}
        ready = threading.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(
                    app.run,
                    redis_url=url,
                    namespace=ns,
                    handle_signals=False,
                    ready_event=ready,
                    **kw,  # type: ignore[arg-type]
                )
            )
            while not ready.is_set():
                await anyio.sleep(0.05)
            key = secret if signed else None
            async with Client(redis_url=url, namespace=ns, secret=key) as c:
                for _ in range(200):  # warm up
                    await c.request("bench.echo", "x", timeout_s=10)
                times = []
                for _ in range(requests):
                    t = time.perf_counter()
                    await c.request("bench.echo", "x", timeout_s=10)
                    times.append(time.perf_counter() - t)
            app.stop()
        return statistics.median(times) * 1000

    async def run_all(url: str) -> None:
        for k in range(rounds):
            # Which goes first alternates: a later run may find a warmer (or fuller) Redis.
            for mode in ("off", "on") if k % 2 == 0 else ("on", "off"):
                out[mode].append(await one(url, f"sigbench{k}{mode}", mode == "on"))

    with RedisServer() as server:
        anyio.run(run_all, server.url)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload-bytes", type=int, nargs="+", default=[100, 1000, 10_000])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=None, help="7, or 3 with --latency")
    ap.add_argument("--latency", action="store_true", help="request/reply p50, off vs on")
    ap.add_argument("--requests", type=int, default=2000)
    a = ap.parse_args()
    if a.latency:
        for mode, p50s in latency(a.requests, a.rounds or 3).items():
            print(
                f"request/reply p50, signing {mode}: " + ", ".join(f"{x:.3f}" for x in p50s) + " ms"
            )
        return
    for size in a.payload_bytes:
        res = run(size, a.n, a.rounds or 7)
        print(f"payload {size} bytes:")
        for k, v in res.items():
            print(f"  {k:28s} {v:9.2f}")


if __name__ == "__main__":
    main()

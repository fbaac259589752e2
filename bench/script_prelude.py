"""What a script call costs Redis before its own work starts, counted in instructions:
``send.lua`` and ``settle.lua`` called for one message (a lone request's calls).

Redis runs an ``EVALSHA`` script from its top at every call: the includes' functions and
tables, the script's own definitions, then its argument check, then its writes. For each
script this counts, under Valgrind's callgrind (as ``bench/redis_instructions.py`` does),
the instructions per call of three forms given the very same KEYS and ARGV:

- **floor**: a script that only returns (what any ``EVALSHA`` with these arguments costs:
  reading the request, the KEYS and ARGV tables, the reply);
- **prelude**: the script cut before its argument check (its top-level code, run anew at
  every call);
- **whole**: the script itself (check and writes too).

Each form runs ``--calls`` times, each call on a fresh message (sent with ``send.lua``, read
with ``XREADGROUP``, as a worker settles it; the settle forms are given the entries the
sends made). The prelude and check parts are Lua work a batch call pays once; a lone
request pays them in full, and they are the share of its Redis time a library of Redis
Functions (loaded once, called with ``FCALL``) would not pay again per call.

Run:  python bench/script_prelude.py [--calls 200] [--redis-server PATH]
Needs ``valgrind`` (with ``callgrind_control``) on PATH.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.redis_instructions

from bench.redis_instructions import (
    AGENT,
    LEASE_MS,
    OWNER,
    PAYLOAD,
    STORED,
    Counted,
    _read_all,
    _until_up,
    counted_redis,
)
from reach.embedded import find_server_binary
from reach.envelope import Envelope, encode, new_id
from reach.keys import GROUP, Keys
from reach.scripts import _loader, inbox
from reach.scripts.delivery import Completion, SettleItem, settle_call
from reach.tasks import TASK_TTL_MS

# Where each script's argument check starts (its prelude ends), and what a cut form
# returns: a reply its caller's parser takes.
CUTS = {
    "send": ("local err, max, n = check()", "0"),
    "settle": ("local err = check()", "{1}"),
}


def _forms(name: str) -> dict[str, str]:
    """The three sources of script ``name``: floor, prelude, whole."""
    src = _loader.script(name).source
    marker, ret = CUTS[name]
    at = src.index(marker)  # a script changed past its marker fails here, loudly
    return {
        "floor": f"return {ret}",
        "prelude": f"{src[:at]}do return {ret} end\n{src[at:]}",
        "whole": src,
    }


def _sha(src: str) -> str:
    return hashlib.sha1(src.encode()).hexdigest()


async def measure(url: str, counter: Counted, calls: int) -> dict[str, dict[str, float]]:
    """Instructions per call of each script's three forms: ``{script: {form: n}}``."""
    await _until_up(url)
    r: Any = aredis.Redis.from_url(url)
    keys = Keys("instr")
    # The send forms write to the normal inbox (never read); the settle forms' messages go
    # to the low one, read there.
    stream = keys.inbox(AGENT, "low")
    await r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    out: dict[str, dict[str, float]] = {"send": {}, "settle": {}}

    def message() -> inbox.Message:
        env = Envelope(msg_id=new_id(), capability="instr.echo", payload=PAYLOAD)
        return inbox.Message.of(env, encode(env))

    def send_op(m: inbox.Message, sha: str, priority: str = "normal") -> tuple[Any, ...]:
        call = inbox.send_call(
            keys,
            m,
            agent_id=AGENT,
            priority=priority,
            ttl_ms=TASK_TTL_MS,
            claim_for=OWNER,
            claim_lease_ms=LEASE_MS,
        )
        return ("EVALSHA", sha, len(call.keys), *call.keys, *call.args)

    async def count(ops: list[tuple[Any, ...]]) -> float:
        counter.zero()
        for op in ops:
            await r.execute_command(*op)
        return counter.count() / len(ops)

    try:
        for form, src in _forms("send").items():
            sha = await r.script_load(src)
            assert sha == _sha(src)
            await count([send_op(message(), sha) for _ in range(10)])  # warm
            out["send"][form] = await count([send_op(message(), sha) for _ in range(calls)])
        real = _loader.script("send").sha
        await r.script_load(_loader.script("send").source)
        for form, src in _forms("settle").items():
            ms = [message() for _ in range(calls + 10)]
            for m in ms:
                await r.execute_command(*send_op(m, real, "low"))
            got = await _read_all(r, stream, "w", len(ms), 50, group=GROUP)
            sha = await r.script_load(src)
            ops = []
            for m, (entry_id, _) in zip(ms, got, strict=True):
                item = SettleItem(
                    stream,
                    entry_id,
                    Completion(keys.idem(m.key), 1, "succeeded", "done", stored=STORED),
                )
                call = settle_call([item], ttl_ms=TASK_TTL_MS)
                ops.append(("EVALSHA", sha, len(call.keys), *call.keys, *call.args))
            await count(ops[:10])  # warm
            out["settle"][form] = await count(ops[10:])
    finally:
        await r.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="calls of each form")
    ap.add_argument(
        "--redis-server", default=None,
        help="the server binary to count (default: the one reach would embed)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.calls < 1:
        raise SystemExit("--calls must be >= 1.")
    binary = args.redis_server or find_server_binary().path
    with counted_redis(binary) as (url, counter):
        out = anyio.run(measure, url, counter, args.calls)
    print(f"Redis instructions per call, one message a call ({args.calls} calls a form):")
    print(f"  {'script':8s} {'floor':>9s} {'prelude':>9s} {'check+writes':>13s} {'whole':>9s}")
    for name, f in out.items():
        print(
            f"  {name:8s} {f['floor']:9,.0f} {f['prelude'] - f['floor']:9,.0f} "
            f"{f['whole'] - f['prelude']:13,.0f} {f['whole']:9,.0f}"
        )


if __name__ == "__main__":
    main()

"""Redis's own time per message in ``send.lua`` and ``settle.lua``, and how much of it is
Lua outside the Redis commands.

An embedded Redis (a free port) gets ``--rounds`` batches of ``--batch`` messages to one
agent's inbox through ``send.lua``'s batch form (each claimed at send, as ``Client.send``
claims them), then the same messages read and settled as succeeded in batches of
``--batch`` through ``settle.lua`` (as a worker settles a quick handler's outcomes; no
reply stream, no index of recent messages). ``INFO commandstats`` is reset before each
phase and read after it: the script's microseconds per message (``evalsha``), those of
the commands it ran (every other ``cmdstat_``: Redis counts a script's commands too), and
the difference, the Lua work around them (argument checks, tables, each ``redis.call``'s
own cost).

Run:  python bench/script_cost.py [--batch 34] [--rounds 200] [--json]

Redis's clock counts the time a script holds the server, so a busy machine inflates the
figures: compare runs made together.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio

from reach._autopipe import AutoPipeline
from reach.connection import connect
from reach.embedded import RedisServer
from reach.envelope import Envelope, encode, new_id
from reach.keys import Keys
from reach.scripts import inbox
from reach.scripts.delivery import GROUP, Completion, SettleItem, settle
from reach.tasks import TASK_TTL_MS

AGENT = "cost-1"
OWNER = f"{AGENT}/instance-1"
LEASE_MS = 600_000
STORED = b"\x91\x81\xa1i\x01"  # a short stored reply: [{"i": 1}]


def _delivery() -> inbox.Delivery:
    env = Envelope(msg_id=new_id(), capability="cost.echo", payload=b"\x81\xa1i\x01")
    return inbox.Delivery(inbox.Message.of(env, encode(env)), AGENT, "normal", 0, OWNER, LEASE_MS)


async def _stats(r: Any, n: int) -> dict[str, Any]:
    st = await r.info("commandstats")
    script = st.get("cmdstat_evalsha", {}).get("usec", 0)
    inner = sum(v["usec"] for k, v in st.items() if k not in ("cmdstat_evalsha",))
    calls = {k[8:]: round(v["calls"] / n, 3) for k, v in st.items() if k != "cmdstat_evalsha"}
    return {
        "script_us": script / n,
        "commands_us": inner / n,
        "lua_outside_us": (script - inner) / n,
        "commands_per_msg": calls,
    }


async def measure(batch: int, rounds: int) -> dict[str, Any]:
    with RedisServer() as srv:
        r = await connect(srv.url)
        commands = AutoPipeline(await connect(srv.url))
        keys = Keys("cost")
        stream = keys.inbox(AGENT, "normal")
        await r.xgroup_create(stream, GROUP, id="0", mkstream=True)
        try:
            warm = [_delivery() for _ in range(batch)]
            await inbox.send_many(commands, keys, warm, cluster=False, ttl_ms=TASK_TTL_MS)
            batches = [[_delivery() for _ in range(batch)] for _ in range(rounds)]
            await r.config_resetstat()
            for ds in batches:
                await inbox.send_many(commands, keys, ds, cluster=False, ttl_ms=TASK_TTL_MS)
            n = batch * rounds
            send = await _stats(r, n)
            got = await r.xreadgroup(GROUP, "w", {stream: ">"}, count=n + batch)
            ids = [e[0] for e in got[0][1]]
            everything = [warm, *batches]

            def items(k: int) -> list[SettleItem]:
                return [
                    SettleItem(
                        stream,
                        ids[k * batch + i],
                        Completion(keys.idem(d.message.key), 1, "succeeded", "done", stored=STORED),
                    )
                    for i, d in enumerate(everything[k])
                ]

            await settle(commands, items(0), cluster=False, ttl_ms=TASK_TTL_MS)
            await r.config_resetstat()
            for k in range(1, rounds + 1):
                codes = await settle(commands, items(k), cluster=False, ttl_ms=TASK_TTL_MS)
                if not all(c == 1 for c in codes):
                    raise RuntimeError(f"settle refused: {codes[:5]}")
            settled = await _stats(r, n)
        finally:
            await commands.aclose()
            await r.aclose()
    return {"batch": batch, "rounds": rounds, "send": send, "settle": settled}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=34, help="messages per script call")
    ap.add_argument("--rounds", type=int, default=200, help="script calls per phase")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    out = anyio.run(measure, args.batch, args.rounds)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"batches of {out['batch']}, {out['rounds']} calls per phase (µs per message)")
    for phase in ("send", "settle"):
        f = out[phase]
        print(
            f"  {phase}.lua: {f['script_us']:.2f} in the script, {f['commands_us']:.2f} in "
            f"its commands, {f['lua_outside_us']:.2f} Lua around them; commands per "
            f"message: {f['commands_per_msg']}"
        )


if __name__ == "__main__":
    main()

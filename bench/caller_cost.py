"""The caller's CPU per ``Client.send``: the whole of it, and its Python path alone.

An embedded Redis (a free port) and ``reach worker`` running the benchmark agent (as
``reach bench`` starts them); then ``--senders`` tasks of one ``Client`` call
``Client.send`` until ``--messages`` are sent, as ``reach bench``'s streaming phase does.
Printed: the caller's CPU microseconds per send (``time.process_time``, user and system),
and sends per second.

``--fake-redis``: the coalesced inbox write (``send.lua``) answers at once without Redis
(a made-up entry id after one event-loop turn), so the figure is the Python path of a send
alone: the envelope, the pick, the coalescer; no packing of script arguments, no socket.
The difference between the two runs is what the write to Redis costs the caller. With
``--many``, the ``send.lua`` calls ``send_many`` hands to its connection answer so (each
message a made-up entry id, one event-loop turn later): its path up to the connection's
writer, without packing, socket or reply (the lean floor's caller is not run then).

``--commands``: also Redis's commands per message over the rounds (``INFO
commandstats``; those a script runs counted too), with the worker's reads and settles,
then the microseconds Redis's clock gave each per message (a script's ``evalsha``
includes the commands it ran) beside Redis's whole CPU per message (``INFO cpu``, user and
system): what the scripts take of it, and what is spent outside any command.

``--many N``: the rounds call ``Client.send_many`` with batches of ``N`` payloads instead
(one task, one call at a time), and the same process then times the lean floor's caller
(:mod:`reach_cli.tools.lean_floor`: one ``SEND_LUA`` call per batch of ``N``, one at a time)
on the same Redis; printed beside each other with their ratio, the figure issue 27's
"``send_many`` costs the caller less per message than the lean floor's caller" is judged by.

``--calls``: instead of timing, count the caller's Python function calls per send
(cProfile over the rounds) and list the ``--top`` functions: repeatable where the timed
figure moves by a fifth on this VM, so compare code with it (quote the timed figure for
time). With ``--fake-redis`` the count is the Python path alone.

Run:  python bench/caller_cost.py [--messages 30000] [--senders 50] [--fake-redis]
          [--repeat 3] [--commands] [--calls [--top 25]] [--many 500]

The figures are the caller's alone; ``reach bench --floor`` gives them beside the lean
floor's in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import resource
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import anyio
from reach_cli.tools import lean_floor
from reach_cli.tools.bench import CAP, NS
from reach_cli.tools.bench.processes import _reach_worker_cmd, _wait_ready

from reach import Client
from reach._sending import coalesce
from reach.embedded import RedisServer
from reach.scripts import inbox


def _cpu() -> resource.struct_rusage:
    # getrusage: microsecond resolution (os.times counts 10 ms ticks, coarse against a round)
    return resource.getrusage(resource.RUSAGE_SELF)


async def _fake_send_many(*_: Any, **__: Any) -> list[inbox.Sent]:
    ds: Sequence[Any] = _[2]
    await asyncio.sleep(0)
    return [inbox.Sent(entry_id="1-1") for _ in ds]


async def _fake_send(*_: Any, **__: Any) -> inbox.Sent:
    await asyncio.sleep(0)
    return inbox.Sent(entry_id="1-1")


def _fake_submit(*words: Any) -> asyncio.Future[Any]:
    # EVALSHA sha numkeys ...: send.lua's compact form (ARGV[1] '=') names 3 + n keys for
    # n messages, its batch form 3n + 3 for n >= 2 (a reply per message), its one-message
    # form 3 or 6 (one reply)
    numkeys = int(words[2])
    if words[3 + numkeys] in ("=", b"="):
        reply: Any = [b"1-1"] * (numkeys - 3)
    else:
        reply = [b"1-1"] * ((numkeys - 3) // 3) if numkeys >= 9 else b"1-1"
    fut = asyncio.get_running_loop().create_future()
    fut.get_loop().call_soon(fut.set_result, reply)
    return fut


async def _round(c: Client, n: int, senders: int) -> tuple[float, float, float]:
    sent = 0

    async def sender() -> None:
        nonlocal sent
        while sent < n:
            i = sent
            sent += 1
            await c.send(CAP, {"i": i})

    t0, w0 = _cpu(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(senders):
            tg.start_soon(sender)
    t1, w1 = _cpu(), time.perf_counter()
    return (
        (t1.ru_utime - t0.ru_utime) / n * 1e6,
        (t1.ru_stime - t0.ru_stime) / n * 1e6,
        n / (w1 - w0),
    )


async def _many_round(c: Client, n: int, batch: int) -> tuple[float, float, float]:
    t0, w0 = _cpu(), time.perf_counter()
    for start in range(0, n, batch):
        out = await c.send_many(CAP, [{"i": i} for i in range(start, min(start + batch, n))])
        if not all(isinstance(x, str) for x in out):
            raise SystemExit(
                f"send_many failed: {next(x for x in out if not isinstance(x, str))!r}"
            )
    t1, w1 = _cpu(), time.perf_counter()
    return (
        (t1.ru_utime - t0.ru_utime) / n * 1e6,
        (t1.ru_stime - t0.ru_stime) / n * 1e6,
        n / (w1 - w0),
    )


async def _lean_round(r: Any, n: int, batch: int, k: int) -> tuple[float, float, float]:
    t0, w0 = _cpu(), time.perf_counter()
    await lean_floor.stream(r, f"{{lean-caller-{k}}}", n, batch=batch)
    t1, w1 = _cpu(), time.perf_counter()
    return (
        (t1.ru_utime - t0.ru_utime) / n * 1e6,
        (t1.ru_stime - t0.ru_stime) / n * 1e6,
        n / (w1 - w0),
    )


async def _commandstats(r: Any) -> dict[str, tuple[int, int]]:
    """Per command: its calls and microseconds so far, and ``cpu``: Redis's CPU (user +
    system) in microseconds so far."""
    stats = await r.info("commandstats")
    out = {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in stats.items()}
    cpu = await r.info("cpu")
    out["cpu"] = (0, int((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6))
    return out


def _start_worker(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _reach_worker_cmd(url, 64), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


async def _main(url: str, args: argparse.Namespace) -> None:
    worker = _start_worker(url)
    try:
        await _wait_ready(url)
        async with Client(redis_url=url, namespace=NS) as c:
            await c.eligible(CAP)
            for i in range(200):  # the quotas, splits and view read, the script loaded
                await c.send(CAP, {"i": i})
            if args.fake_redis and args.many:
                c._delivery.commands.submit = _fake_submit  # type: ignore[method-assign]
            elif args.fake_redis:
                coalesce.inbox.send_many = _fake_send_many  # type: ignore[assignment]
                coalesce.inbox.send = _fake_send  # type: ignore[assignment]
            r = c.commands.redis
            before = await _commandstats(r)
            prof = cProfile.Profile() if args.calls else None
            if prof is not None:
                prof.enable()
            rounds = [
                await (
                    _many_round(c, args.messages, args.many)
                    if args.many
                    else _round(c, args.messages, args.senders)
                )
                for _ in range(args.repeat)
            ]
            if prof is not None:
                prof.disable()
                _print_calls(prof, args.messages * args.repeat, args.top)
                return
            if args.commands:
                await anyio.sleep(1.0)  # the worker settles what it has read
                after = await _commandstats(r)
                n = args.messages * args.repeat
                zero = (0, 0)
                per = {k: (v[0] - before.get(k, zero)[0]) / n for k, v in after.items()}
                shown = {k: round(v, 3) for k, v in sorted(per.items(), key=lambda x: -x[1])}
                print("Redis commands per message:", {k: v for k, v in shown.items() if v})
                us = {k: (v[1] - before.get(k, zero)[1]) / n for k, v in after.items()}
                cpu = us.pop("cpu")
                top = {k: round(v, 2) for k, v in sorted(us.items(), key=lambda x: -x[1])[:8]}
                print(f"Redis CPU per message {cpu:.2f} µs; by its clock, µs per message:", top)
            if args.many and not args.fake_redis:
                lean = [
                    await _lean_round(r, args.messages, args.many, k) for k in range(args.repeat)
                ]
    finally:
        worker.terminate()
        worker.wait()
    user = statistics.median(r[0] for r in rounds)
    system = statistics.median(r[1] for r in rounds)
    rate = statistics.median(r[2] for r in rounds)
    what = "Python path alone (Redis faked)" if args.fake_redis else "real Redis and worker"
    how = f"send_many of {args.many}" if args.many else f"{args.senders} senders"
    print(f"caller, {what}, {how}, medians of {args.repeat} rounds:")
    least = min(r[0] + r[1] for r in rounds)
    print(
        f"  CPU per send {user + system:.1f} µs (user {user:.1f}, system {system:.1f});"
        f" least of the rounds {least:.1f}"
    )
    print(f"  sends per second {rate:,.0f}")
    if args.many and not args.fake_redis:
        lu = statistics.median(r[0] + r[1] for r in lean)
        ll = min(r[0] + r[1] for r in lean)
        print(f"lean floor's caller, {args.many} a call, medians of {args.repeat} rounds:")
        print(f"  CPU per send {lu:.1f} µs; least of the rounds {ll:.1f}")
        print(f"  sends per second {statistics.median(r[2] for r in lean):,.0f}")
        print(
            f"  ratio reach send_many / lean floor: {(user + system) / lu:.2f} of the medians,"
            f" {least / ll:.2f} of the least (goal < 1)"
        )


def _print_calls(prof: cProfile.Profile, n: int, top: int) -> None:
    stats: Any = pstats.Stats(prof).stats
    per = {func: row[1] / n for func, row in stats.items()}  # row[1]: calls, recursive too
    print(f"caller: function calls per send: {sum(per.values()):.1f} ({n:,} sends)")
    for (path, line, name), v in sorted(per.items(), key=lambda kv: -kv[1])[:top]:
        where = name if path == "~" else f"{'/'.join(path.split('/')[-2:])}:{line} {name}"
        print(f"  {v:6.2f}  {where}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=30000, help="sends per round")
    p.add_argument("--senders", type=int, default=50, help="concurrent sending tasks")
    p.add_argument("--repeat", type=int, default=3, help="rounds (medians are printed)")
    p.add_argument("--fake-redis", action="store_true", help="the Python path alone")
    p.add_argument("--commands", action="store_true", help="Redis's commands per message")
    p.add_argument("--many", type=int, default=0, help="send_many batches of this size")
    p.add_argument("--calls", action="store_true", help="count function calls per send instead")
    p.add_argument("--top", type=int, default=25, help="functions listed with --calls")
    args = p.parse_args()
    if args.many < 0:
        p.error("--many takes a batch size of 1 or more")
    with RedisServer() as srv:
        anyio.run(_main, srv.url, args)


if __name__ == "__main__":
    main()

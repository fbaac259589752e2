"""The lean floor of ``reach bench --floor``: the simplest correct redis-py code that keeps
reach's core guarantees on Redis Streams, so that the benchmark can tell what the
guarantees themselves cost (against the bare floor, :mod:`reach_cli.tools.floor`) from
what the rest of reach costs (against this).

The guarantees kept, and how:

* **an idempotency record per message**, written in the same atomic step as its inbox
  entry: a hash ``status pending, owner <claim owner>, fence 1`` with a 24 h expiry
  (reach's ``TASK_TTL_MS``). The caller (:func:`stream`, :func:`request`) sends a batch of
  messages to one inbox with one call of :data:`SEND_LUA` (``FLOOR_BATCH`` = 500 a call in
  the benchmark, one call in flight), each message claimed at send for the worker that
  will run it, as reach claims at send;
* **a fenced completion**: the worker (``python -m reach_cli.tools.lean_floor worker
  --redis-url ... --stream ...``, a process of its own) reads ``XREADGROUP COUNT 100
  BLOCK`` and completes each batch with one call of :data:`COMPLETE_LUA`: per message, the
  record must still be claimed by this worker with its fence, or the completion is refused
  and changes nothing (a stale worker whose claim was taken over cannot overwrite the new
  owner's outcome); a record already ``done`` is not completed twice (its entry is only
  acknowledged, no second reply);
* **the outcome stored and the reply published with the ack**: the result into the record
  (``status done``), the reply ``XADD`` onto the caller's reply stream (with the record's
  TTL), ``XACK`` and ``XDEL`` of the entry, all in that one atomic call, so a crash
  leaves either nothing done or everything done.

Not kept (they are reach's, not the core's): routing by capability, retries, dead letters,
deadlines, priorities, signing. The handler is a no-op returning its payload, as the
benchmark's reach agent does. Every key a script touches is passed in ``KEYS`` (none built
inside Lua), as a Redis Cluster requires; the benchmark keeps an inbox's records and reply
stream under the inbox's hash tag (:func:`record_key`, :func:`reply_key`), so one call
touches one slot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aredis

GROUP = "lean"
READ_COUNT = 100  # entries per XREADGROUP, as the bare floor and the design
BLOCK_MS = 100  # a blocked read returns this often, so SIGTERM is seen promptly
RECORD_TTL_MS = 24 * 3600 * 1000  # reach's TASK_TTL_MS: records and reply streams
OWNER = "lean-1"  # the worker the benchmark's messages are claimed for at send
FENCE = 1  # the fence of a claim made at send
ID_FIELD = b"i"  # the message id (entries and replies)
PAYLOAD_FIELD = b"p"
REPLY_FIELD = b"r"  # the reply stream of a request; absent: nobody is waiting

# Completion codes of COMPLETE_LUA, one per message.
DONE = 1  # completed now: result stored, reply published, entry acked and deleted
REFUSED = 0  # the claim is not this worker's (owner or fence differ): nothing changed
ALREADY_DONE = 2  # completed before: the entry acked and deleted, no second reply
NO_RECORD = -1  # no record (expired, or never written): nothing changed

SEND_LUA = """
-- lean floor, send: add a batch of messages to one inbox, each entry with its
-- idempotency record, in one atomic step.
-- KEYS[1]      the inbox stream
-- KEYS[1 + j]  the idempotency record of message j (j = 1..n)
-- ARGV[1]      the claim owner (the worker that is to run these messages)
-- ARGV[2]      the claim's fence (integer)
-- ARGV[3]      the records' TTL in ms (integer)
-- ARGV[4]      the reply stream's key, or '' for fire-and-forget
-- ARGV[3 + 2j], ARGV[4 + 2j]  message j's id and payload
-- Returns: the number of entries added. A record that already exists is left as it
-- is and its message is not added again (a resent message id runs once): such messages
-- are not counted.
local n = #KEYS - 1
local added = 0
for j = 1, n do
  local rec = KEYS[1 + j]
  local id, payload = ARGV[3 + 2 * j], ARGV[4 + 2 * j]
  if redis.call('HSETNX', rec, 'status', 'pending') == 1 then
    redis.call('HSET', rec, 'owner', ARGV[1], 'fence', ARGV[2])
    redis.call('PEXPIRE', rec, ARGV[3])
    if ARGV[4] ~= '' then
      redis.call('XADD', KEYS[1], '*', 'i', id, 'p', payload, 'r', ARGV[4])
    else
      redis.call('XADD', KEYS[1], '*', 'i', id, 'p', payload)
    end
    added = added + 1
  end
end
return added
"""

COMPLETE_LUA = """
-- lean floor, complete: the fenced completion of a batch of handled messages of one
-- inbox, in one atomic step.
-- KEYS[1]      the inbox stream
-- then, per message in order: its idempotency record, followed by its reply stream when
--              the message names one (ARGV says which)
-- ARGV[1]      the inbox's consumer group
-- ARGV[2]      this worker's claim owner
-- ARGV[3]      this worker's fence (integer)
-- ARGV[4]      the reply streams' TTL in ms (integer)
-- then 4 slots per message j, from a = 5 + 4(j-1) on:
-- ARGV[a]      its entry id in the inbox
-- ARGV[a + 1]  its message id (the reply carries it, for the caller to match)
-- ARGV[a + 2]  its result
-- ARGV[a + 3]  '1' if its reply stream follows its record in KEYS, else '0'
-- Returns: a code per message, in order: 1 done (result stored, reply published, entry
-- acked and deleted); 0 refused, the record is claimed by another owner or fence
-- (nothing changes: no result, no reply, the entry stays pending); 2 already done before
-- (the entry is acked and deleted, no second reply); -1 no record (nothing changes).
local codes = {}
local acked = {}
local replied = {}
local k = 2
for a = 5, #ARGV, 4 do
  local rec = KEYS[k]
  local reply = nil
  if ARGV[a + 3] == '1' then
    reply = KEYS[k + 1]
    k = k + 2
  else
    k = k + 1
  end
  local r = redis.call('HMGET', rec, 'status', 'owner', 'fence')
  local code
  if not r[1] then
    code = -1
  elseif r[1] == 'done' then
    code = 2
  elseif r[2] ~= ARGV[2] or r[3] ~= ARGV[3] then
    code = 0
  else
    redis.call('HSET', rec, 'status', 'done', 'result', ARGV[a + 2])
    if reply then
      redis.call('XADD', reply, '*', 'i', ARGV[a + 1], 'p', ARGV[a + 2])
      replied[reply] = true
    end
    code = 1
  end
  if code == 1 or code == 2 then
    acked[#acked + 1] = ARGV[a]
  end
  codes[#codes + 1] = code
end
-- The TTL once per reply stream of the batch: the same expiry as one per reply.
for stream, _ in pairs(replied) do
  redis.call('PEXPIRE', stream, ARGV[4])
end
if #acked > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(acked))
  redis.call('XDEL', KEYS[1], unpack(acked))
end
return codes
"""


def record_key(stream: str, msg_id: bytes | str) -> str:
    """The idempotency record of message ``msg_id`` sent to inbox ``stream``. It shares the
    inbox's hash tag when ``stream`` has one (``lean:{name}``), so a send or completion call
    touches one Cluster slot."""
    return f"{stream}:rec:{msg_id.decode() if isinstance(msg_id, bytes) else msg_id}"


def reply_key(stream: str, caller: str) -> str:
    """The reply stream of caller ``caller`` of inbox ``stream`` (under its hash tag)."""
    return f"{stream}:reply:{caller}"


# -- caller ------------------------------------------------------------------------------


class Sender:
    """A caller's side of one inbox: sends batches with :data:`SEND_LUA`, each message with
    a fresh id (this sender's random prefix and a counter) claimed at send for ``owner``
    with ``fence``."""

    def __init__(self, r: Any, stream_key: str, *, owner: str = OWNER, fence: int = FENCE):
        self.stream_key = stream_key
        self.owner = owner
        self.fence = fence
        self._script = r.register_script(SEND_LUA)
        self._prefix = uuid.uuid4().hex[:12]
        self._next = 0

    def new_id(self) -> bytes:
        self._next += 1
        return b"%s.%d" % (self._prefix.encode(), self._next)

    async def send(self, payloads: Sequence[bytes], *, reply: str = "") -> list[bytes]:
        """Send ``payloads`` (one call); returns their message ids, in order."""
        ids = [self.new_id() for _ in payloads]
        keys = [self.stream_key, *(record_key(self.stream_key, i) for i in ids)]
        args: list[Any] = [self.owner, self.fence, RECORD_TTL_MS, reply]
        for msg_id, payload in zip(ids, payloads, strict=True):
            args += (msg_id, payload)
        added = await self._script(keys=keys, args=args)
        if int(added) != len(ids):  # fresh ids: a record that exists would be a bug
            raise RuntimeError(f"lean floor: {len(ids) - int(added)} messages not added")
        return ids


async def stream(
    r: Any,
    stream_key: str,
    n: int,
    *,
    batch: int,
    reply: str = "",
    on_sent: Callable[[int], None] | None = None,
) -> list[bytes]:
    """Send ``n`` messages to ``stream_key``, ``batch`` per :data:`SEND_LUA` call, one call
    at a time (``on_sent(total so far)`` after each). With ``reply`` each names that reply
    stream (nobody waits for it during the run). Returns the message ids."""
    sender = Sender(r, stream_key)
    ids: list[bytes] = []
    for start in range(0, n, batch):
        stop = min(start + batch, n)
        ids += await sender.send([b'{"i":%d}' % i for i in range(start, stop)], reply=reply)
        if on_sent:
            on_sent(stop)
    return ids


async def request(r: Any, sender: Sender, reply: str, last: bytes, payload: bytes) -> bytes:
    """One request/reply: send one message naming ``reply``, then read that stream (``XREAD
    BLOCK`` after entry ``last``) until the reply carrying its message id comes. Returns
    the reply's entry id (the next ``last``). Replies come in order: one request is in
    flight."""
    [msg_id] = await sender.send([payload], reply=reply)
    while True:
        got = await r.execute_command("XREAD", "BLOCK", 10_000, "STREAMS", reply, last)
        if not got:
            raise TimeoutError(f"lean floor: no reply to {msg_id!r} within 10 s")
        entries = got[0][1] if isinstance(got, list) else next(iter(got.values()))[0]
        for entry_id, fields in entries:
            last = entry_id
            if fields.get(ID_FIELD) == msg_id:
                return bytes(last)


# -- worker ------------------------------------------------------------------------------


class Completer:
    """A worker's fenced completion of the batches it read from one inbox: one
    :data:`COMPLETE_LUA` call a batch, as ``owner`` holding ``fence``."""

    def __init__(
        self, r: Any, stream_key: str, *, group: str = GROUP, owner: str = OWNER, fence: int = FENCE
    ):
        self.stream_key = stream_key
        self.group = group
        self.owner = owner
        self.fence = fence
        self._script = r.register_script(COMPLETE_LUA)

    async def complete(self, done: Sequence[tuple[bytes, dict[bytes, bytes], bytes]]) -> list[int]:
        """Complete ``done``: (entry id, the entry's fields, the handler's result) each.
        Returns a code per entry (:data:`DONE`, :data:`REFUSED`, :data:`ALREADY_DONE`,
        :data:`NO_RECORD`)."""
        keys = [self.stream_key]
        args: list[Any] = [self.group, self.owner, self.fence, RECORD_TTL_MS]
        for entry_id, fields, result in done:
            msg_id = fields[ID_FIELD]
            keys.append(record_key(self.stream_key, msg_id))
            to = fields.get(REPLY_FIELD)
            if to:
                keys.append(to.decode())
            args += (entry_id, msg_id, result, b"1" if to else b"0")
        return [int(c) for c in await self._script(keys=keys, args=args)]


async def read(
    r: Any, stream_key: str, consumer: str, *, group: str = GROUP, count: int = READ_COUNT
) -> list[Any]:
    """One ``XREADGROUP COUNT 100 BLOCK 100`` (``count``: another COUNT): the entries
    delivered (maybe none)."""
    got = await r.execute_command(
        "XREADGROUP", "GROUP", group, consumer, "COUNT", count,
        "BLOCK", BLOCK_MS, "STREAMS", stream_key, ">",
    )  # fmt: skip
    if not got:
        return []
    return list(got[0][1] if isinstance(got, list) else next(iter(got.values()))[0])


async def ensure_group(r: Any, stream_key: str, group: str = GROUP) -> None:
    try:
        await r.xgroup_create(stream_key, group, id="0", mkstream=True)
    except aredis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise


async def work(
    url: str, stream_key: str, *, owner: str = OWNER, fence: int = FENCE
) -> dict[str, int]:
    """The worker loop until SIGTERM or SIGINT: read a batch, run the no-op handler (the
    result is the payload), complete the batch; returns its counts."""
    from . import floor  # the ready key is the bare floor's, so the bench waits alike

    r: Any = aredis.Redis.from_url(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    counts = {"handled": 0, "replies": 0, "refused": 0, "batches": 0, "round_trips": 0}
    completer = Completer(r, stream_key, owner=owner, fence=fence)
    try:
        await ensure_group(r, stream_key)
        await r.set(floor.ready_key(stream_key), 1)
        while not stop.is_set():
            entries = await read(r, stream_key, owner)
            counts["round_trips"] += 1
            if not entries:
                continue
            codes = await completer.complete([(e, f, f[PAYLOAD_FIELD]) for e, f in entries])
            counts["round_trips"] += 1
            counts["batches"] += 1
            for (_, fields), code in zip(entries, codes, strict=True):
                if code == DONE:
                    counts["handled"] += 1
                    counts["replies"] += REPLY_FIELD in fields
                else:
                    counts["refused"] += 1
    finally:
        await r.aclose()
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reach_cli.tools.lean_floor worker --redis-url URL --stream KEY``: run the
    lean floor's worker until SIGTERM, then print ``lean floor stats: {...}`` on stderr
    (its counts, wall seconds and ``cpu_s``: the CPU seconds this process used)."""
    ap = argparse.ArgumentParser(prog="python -m reach_cli.tools.lean_floor", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="run the guarantee-keeping worker")
    w.add_argument("--redis-url", required=True)
    w.add_argument("--stream", required=True)
    w.add_argument("--owner", default=OWNER, help="the claim owner it completes as")
    w.add_argument("--fence", type=int, default=FENCE)
    a = ap.parse_args(argv)
    t0, cpu0 = time.perf_counter(), time.process_time()
    counts = asyncio.run(work(a.redis_url, a.stream, owner=a.owner, fence=a.fence))
    stats = {
        **counts,
        "seconds": round(time.perf_counter() - t0, 3),
        "cpu_s": round(time.process_time() - cpu0, 4),
    }
    print(f"lean floor stats: {json.dumps(stats)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

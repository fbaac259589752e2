"""The lean floor of `reach bench --floor` (reach_cli.tools.lean_floor) keeps the guarantees
it stands for: every message's record ends ``done`` once with its result, every request is
answered once, the inbox ends empty with nothing pending, and a completion by a worker
whose claim is stale (another owner, or an older fence) is refused and changes nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis
from reach_cli.tools import floor
from reach_cli.tools import lean_floor as lean

pytestmark = pytest.mark.anyio


def _inbox() -> str:
    return f"lean-test:{{{uuid.uuid4().hex[:8]}}}"


async def _drain(r: Any, s: str, completer: lean.Completer, consumer: str) -> list[int]:
    """Read and complete batches (the worker's steps, called directly) until none is left."""
    codes: list[int] = []
    while entries := await lean.read(r, s, consumer):
        codes += await completer.complete([(e, f, f[lean.PAYLOAD_FIELD]) for e, f in entries])
    return codes


async def test_every_record_done_once_with_its_result_and_one_reply_each(redis_url: str) -> None:
    r: Any = aredis.Redis.from_url(redis_url)
    s = _inbox()
    reply = lean.reply_key(s, "c1")
    ids: list[bytes] = []
    try:
        await lean.ensure_group(r, s)
        ids = await lean.stream(r, s, 250, batch=100, reply=reply)  # 3 send calls
        assert len(set(ids)) == 250 and await r.xlen(s) == 250
        rec = await r.hgetall(lean.record_key(s, ids[0]))
        assert rec == {b"status": b"pending", b"owner": b"lean-1", b"fence": b"1"}
        ttl = await r.pttl(lean.record_key(s, ids[0]))
        assert lean.RECORD_TTL_MS - 60_000 < ttl <= lean.RECORD_TTL_MS

        codes = await _drain(r, s, lean.Completer(r, s), "lean-1")
        assert codes == [lean.DONE] * 250
        for i, msg_id in enumerate(ids):
            rec = await r.hgetall(lean.record_key(s, msg_id))
            assert rec[b"status"] == b"done" and rec[b"result"] == b'{"i":%d}' % i
        # One reply per message, carrying its id and result; the reply stream expires.
        replies = await r.xrange(reply)
        assert [f[lean.ID_FIELD] for _, f in replies] == ids
        assert [f[lean.PAYLOAD_FIELD] for _, f in replies][:2] == [b'{"i":0}', b'{"i":1}']
        assert 0 < await r.pttl(reply) <= lean.RECORD_TTL_MS
        # The inbox is empty and the group has nothing pending or unread.
        assert await r.xlen(s) == 0 and await floor.remaining(r, s, lean.GROUP) == 0
        assert (await r.xpending(s, lean.GROUP))["pending"] == 0

        # A second completion of the same entries (a redelivery) completes nothing again:
        # no second reply, the results unchanged.
        first = await r.xrange(reply)
        again = await lean.Completer(r, s).complete(
            [(b"0-1", {lean.ID_FIELD: ids[0], lean.REPLY_FIELD: reply.encode()}, b"other")]
        )
        assert again == [lean.ALREADY_DONE]
        assert await r.xrange(reply) == first
        assert (await r.hget(lean.record_key(s, ids[0]), "result")) == b'{"i":0}'
    finally:
        await r.delete(s, reply, *[lean.record_key(s, i) for i in ids])
        await r.aclose()


async def test_a_stale_owners_completion_is_refused_and_changes_nothing(redis_url: str) -> None:
    r: Any = aredis.Redis.from_url(redis_url)
    s = _inbox()
    reply = lean.reply_key(s, "c1")
    ids: list[bytes] = []
    try:
        await lean.ensure_group(r, s)
        ids = await lean.stream(r, s, 30, batch=500, reply=reply)
        before = {i: await r.hgetall(lean.record_key(s, i)) for i in ids}
        # Another owner, then the right owner with an older fence (its claim taken over).
        for consumer, completer in (
            ("lean-2", lean.Completer(r, s, owner="lean-2")),
            ("lean-1", lean.Completer(r, s, fence=0)),
        ):
            entries = await lean.read(r, s, consumer)
            if not entries:  # the second reads what the first left pending
                claimed = await r.xautoclaim(s, lean.GROUP, consumer, 0, "0-0", count=100)
                entries = claimed[1]
            assert len(entries) == 30
            codes = await completer.complete([(e, f, b"stale") for e, f in entries])
            assert codes == [lean.REFUSED] * 30
            assert {i: await r.hgetall(lean.record_key(s, i)) for i in ids} == before
            assert not await r.exists(reply)
            assert await r.xlen(s) == 30 and await floor.remaining(r, s, lean.GROUP) == 30
        # A message whose record is gone (expired) is refused as well.
        await r.delete(lean.record_key(s, ids[0]))
        claimed = await r.xautoclaim(s, lean.GROUP, "lean-1", 0, "0-0", count=100)
        codes = await lean.Completer(r, s).complete([(e, f, b"ok") for e, f in claimed[1]])
        assert codes == [lean.NO_RECORD] + [lean.DONE] * 29
        assert await r.xlen(s) == 1 and len(await r.xrange(reply)) == 29
    finally:
        await r.delete(s, reply, *[lean.record_key(s, i) for i in ids])
        await r.aclose()


def test_worker_process_answers_each_request_once_and_reports_counts(redis_url: str) -> None:
    s = _inbox()
    reply = lean.reply_key(s, "caller")

    async def drive() -> list[bytes]:
        r: Any = aredis.Redis.from_url(redis_url)
        try:
            with anyio.fail_after(30):
                while not await r.get(floor.ready_key(s)):
                    await anyio.sleep(0.02)
            ids = await lean.stream(r, s, 120, batch=50, reply=reply)
            sender = lean.Sender(r, s)
            last = b"0-0"
            with anyio.fail_after(30):
                while await floor.remaining(r, s, lean.GROUP):
                    await anyio.sleep(0.01)
                last = (await r.xrevrange(reply, count=1))[0][0]
                for i in range(3):
                    last = await lean.request(r, sender, reply, last, b"%d" % i)
            replies = await r.xrange(reply)
            assert len(replies) == 123
            assert [f[lean.PAYLOAD_FIELD] for _, f in replies[-3:]] == [b"0", b"1", b"2"]
            for msg_id in ids:
                assert await r.hget(lean.record_key(s, msg_id), "status") == b"done"
            assert await r.xlen(s) == 0 and await floor.remaining(r, s, lean.GROUP) == 0
            return ids
        finally:
            await r.aclose()

    w = subprocess.Popen(
        [sys.executable, "-m", "reach_cli.tools.lean_floor", "worker", "--redis-url",
         redis_url, "--stream", s],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    ids: list[bytes] = []
    try:
        ids = anyio.run(drive)
    finally:
        w.send_signal(signal.SIGTERM)
        _, err = w.communicate(timeout=30)

        async def clean() -> None:
            r: Any = aredis.Redis.from_url(redis_url)
            await r.delete(s, reply, floor.ready_key(s), *[lean.record_key(s, i) for i in ids])
            await r.aclose()

        anyio.run(clean)
    assert w.returncode == 0, err
    line = next(x for x in err.decode().splitlines() if x.startswith("lean floor stats: "))
    stats = json.loads(line.removeprefix("lean floor stats: "))
    assert stats["handled"] == stats["replies"] == 123 and stats["refused"] == 0
    assert stats["cpu_s"] > 0

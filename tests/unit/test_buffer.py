"""The outage buffer (reach._buffer) on its own: its bounds, its expiry, its order.

The delivery it is given is a fake that refuses while ``down`` is set, as a
``Delivery.deliver_many`` reports an unreachable Redis (a RedisUnavailable in place).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest

from reach import metrics
from reach._buffer import SendBuffer
from reach.envelope import Envelope, new_id, now_ms
from reach.errors import ConfigError, DeadlineExceeded, NoAgentAvailable, RedisUnavailable

pytestmark = pytest.mark.anyio


class FakeRedis:
    """What the buffer delivers through: down (every message unreachable) or up (each
    message recorded in order; ``refuse`` maps a msg_id to the error it gets)."""

    def __init__(self) -> None:
        self.down = True
        self.sent: list[str] = []
        self.calls: list[list[str]] = []
        self.refuse: dict[str, Exception] = {}
        self.up_after: int | None = None  # up for this many messages of the next call only
        self.delivered = anyio.Event()

    async def deliver_many(
        self, envs: list[Envelope], where: Mapping[str, Any] | None
    ) -> list[str | Exception]:
        await anyio.lowlevel.checkpoint()
        self.calls.append([e.msg_id for e in envs])
        out: list[str | Exception] = []
        for i, env in enumerate(envs):
            up = not self.down or (self.up_after is not None and i < self.up_after)
            if not up:
                out.append(RedisUnavailable("Cannot reach Redis at redis://x (refused)."))
            elif env.msg_id in self.refuse:
                out.append(self.refuse[env.msg_id])
            else:
                self.sent.append(env.msg_id)
                out.append("agent-1")
        self.up_after = None
        if self.sent:
            self.delivered.set()
        return out


def env(
    cap: str = "t.buf", *, deadline_ms: int = 0, reply: bool = False, size: int = 1
) -> Envelope:
    return Envelope(
        msg_id=new_id(),
        capability=cap,
        payload=msgspec.Raw(msgspec.msgpack.encode("x" * size)),
        deadline_ms=deadline_ms,
        reply_to="c-1" if reply else "",
    )


@pytest.fixture
async def tg() -> AsyncIterator[anyio.abc.TaskGroup]:
    async with anyio.create_task_group() as tg:
        yield tg
        tg.cancel_scope.cancel()


def buffer(fake: FakeRedis, **kw: Any) -> SendBuffer:
    return SendBuffer(fake.deliver_many, name="client t", redis_url="redis://x", **kw)


async def until(cond: Any, what: str) -> None:
    with anyio.fail_after(10, shield=False):
        while not cond():
            await anyio.sleep(0.005)
    assert cond(), what


def dropped(cap: str, reason: str) -> float:
    v = metrics.REGISTRY.get_sample_value(
        "reach_client_buffer_dropped_total", {"capability": cap, "reason": reason}
    )
    return v or 0.0


def held_now() -> float:
    return metrics.REGISTRY.get_sample_value("reach_client_buffer_messages") or 0.0


async def test_over_the_message_bound_raises_at_once(tg: anyio.abc.TaskGroup) -> None:
    fake = FakeRedis()
    b = buffer(fake, max_messages=3)
    for _ in range(3):
        b.hold(env(), None, reply=False, tg=tg, cause=RedisUnavailable("down (refused)"))
    with pytest.raises(RedisUnavailable, match="buffer_max_messages=3") as e:
        b.hold(env(), None, reply=False, tg=tg)
    assert "pending_local" in str(e.value)
    assert len(b.pending()) == 3


async def test_over_the_byte_bound_raises_at_once(tg: anyio.abc.TaskGroup) -> None:
    fake = FakeRedis()
    b = buffer(fake, max_bytes=1000)
    b.hold(env(size=600), None, reply=False, tg=tg)
    with pytest.raises(RedisUnavailable, match="buffer_max_bytes=1000"):
        b.hold(env(size=600), None, reply=False, tg=tg)
    b.hold(env(size=100), None, reply=False, tg=tg)  # what fits still goes in
    assert len(b.pending()) == 2


async def test_bad_bounds_are_refused() -> None:
    fake = FakeRedis()
    with pytest.raises(ConfigError):
        buffer(fake, max_messages=-1)
    with pytest.raises(ConfigError):
        buffer(fake, max_age_s=0)
    with pytest.raises(ConfigError):
        buffer(fake, max_age_s=float("nan"))


async def test_held_messages_flush_in_order_when_redis_is_back(tg: anyio.abc.TaskGroup) -> None:
    fake = FakeRedis()
    b = buffer(fake)
    # Two capabilities interleaved: batches break where the capability changes.
    envs = [env("t.a" if i % 7 < 4 else "t.b") for i in range(600)]
    gauge = held_now()
    for e in envs:
        b.hold(e, None, reply=False, tg=tg)
    assert held_now() == gauge + 600
    recs = b.pending()
    assert [r.msg_id for r in recs] == [e.msg_id for e in envs]
    assert all(r.queued_ms <= now_ms() and not r.reply for r in recs)
    await until(lambda: len(fake.calls) >= 3, "the flusher retried while down")
    assert fake.sent == []
    fake.down = False
    await until(lambda: not b.active, "the buffer emptied")
    assert fake.sent == [e.msg_id for e in envs]
    assert b.pending() == [] and b.flushed == 600 and b.dropped == 0
    assert held_now() == gauge


async def test_a_batch_cut_by_the_outage_keeps_order_without_duplicates(
    tg: anyio.abc.TaskGroup,
) -> None:
    fake = FakeRedis()
    b = buffer(fake)
    envs = [env() for _ in range(10)]
    fake.up_after = 4  # the first call: 4 written, then the connection drops
    for e in envs:
        b.hold(e, None, reply=False, tg=tg)
    await until(lambda: len(fake.calls) >= 2, "a retry after the cut")
    assert fake.sent == [e.msg_id for e in envs[:4]]
    assert [r.msg_id for r in b.pending()] == [e.msg_id for e in envs[4:]]
    fake.down = False
    await until(lambda: not b.active, "the buffer emptied")
    assert fake.sent == [e.msg_id for e in envs]


async def test_an_expired_send_is_dropped_and_counted(tg: anyio.abc.TaskGroup) -> None:
    fake = FakeRedis()
    b = buffer(fake)
    before = dropped("t.exp", "deadline")
    short = env("t.exp", deadline_ms=now_ms() + 100)
    long = env("t.exp", deadline_ms=now_ms() + 60_000)
    b.hold(short, None, reply=False, tg=tg)
    b.hold(long, None, reply=False, tg=tg)
    assert b.pending()[0].deadline_ms == short.deadline_ms == b.pending()[0].expires_ms
    await until(lambda: len(b.pending()) == 1, "the expired send dropped")
    assert b.pending()[0].msg_id == long.msg_id
    assert dropped("t.exp", "deadline") == before + 1 and b.dropped == 1
    fake.down = False
    await until(lambda: not b.active, "the buffer emptied")
    assert fake.sent == [long.msg_id], "never sent past its deadline"


async def test_the_age_bound_drops_a_send_without_deadline(tg: anyio.abc.TaskGroup) -> None:
    fake = FakeRedis()
    b = buffer(fake, max_age_s=0.1)
    before = dropped("t.age", "age")
    e = env("t.age")
    b.hold(e, None, reply=False, tg=tg)
    assert b.pending()[0].expires_ms - b.pending()[0].queued_ms == 100
    await until(lambda: not b.pending(), "dropped at its age")
    assert dropped("t.age", "age") == before + 1
    fake.down = False
    h = b.hold(env("t.age"), None, reply=False, tg=tg)
    await h.done.wait()
    assert e.msg_id not in fake.sent and fake.sent == [h.env.msg_id]


async def test_a_request_is_told_at_its_deadline_and_never_sent(tg: anyio.abc.TaskGroup) -> None:
    fake = FakeRedis()
    b = buffer(fake)
    e = env(deadline_ms=now_ms() + 200, reply=True)
    h = b.hold(e, None, reply=True, tg=tg)
    assert b.pending()[0].reply
    t0 = now_ms()
    with pytest.raises(DeadlineExceeded, match="never sent"):
        await b.wait(h)
    assert now_ms() - t0 < 5000
    assert not b.active or all(r.msg_id != e.msg_id for r in b.pending())
    fake.down = False
    later = b.hold(env(), None, reply=False, tg=tg)
    await later.done.wait()
    assert fake.sent == [later.env.msg_id]


async def test_a_request_past_the_age_bound_gets_redis_unavailable(
    tg: anyio.abc.TaskGroup,
) -> None:
    b = buffer(FakeRedis(), max_age_s=0.1)
    h = b.hold(env(deadline_ms=now_ms() + 60_000, reply=True), None, reply=True, tg=tg)
    with pytest.raises(RedisUnavailable, match="buffer_max_age_s=0.1"):
        await b.wait(h)


async def test_a_waiting_request_gets_its_agent_or_its_error(tg: anyio.abc.TaskGroup) -> None:
    fake = FakeRedis()
    b = buffer(fake, settle_s=0)
    ok = b.hold(env(deadline_ms=now_ms() + 60_000, reply=True), None, reply=True, tg=tg)
    bad = b.hold(env(deadline_ms=now_ms() + 60_000, reply=True), None, reply=True, tg=tg)
    fake.refuse[bad.env.msg_id] = NoAgentAvailable("no agent", capability="t.buf")
    fake.down = False
    assert await b.wait(ok) == "agent-1"
    with pytest.raises(NoAgentAvailable):
        await b.wait(bad)


async def test_a_send_refused_at_the_flush_is_dropped_and_counted(
    tg: anyio.abc.TaskGroup,
) -> None:
    fake = FakeRedis()
    b = buffer(fake, settle_s=0)
    before = dropped("t.ref", "error")
    a, c = env("t.ref"), env("t.ref")
    fake.refuse[a.msg_id] = NoAgentAvailable("no agent", capability="t.ref")
    b.hold(a, None, reply=False, tg=tg)
    b.hold(c, None, reply=False, tg=tg)
    fake.down = False
    await until(lambda: not b.active, "the buffer emptied")
    assert fake.sent == [c.msg_id]
    assert dropped("t.ref", "error") == before + 1


async def test_close_drops_what_is_left_and_tells_the_waiting_request(
    tg: anyio.abc.TaskGroup,
) -> None:
    fake = FakeRedis()
    b = buffer(fake)
    before = dropped("t.close", "closed")
    h = b.hold(env("t.close", deadline_ms=now_ms() + 60_000, reply=True), None, reply=True, tg=tg)
    b.hold(env("t.close"), None, reply=False, tg=tg)
    await b.close(0.05)
    assert not b.active and b.pending() == []
    assert dropped("t.close", "closed") == before + 2
    with pytest.raises(RedisUnavailable, match="closed"):
        await b.wait(h)
    assert fake.sent == []


async def test_no_agent_right_after_the_outage_is_tried_again(tg: anyio.abc.TaskGroup) -> None:
    # The agents' records read lease-missed until their first heartbeat after an outage.
    fake = FakeRedis()
    b = buffer(fake, settle_s=30)
    a, c = env(), env()
    for e in (a, c):
        fake.refuse[e.msg_id] = NoAgentAvailable("lease missed", capability="t.buf")
    b.hold(a, None, reply=False, tg=tg, cause=RedisUnavailable("down (refused)"))
    b.hold(c, None, reply=False, tg=tg)
    fake.down = False
    await until(lambda: len(fake.calls) >= 3, "tried again")
    assert fake.sent == [] and [r.msg_id for r in b.pending()] == [a.msg_id, c.msg_id]
    fake.refuse.clear()  # the agent heartbeats again
    await until(lambda: not b.active, "the buffer emptied")
    assert fake.sent == [a.msg_id, c.msg_id] and b.dropped == 0


async def test_a_request_whose_caller_is_cancelled_leaves_the_buffer(
    tg: anyio.abc.TaskGroup,
) -> None:
    fake = FakeRedis()
    b = buffer(fake)
    before = dropped("t.cancel", "cancelled")
    h = b.hold(env("t.cancel", deadline_ms=now_ms() + 60_000, reply=True), None, reply=True, tg=tg)
    with anyio.move_on_after(0.1):  # the caller's own timeout
        await b.wait(h)
    assert b.pending() == [] and not b.active
    assert dropped("t.cancel", "cancelled") == before + 1
    fake.down = False
    later = b.hold(env("t.cancel"), None, reply=False, tg=tg)
    await later.done.wait()
    assert fake.sent == [later.env.msg_id], "the cancelled request was never sent"

"""reach._worker.workqueue.WorkQueue: the handler pool's queue."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from reach._worker.workqueue import WorkQueue

pytestmark = pytest.mark.anyio


def item(i: int) -> Any:
    return f"item-{i}"  # the queue never looks inside its items


async def test_items_come_out_in_order_and_at_once_when_there() -> None:
    q = WorkQueue()
    for i in range(3):
        q.put(item(i))
    assert q.waiting == 3
    assert [await q.get() for _ in range(3)] == [item(0), item(1), item(2)]
    assert q.waiting == 0


async def test_a_put_wakes_one_idle_taker_per_item() -> None:
    q = WorkQueue()
    got: list[Any] = []

    async def taker() -> None:
        got.append(await q.get())

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(taker)
        await anyio.wait_all_tasks_blocked()
        q.put(item(0))
        q.put(item(1))
        await anyio.wait_all_tasks_blocked()
        assert sorted(got) == [item(0), item(1)]
        q.put(item(2))
    assert sorted(got) == [item(0), item(1), item(2)]


async def test_a_taker_cancelled_as_it_is_woken_loses_no_item() -> None:
    # Woken, then cancelled before it ran: either it still takes the item (anyio delivers
    # the cancellation later) or it passes the wake-up on; the item is never lost.
    q = WorkQueue()
    got: list[Any] = []
    scope = anyio.CancelScope()

    async def first() -> None:
        with scope:
            got.append(await q.get())

    async def second() -> None:
        got.append(await q.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        q.put(item(0))  # wakes the first idle taker...
        scope.cancel()  # ... cancelled before it runs
        await anyio.wait_all_tasks_blocked()
        assert got == [item(0)]
        q.put(item(1))  # whoever is left takes the next one
        await anyio.wait_all_tasks_blocked()
        assert got == [item(0), item(1)]
        tg.cancel_scope.cancel()
    assert q.waiting == 0


async def test_a_raw_cancellation_after_the_wake_up_passes_it_on() -> None:
    # asyncio's own cancel (not anyio's scope) reaches the taker although its wake-up came:
    # the wake-up goes to the next idle taker.
    import asyncio

    q = WorkQueue()
    first = asyncio.ensure_future(q.get())
    second = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.put(item(0))
    first.cancel()
    assert await second == item(0)
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_retirement_goes_ahead_of_the_items_queued() -> None:
    """A handler resuming after it waited for input takes a slot back: the next task to
    ask for work gets None (it leaves the pool) before any item queued, and the resumer's
    future is done then."""
    q = WorkQueue()
    q.put(item(0))
    turn = q.retire()
    assert not turn.done()
    assert await q.get() is None
    assert turn.done()
    assert await q.get() == item(0)


async def test_a_retirement_wakes_an_idle_task() -> None:
    q = WorkQueue()
    got: list[Any] = []

    async def taker() -> None:
        got.append(await q.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(taker)
        await anyio.wait_all_tasks_blocked()
        turn = q.retire()
        await turn  # the idle task retired
    assert got == [None]


async def test_a_batch_put_at_once_costs_two_wake_ups_not_one_per_item() -> None:
    """A task woken for a batch takes its items in turn while its handlers return at once;
    the one other task it woke finds nothing left."""
    q = WorkQueue()
    got: dict[str, list[Any]] = {"a": [], "b": []}

    async def taker(name: str) -> None:
        while (it := await q.get()) is not None:
            got[name].append(it)  # a quick handler: no wait

    async with anyio.create_task_group() as tg:
        tg.start_soon(taker, "a")
        tg.start_soon(taker, "b")
        await anyio.wait_all_tasks_blocked()
        for i in range(5):
            q.put(item(i))
        await anyio.wait_all_tasks_blocked()
        assert sorted(got["a"] + got["b"]) == [item(i) for i in range(5)]
        assert [] in got.values()  # one task took the whole batch
        tg.cancel_scope.cancel()


async def test_a_handler_that_waits_lets_the_rest_of_its_batch_start() -> None:
    q = WorkQueue()
    release = anyio.Event()
    started: list[Any] = []

    async def taker() -> None:
        while (it := await q.get()) is not None:
            started.append(it)
            await release.wait()  # every handler waits

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(taker)
        await anyio.wait_all_tasks_blocked()
        for i in range(3):
            q.put(item(i))
        await anyio.wait_all_tasks_blocked()
        assert sorted(started) == [item(0), item(1), item(2)]
        tg.cancel_scope.cancel()


async def test_take_gives_what_waits_at_once_and_leaves_a_retirement_to_get() -> None:
    q = WorkQueue()
    assert q.take() is None  # nothing there
    q.put(item(0))
    q.put(item(1))
    assert q.take() == item(0)
    turn = q.retire()
    assert q.take() is None  # a task is to retire first: get() says so
    assert await q.get() is None and turn.done()
    assert q.take() == item(1)


async def test_a_freed_slot_wakes_the_waiter_at_once() -> None:
    """WorkerState.wait_slot returns when a handler frees a slot, not after its one-second
    bound; a slot freed while nobody waits wakes nobody later."""
    import time

    from reach._worker.state import WorkerState

    st = WorkerState("a", "i", "ns")
    st.slot_freed()  # nobody waits: nothing to remember
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(st.wait_slot)
        await anyio.wait_all_tasks_blocked()
        st.slot_freed()
    assert time.monotonic() - t0 < 0.5

"""reach._expiry.expire_after: asyncio.timeout's contract (its own cancellation out as
TimeoutError, anyone else's through), kept by one loop timer for every limit under way."""

from __future__ import annotations

import asyncio
import time

import pytest

from reach import _expiry
from reach._expiry import expire_after


def test_an_await_past_its_limit_raises_timeout_error_and_leaves_no_cancel_behind() -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError), expire_after(0.02) as limit:
            await asyncio.sleep(5)
        assert limit.expired
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)  # not cancelled later either

    asyncio.run(asyncio.wait_for(main(), 5))


def test_an_await_within_its_limit_returns_and_none_means_no_limit() -> None:
    async def main() -> None:
        with expire_after(5) as limit:
            await asyncio.sleep(0.01)
        assert not limit.expired
        with expire_after(None) as none:
            await asyncio.sleep(0.01)
        assert not none.expired
        table = _expiry._limits(asyncio.get_running_loop())
        assert not any(e[2].live for e in table.heap)  # nothing left under way

    asyncio.run(main())


def test_someone_elses_cancel_passes_through_as_cancelled() -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def victim() -> None:
            with expire_after(5):
                started.set()
                await asyncio.sleep(5)

        t = asyncio.create_task(victim())
        await started.wait()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())


def test_a_cancel_arriving_with_the_limit_stays_a_cancel() -> None:
    # The limit fires and someone else cancels the same task before it runs again: the
    # other cancellation must not be swallowed as a timeout.
    async def main() -> None:
        ready = asyncio.Event()

        async def victim() -> None:
            with expire_after(0.01):
                ready.set()
                await asyncio.sleep(5)

        t = asyncio.create_task(victim())
        await ready.wait()
        time.sleep(0.03)  # noqa: ASYNC251 - the limit due; the loop runs this task first, then its timer
        await asyncio.sleep(0)
        t.cancel()  # before the timer's own cancel; the victim runs after both
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())


def test_limits_of_many_tasks_each_fire_at_their_own_time() -> None:
    # One timer for all: it follows the earliest limit, and a later one noted while it is
    # armed fires at its own time, neither early nor missed.
    async def one(limit_s: float, run_s: float) -> str:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            with expire_after(limit_s):
                await asyncio.sleep(run_s)
            return "done"
        except TimeoutError:
            took = loop.time() - t0
            assert took >= limit_s - 0.002, (limit_s, took)
            return "timed out"

    async def main() -> list[str]:
        return await asyncio.gather(
            one(0.3, 0.05), one(0.05, 1), one(0.5, 0.1), one(0.02, 1), one(0.15, 1)
        )

    assert asyncio.run(main()) == ["done", "timed out", "done", "timed out", "timed out"]


def test_each_event_loop_has_its_own_table() -> None:
    async def table() -> object:
        with expire_after(1):
            await asyncio.sleep(0)
        return _expiry._limits(asyncio.get_running_loop())

    assert asyncio.run(table()) is not asyncio.run(table())


def test_outside_an_event_loop_it_is_refused() -> None:
    with pytest.raises(RuntimeError), expire_after(1):
        pass


def test_ended_limits_do_not_pile_up() -> None:
    # Long limits whose blocks end at once (a request's wait: an hour, answered in a
    # millisecond) leave the heap bounded, and a short one among them still fires.
    async def main() -> None:
        for _ in range(10_000):
            with expire_after(3600):
                await asyncio.sleep(0)
        table = _expiry._limits(asyncio.get_running_loop())
        assert len(table.heap) <= 2 * _expiry._COMPACT_AT + 2, len(table.heap)
        with pytest.raises(TimeoutError), expire_after(0.02):
            await asyncio.sleep(5)

    asyncio.run(main())

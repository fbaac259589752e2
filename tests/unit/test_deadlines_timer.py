"""reach._worker.cancelling.Deadlines: one loop timer ends every async handler at its
deadline; a run that ended first is never touched; a later deadline is armed after the
earlier one fired; an earlier one added later moves the timer forward."""

from __future__ import annotations

import asyncio

import pytest

from reach._worker.cancelling import Cancels, Deadlines, Run

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def run_of(task: asyncio.Task[None], name: str) -> Run:
    r = Run(f"rec-{name}", name, Cancels.__new__(Cancels))
    r.task = task
    return r


async def test_each_run_is_expired_at_its_own_deadline_and_an_ended_one_never() -> None:
    d = Deadlines()
    tasks = {n: asyncio.ensure_future(asyncio.sleep(3600)) for n in ("late", "early", "done")}
    runs = {n: run_of(t, n) for n, t in tasks.items()}
    d.add(runs["late"], 0.2)
    d.add(runs["early"], 0.02)  # earlier than the armed timer: moves it forward
    d.add(runs["done"], 0.01)
    d.discard(runs["done"])  # ended before its deadline
    async with asyncio.timeout(30):
        await asyncio.gather(tasks["early"], tasks["late"], return_exceptions=True)
    assert runs["early"].expired and runs["late"].expired
    assert tasks["early"].cancelled() and tasks["late"].cancelled()
    assert not runs["done"].expired and not tasks["done"].done()
    tasks["done"].cancel()
    assert d._runs == {} and d._timer is None


async def test_a_cut_run_is_not_expired_and_a_past_deadline_expires_at_once() -> None:
    d = Deadlines()
    t1 = asyncio.ensure_future(asyncio.sleep(3600))
    cut = run_of(t1, "cut")
    cut.cut = True  # a cancel's grace passed first: it ends cancelled, not timed out
    t2 = asyncio.ensure_future(asyncio.sleep(3600))
    past = run_of(t2, "past")
    d.add(cut, 0)
    d.add(past, -5)
    async with asyncio.timeout(30):
        await asyncio.gather(t2, return_exceptions=True)
    assert past.expired and t2.cancelled()
    assert not cut.expired and not t1.done()
    t1.cancel()

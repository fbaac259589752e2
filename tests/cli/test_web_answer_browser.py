"""`reach web` in a real browser answers a task waiting for input: a real `reach worker`
process's handler asks (``ctx.ask``), the message's page shows the question, *Answer…*
opens the form, the answer typed and sent resumes the handler, and the
page turns succeeded. Skipped without Chromium or Playwright, as tests/cli/test_web_browser.py
(whose fixtures it uses)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from reach.client import Client
from reach.connection import AnyRedis
from tests.cli.test_web_browser import Console, browser, console, page  # noqa: F401 - fixtures
from tests.support.agents_ask import REFUND
from tests.support.agents_messaging import wait_eligible
from tests.support.waiting import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def asker(browser: None, redis_url: str, ns: str) -> Iterator[Workers]:  # noqa: F811
    w = Workers(redis_url, ns, "tests.support.agents_ask")
    w.start("ask_a")
    yield w
    w.stop_all()


async def test_a_question_answered_in_the_browser(
    asker: Workers,
    console: Console,  # noqa: F811
    page: Any,  # noqa: F811
    r: AnyRedis,
    ns: str,
) -> None:
    base = await console.url()
    async with Client(redis=r, namespace=ns) as client:
        await wait_eligible(client, REFUND, ["ask-a"], timeout=30)
        msg_id = await client.send(REFUND, {"order": "B-12"}, timeout_s=120)
        await page.goto(base + f"/message?id={msg_id}")
        await page.wait_for_function(  # the page follows the task (its live stream)
            "() => document.getElementById('task-status')?.textContent === 'input_required'"
        )
        assert await page.inner_text("#task-question") == "Refund order B-12?"
        # The page re-renders as its live stream updates it: a click landing on the link
        # as it is replaced is lost, so it is clicked again until the form shows (3 tries).
        # A slow form page is waited for, not clicked again (the link is gone from it).
        for attempt in range(3):
            if await page.query_selector("#answer-msg") is not None:
                await page.click("#answer-msg")
            try:
                await page.wait_for_selector("#answer-text", timeout=10_000)
                break
            except Exception:  # playwright's TimeoutError
                if attempt == 2:
                    raise
        assert await page.inner_text("#question") == "Refund order B-12?"
        await page.fill("#answer-text", '{"refund": true}')
        await page.click("#confirm")
        await page.wait_for_url(f"**/message?id={msg_id}**note=answered**")
        await page.wait_for_function(
            "() => document.getElementById('task-status')?.textContent === 'succeeded'"
        )
        assert await client.result(msg_id, timeout_s=30) == {
            "answer": {"refund": True},
            "agent": "ask-a",
        }

        async def no_answer_link() -> bool:
            return await page.query_selector("#answer-msg") is None

        await wait_until(no_answer_link, what="the Answer link gone")

"""`reach web` in a real browser: headless Chromium (Debian's package, driven by Playwright
through its executable path; no browser download) against a real `reach web` process, a
real Redis and a real `reach worker`.

One walk through the console: an agent appears on the open overview without a reload
(the live stream), a dead letter is replayed by clicking (through the confirmation page)
and its message turns succeeded, and a click drains the agent, which leaves the page.
Screenshots are kept in $REACH_WEB_SCREENSHOTS (else the test's tmp_path).

Without Chromium or the playwright package the test is skipped, with the reason, before
any process starts; with REACH_REQUIRE_BROWSER=1 (what .ci/run sets) it fails instead: CI
never passes it unseen. REACH_CHROMIUM names another executable (.ci/run points it at a
path that does not exist, to check the skip).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from reach.client import Client
from reach.connection import AnyRedis
from reach.keys import Keys
from reach.registry import Registry
from reach.tasks import get_status
from tests.support.agents_messaging import wait_eligible

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("REACH_CHROMIUM") or "/usr/bin/chromium"
# Chromium as this machine runs it: no sandbox (root), no GPU, no network of its own
# (background connections would be refused, many at a time), a fresh profile per launch.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FAST = [
    "--heartbeat-s",
    "0.1",
    "--lease-s",
    "0.5",
    "--evict-after-s",
    "1.0",
    "--sweep-interval-s",
    "0.1",
    "--drain-timeout-s",
    "5",
]
WAIT_MS = 20_000

pytestmark = pytest.mark.anyio


def _need_browser() -> None:
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install playwright; no browser download)")
    if missing:
        why = "the browser test needs " + " and ".join(missing)
        if os.environ.get("REACH_REQUIRE_BROWSER") == "1":
            pytest.fail(why + " (REACH_REQUIRE_BROWSER=1)")
        pytest.skip(why)


@pytest.fixture
def browser() -> None:
    """Skip (or fail, REACH_REQUIRE_BROWSER=1) before anything starts: a process started and
    stopped at once would be interrupted in its start-up, not by the test."""
    _need_browser()


class Console:
    """A `reach web` process on a free port (started at once; :meth:`url` waits for it)."""

    def __init__(self, redis_url: str, ns: str) -> None:
        self.served = False  # it printed its URL: its Ctrl-C handling is in place
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reach_cli.app", "web", "--port", "0", "--interval", "0.2"]
            + ["--redis-url", redis_url, "--namespace", ns],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def url(self) -> str:
        """The URL it prints once it answers."""
        out = self.proc.stdout
        assert out is not None
        with anyio.fail_after(60):
            while not select.select([out], [], [], 0)[0]:
                assert self.proc.poll() is None, f"reach web exited with {self.proc.returncode}"
                await anyio.sleep(0.05)
        url = out.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        self.served = True
        return url.rstrip("/")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture
def console(browser: None, redis_url: str, ns: str) -> Iterator[Console]:
    c = Console(redis_url, ns)
    try:
        yield c
    finally:
        code = c.stop()
    # Only a console that served is judged by its Ctrl-C (one the test never waited for
    # may still be importing, where Python's own default handler ends it).
    if c.served:
        assert code in (0, 130), f"reach web exited with {code} on Ctrl-C"


@pytest.fixture
def worker(
    browser: None, redis_url: str, ns: str, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A `reach worker` of web.flaky, started with the console (Python's start-up is most
    of the test's time): it registers once tmp_path/go exists, and refuses messages while
    tmp_path/refuse exists."""
    p = subprocess.Popen(
        [sys.executable, "-m", "reach_cli.app", "worker", "tests.support.agents_web:flaky"]
        + ["--redis-url", redis_url, "--namespace", ns, "--log-level", "warning", *FAST],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        env={
            **os.environ,
            "REACH_WEB_TEST_REFUSE": str(tmp_path / "refuse"),
            "REACH_WEB_TEST_GATE": str(tmp_path / "go"),
        },
    )
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture
async def page(browser: None, tmp_path: Path) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        ctx = await pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh, empty profile
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1360, "height": 760},
        )
        try:
            pg = ctx.pages[0] if ctx.pages else await ctx.new_page()
            pg.set_default_timeout(WAIT_MS)
            yield pg
        finally:
            await ctx.close()


def _shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("REACH_WEB_SCREENSHOTS") or tmp_path / "screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


async def test_the_console_in_a_browser(
    worker: subprocess.Popen[bytes],
    console: Console,
    page: Any,
    r: AnyRedis,
    ns: str,
    tmp_path: Path,
) -> None:
    base = await console.url()
    shots = _shots(tmp_path)
    keys = Keys(ns)
    agent_row = '#agents tr[data-agent="web-1"]'

    # The overview is open before the agent exists: it appears by the live stream alone.
    await page.goto(base + "/")
    await page.wait_for_selector("#agents td.empty")
    flag = tmp_path / "refuse"
    flag.touch()
    (tmp_path / "go").touch()
    await page.wait_for_selector(agent_row)
    await page.wait_for_function(
        "s => document.querySelector(s)?.children[2]?.textContent === 'routable'",
        arg=agent_row,
    )

    # A message refused while the flag exists: one dead letter.
    async with Client(redis=r, namespace=ns) as client:
        msg_id = await client.send("web.flaky", {"n": 1})
    with anyio.fail_after(20):
        while await r.xlen(keys.dlq("web.flaky")) < 1:
            await anyio.sleep(0.05)
    await page.wait_for_selector('#caps a[href="/dlq?cap=web.flaky"]')
    await page.screenshot(path=str(shots / "overview.png"))

    # Replay it by clicking, through the confirmation step.
    flag.unlink()
    await page.click('header nav a[href="/dlq"]')
    row = await page.wait_for_selector(f'tr[data-letter] a[href*="{msg_id}"]')
    assert row is not None
    await page.click("tr[data-letter] a.replay")
    await page.wait_for_selector("#confirm")
    assert "Replay dead letter" in await page.inner_text(".confirm h2")
    assert await r.xlen(keys.dlq("web.flaky")) == 1  # nothing done before confirming
    await page.screenshot(path=str(shots / "replay-confirm.png"))
    await page.click("#confirm")
    await page.wait_for_url(f"**/message?id={msg_id}**")
    await page.wait_for_function(
        "() => document.getElementById('task-status')?.textContent === 'succeeded'"
    )
    await page.screenshot(path=str(shots / "message.png"))
    assert (await get_status(r, keys, msg_id)).status == "succeeded"
    assert await r.xlen(keys.dlq("web.flaky")) == 0

    # Drain the agent by clicking: it finishes, deregisters, and leaves the page.
    await page.goto(base + "/")
    await page.click(f"{agent_row} a.act")
    await page.wait_for_selector("#confirm")
    assert "Drain agent web-1" in await page.inner_text(".confirm h2")
    await page.click("#confirm")
    await page.wait_for_url("**/agent?id=web-1**")
    await page.wait_for_selector("#gone")
    with anyio.fail_after(20):
        while worker.poll() is None:
            await anyio.sleep(0.05)
    assert worker.returncode == 0
    assert await Registry(r, ns).get("web-1") is None
    await page.goto(base + "/events")
    feed = await page.inner_text("#events")
    for word in ("registered", "ready", "draining"):
        assert word in feed, feed
    await page.goto(base + "/")
    await page.wait_for_selector("#agents td.empty")
    await page.screenshot(path=str(shots / "after-drain.png"))


@pytest.fixture
def console_worker(browser: None, redis_url: str, ns: str) -> Iterator[subprocess.Popen[bytes]]:
    """A `reach worker` of tests.support.agents_console (echo, a KeyError, a hold)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "reach_cli.app", "worker"]
        + ["tests.support.agents_console:console_agent", "--redis-url", redis_url]
        + ["--namespace", ns, "--log-level", "warning", *FAST, "--cancel-grace-s", "0.2"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


async def _rows(page: Any) -> list[str]:
    return list(
        await page.eval_on_selector_all(
            "#messages tr[data-msg]", "rows => rows.map(r => r.dataset.msg)"
        )
    )


async def test_the_message_list_in_a_browser(
    console_worker: subprocess.Popen[bytes],
    console: Console,
    page: Any,
    r: AnyRedis,
    ns: str,
    tmp_path: Path,
) -> None:
    base = await console.url()
    shots = _shots(tmp_path)
    keys = Keys(ns)
    async with Client(redis=r, namespace=ns) as client:
        for cap in ("web.echo", "web.lookup", "web.hold"):  # registered is not yet routable
            await wait_eligible(client, cap, ["console-1"], timeout=30)
        echoed = [await client.request("web.echo", {"n": i}, timeout_s=20) for i in range(2)]
        assert echoed == [{"echo": {"n": 0}}, {"echo": {"n": 1}}]
        failed_id = await client.send("web.lookup", {"text": "no txt here"}, max_attempts=1)
        held = await client.send("web.hold", {"wait": True})
        with anyio.fail_after(20):
            while (await get_status(r, keys, failed_id)).status != "dead":
                await anyio.sleep(0.05)
            while (await get_status(r, keys, held)).status != "running":
                await anyio.sleep(0.05)

        # The list: the failed message's row leads to its traceback.
        await page.goto(base + "/messages")
        await page.wait_for_selector(f'#messages tr[data-msg="{failed_id}"]')
        await page.wait_for_selector(f'#messages tr[data-msg="{held}"][data-status="running"]')
        await page.screenshot(path=str(shots / "messages.png"))
        await page.click(f'#messages tr[data-msg="{failed_id}"] a[href^="/message?"]')
        await page.wait_for_url(f"**/message?id={failed_id}")
        tb = await page.inner_text("#traceback")
        assert "KeyError: 'txt'" in tb and 'payload["txt"]' in tb, tb
        assert await page.inner_text("#task-error") == "KeyError: 'txt'"
        assert "console-1" in await page.inner_text("#attempts")
        assert "no txt here" in await page.inner_text("#payload")
        assert await page.query_selector("a#dead-letter") is not None
        assert await page.query_selector("a#replay-msg") is not None
        await page.screenshot(path=str(shots / "failed-message.png"))

        # The filters: status, then capability; the list follows new messages live.
        await page.goto(base + "/messages")
        await page.select_option("#f-status", "failed")
        await page.click("#f-apply")
        await page.wait_for_url("**status=failed**")
        assert await _rows(page) == [failed_id]
        await page.select_option("#f-status", "")
        await page.select_option("#f-cap", "web.echo")
        await page.click("#f-apply")
        await page.wait_for_url("**cap=web.echo**")
        assert len(await _rows(page)) == 2
        third = await client.send("web.echo", {"n": 2})
        await page.wait_for_selector(f'#messages tr[data-msg="{third}"]')  # no reload
        assert len(await _rows(page)) == 3

        # A running message, cancelled from its page through the confirmation.
        await page.goto(base + "/messages?status=running")
        await page.click(f'#messages tr[data-msg="{held}"] a[href^="/message?"]')
        await page.wait_for_url(f"**/message?id={held}")
        assert await page.inner_text("#task-status") == "running"
        assert '"wait": true' in await page.inner_text("#payload")  # from its inbox entry
        await page.click("#cancel-msg")
        await page.wait_for_selector("#confirm")
        assert "Cancel message" in await page.inner_text(".confirm h2")
        assert (await get_status(r, keys, held)).status == "running"  # not before confirming
        await page.click("#confirm")
        await page.wait_for_url(f"**/message?id={held}**")
        await page.wait_for_function(
            "() => document.getElementById('task-status')?.textContent === 'cancelled'"
        )
        assert (await get_status(r, keys, held)).status == "cancelled"
        await page.screenshot(path=str(shots / "cancelled-message.png"))

    # The overview shows the cancelled one apart from the failure.
    with anyio.fail_after(20):
        while await r.xlen(keys.dlq("web.hold")) < 1:  # the worker reached the cancel
            await anyio.sleep(0.05)
    await page.goto(base + "/")
    await page.wait_for_function(
        "() => document.querySelector('#tile-cancelled b')?.textContent.trim() === '1'"
    )
    assert (await page.inner_text("#tile-failed b")).strip() == "1"

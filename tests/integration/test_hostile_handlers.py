"""Hostile handlers next to real `reach worker` processes: no handler, whatever it raises
or however long it blocks, may stop the workers of its capability. The message fails (it
is retried, then dead-lettered with what it did) and every worker goes on serving.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from reach.client import Client
from reach.connection import AnyRedis
from reach.errors import NoAgentAvailable, Rejected
from reach.keys import Keys
from reach.registry import Registry
from tests.support.agents_hostile import EXCEPTIONS
from tests.support.waiting import wait_until
from tests.support.workers import ROOT, Workers

pytestmark = pytest.mark.anyio


@pytest.fixture
def workers(redis_url: str, ns: str) -> Iterator[Workers]:
    w = Workers(redis_url, ns, "tests.support.agents_hostile")
    yield w
    w.stop_all()


async def ready(c: Client, cap: str, ids: set[str]) -> None:
    async def probe() -> bool:
        got = {
            a.agent_id
            for a in await Registry(c.redis, c.namespace).agents(cap, ready=True, state="active")
        }
        return ids <= got

    await wait_until(probe, timeout_s=30, what=f"agents {sorted(ids)} ready")
    c.invalidate()


async def serving(c: Client, workers: Workers, *names: str) -> None:
    """Every named worker process is alive and answers a request addressed to it."""
    for n in names:
        p = workers.procs[n]
        assert p.poll() is None, f"worker {n} exited with {p.returncode}"

        async def answered(n: str = n) -> Any:
            try:
                return await c.request("hostile.echo", {"ping": n}, target=n, timeout_s=20)
            except NoAgentAvailable:
                c.invalidate()
                return None

        out = await wait_until(answered, timeout_s=30, what=f"{n} answers")
        assert out["agent"] == n


async def dead_letters(r: AnyRedis, ns: str, cap: str) -> dict[str, dict[str, str]]:
    """The dead letters of ``cap`` by msg_id (their fields as text)."""
    rows = await r.xrange(Keys(ns).dlq(cap))
    out = {}
    for _, f in rows:
        d = {k.decode(): v.decode(errors="replace") for k, v in f.items()}
        out[d["msg_id"]] = d
    return out


async def runs_of(r: AnyRedis, ns: str, key: str) -> int:
    return int(await r.hget(Keys(ns).effects("hostile"), key) or 0)


@pytest.mark.parametrize("cap", ["hostile.raise", "hostile.raise_sync", "hostile.raise_stream"])
async def test_a_handler_raising_base_exception_fails_its_message_not_the_workers(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis, cap: str
) -> None:
    names = ("x1", "x2", "x3")
    for n in names:
        workers.start(n)
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "hostile.echo", set(names))
        # One message per exception: before the fix the first one stopped a worker, its
        # inbox moved to the next, which died in turn (3 of 3 workers in under a second).
        sent = {
            name: await c.send(cap, {"exc": name}, idempotency_key=f"{cap}-{name}", max_attempts=3)
            for name in EXCEPTIONS
        }

        async def all_dead() -> dict[str, dict[str, str]] | None:
            letters = await dead_letters(r, ns, cap)
            return letters if set(sent.values()) <= set(letters) else None

        letters = await wait_until(all_dead, timeout_s=60, what="every message dead-lettered")
        for name, msg_id in sent.items():
            letter = letters[msg_id]
            assert letter["reason"] == "max_attempts", (name, letter)
            assert letter["error_type"] == EXCEPTIONS[name].__name__, (name, letter)
            assert await runs_of(r, ns, f"{cap}-{name}") == 3, name  # retried, then dead
            st = await c.task(msg_id)
            assert st.status == "dead" and st.runs == 3, (name, st)
        await serving(c, workers, *names)


# -- mistakes that fail at start, or at once --------------------------------------------
@pytest.mark.parametrize(
    ("cap", "payload", "says"),
    [
        ("typed.dict", [1, 2, 3], "Expected `object`, got `array`"),
        ("typed.struct", {"x": "one", "y": 2}, "at `$.x`"),
        ("typed.typeddict", {"name": "n"}, "missing required field `count`"),
        ("typed.dataclass", {"sku": 7, "qty": 1}, "at `$.sku`"),
    ],
)
async def test_a_payload_that_does_not_fit_the_annotation_is_dead_at_once(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis, cap: str, payload: Any, says: str
) -> None:
    workers.start("typed")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, cap, {"typed"})
        key = f"{cap}-bad"
        with pytest.raises(Rejected) as got:
            await c.request(cap, payload, idempotency_key=key, max_attempts=3, timeout_s=30)
        # Before the fix a `payload: dict` handler got the list: AttributeError three
        # times (retried with backoff), then max_attempts.
        assert got.value.reason == "invalid_payload", got.value
        assert says in str(got.value), str(got.value)
        (letter,) = (await dead_letters(r, ns, cap)).values()
        assert letter["reason"] == "invalid_payload" and letter["attempts"] == "1", letter
        assert says in letter["error"], letter
        assert await runs_of(r, ns, key) == 0  # the handler never saw it
        good = {
            "typed.dict": {"b": 1, "a": 2},
            "typed.struct": {"x": 1, "y": 2},
            "typed.typeddict": {"name": "ab", "count": 2},
            "typed.dataclass": {"sku": "s", "qty": 4},
        }[cap]
        assert await c.request(cap, good, timeout_s=30) in (["a", "b"], 3, "abab", 4)


def test_a_capability_without_a_handler_refuses_to_start(redis_url: str, ns: str) -> None:
    # Before the fix the worker started, advertised half.missing, and dead-lettered each of
    # its messages `no_handler`.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "reach_cli.app",
            "worker",
            "tests.support.agents_hostile:half",
            "--redis-url",
            redis_url,
            "--namespace",
            ns,
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "'half.missing'" in out.stderr and "@app.handler('half.missing')" in out.stderr
    r = redis.Redis.from_url(redis_url)
    try:
        assert r.exists(Keys(ns).agent("half")) == 0  # never registered
    finally:
        r.close()


# -- a handler that blocks the event loop ----------------------------------------------
async def test_a_handler_blocking_the_loop_is_dead_lettered_poisoned_after_the_bound(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis
) -> None:
    names = ("b1", "b2", "b3")
    for n in names:  # stall-s 0.3 and a 6 s block: each run stalls its agent, evicted
        workers.start(n, "--stall-s", "0.3", "--max-takeovers", "2")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "hostile.block", set(names))
        key = "block-1"
        msg_id = await c.send("hostile.block", {"sleep_s": 6}, idempotency_key=key, max_attempts=3)

        async def poisoned() -> dict[str, str] | None:
            return (await dead_letters(r, ns, "hostile.block")).get(msg_id)

        # Before the fix its run moved from agent to agent (each evicted in turn) with
        # attempt stuck at 1, never dead-lettered.
        t0 = time.monotonic()
        letter = await wait_until(poisoned, timeout_s=90, what="the message dead-lettered")
        print(f"poisoned {time.monotonic() - t0:.1f} s after the send")
        assert letter["reason"] == "poisoned", letter
        assert "3 runs never finished" in letter["error"], letter  # the first, 2 takeovers
        assert "max_takeovers=2" in letter["error"], letter
        st = await c.task(msg_id)
        assert st.status == "dead", st
        assert await runs_of(r, ns, key) == 3
        await serving(c, workers, *names)  # every worker back, serving
        # It stays dead: no agent runs it again.
        await anyio.sleep(3)
        assert await runs_of(r, ns, key) == 3


# -- one agent id, one process; several copies, several ids -------------------------------
async def test_a_second_process_with_the_same_id_says_whom_it_replaced(
    workers: Workers, redis_url: str, ns: str, r: AnyRedis, tmp_path: Path
) -> None:
    old = workers.start("x1", log=tmp_path / "old.log")
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "hostile.echo", {"x1"})
        reg = Registry(c.redis, ns)
        first = await reg.get("x1")
        assert first is not None
        new = workers.start("x1", log=tmp_path / "new.log")

        async def replaced() -> bool:
            now = await reg.get("x1")
            return now is not None and now.instance_id != first.instance_id

        await wait_until(replaced, timeout_s=30, what="the second x1 registered")
        # The older stops by itself, exit 0 (as --help and docs/cli.md say).
        with anyio.fail_after(30):
            while old.poll() is None:
                await anyio.sleep(0.05)
        assert old.returncode == 0
        assert new.poll() is None
        await serving(c, workers, "x1")
        host = socket.gethostname()
        # Before the fix the newer said nothing and no event recorded the replacement.
        said = (tmp_path / "new.log").read_text()
        assert f"replaced instance {first.instance_id} on host {host} (pid {old.pid})" in said
        assert "still serving" in said
        heard = (tmp_path / "old.log").read_text()
        assert f"(pid {new.pid})" in heard and "exits with code 0" in heard, heard
        events = [e for e in await reg.recent_events(50) if e.type == "replaced"]
        assert len(events) == 1, events
        (ev,) = events
        assert ev.agent_id == "x1" and ev.instance_id == first.instance_id
        assert f"host={host} pid={old.pid} live=1 by=" in ev.detail, ev.detail


async def test_copies_of_one_agent_run_under_their_own_ids(
    workers: Workers, redis_url: str, ns: str
) -> None:
    workers.start("x1")
    workers.start("x1", "--agent-id", "x1-copy")  # a process of its own
    p = workers.start("x1", "--agent-id", "pool-{hostname}-{n}", "--instances", "3")
    host = socket.gethostname().split(".")[0]
    pool = [f"pool-{host}-{n}" for n in (1, 2, 3)]
    async with Client(redis_url=redis_url, namespace=ns, slow_start_s=0) as c:
        await ready(c, "hostile.echo", {"x1", "x1-copy", *pool})
        for n in ("x1", "x1-copy", *pool):
            out = await c.request("hostile.echo", {"ping": n}, target=n, timeout_s=20)
            assert out["agent"] == n
        assert p.poll() is None  # the three copies share one process
        info = {a.agent_id: a for a in await Registry(c.redis, ns).agents("hostile.echo")}
        assert len({info[n].instance_id for n in pool}) == 3


def test_instances_without_a_numbered_id_are_refused(redis_url: str, ns: str) -> None:
    for extra in (["--instances", "2"], ["--instances", "2", "--agent-id", "same"]):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "reach_cli.app",
                "worker",
                "tests.support.agents_hostile:x1",
                "--redis-url",
                redis_url,
                "--namespace",
                ns,
                *extra,
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 2 and "{n}" in out.stderr, (extra, out.stderr)

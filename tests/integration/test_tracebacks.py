"""A handler's exception is kept where people look: its type, message and traceback in the
task record and the dead letter (bounded, through the redaction hook), printed by
`reach task` and `reach dlq show`, and one WARNING line per dead letter in a real worker's
log."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

import reach
from reach._worker import letters as worker_letters
from reach.connection import AnyRedis, connect
from reach.keys import Keys
from reach.recent import attempts_of
from reach.tasks import DeadLetter, get_status, parse_dead_letter
from tests.support.agents_failing import failing_agent
from tests.support.agents_messaging import serving, wait_eligible, wait_status, wait_until
from tests.support.cluster import RedisTestCluster
from tests.support.workers import Workers

pytestmark = pytest.mark.anyio


async def letters(r: AnyRedis, ns: str, capability: str) -> list[DeadLetter]:
    return [parse_dead_letter(i, f) for i, f in await r.xrange(Keys(ns).dlq(capability))]


async def fail_once(client: reach.Client, capability: str, payload: Any) -> str:
    env = client.build(capability, payload, timeout_s=15, max_attempts=1)
    with pytest.raises(reach.RemoteError):
        await client.call(env)
    await wait_status(client, env.msg_id, "dead")
    return env.msg_id


def cli(url: str, ns: str, *args: str) -> str:
    res = CliRunner().invoke(cli_app, [*args, "--redis-url", url, "--namespace", ns])
    assert res.exit_code == 0, (args, res.output)
    return res.stdout


async def test_a_key_error_is_stored_with_its_traceback(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, failing_agent()) as client:
        msg_id = await fail_once(client, "fail.key", {"text": "hi"})
        st = await get_status(r, Keys(ns), msg_id)
        [dl] = await wait_until(lambda: letters(r, ns, "fail.key"), what="dead letter")
        # Its index row may be held a moment (it rides along with a later settle call).
        await wait_until(lambda: attempts_of(r, Keys(ns), msg_id), what="its attempt indexed")
    assert (st.error, st.error_type, st.error_text) == ("'txt'", "KeyError", "KeyError: 'txt'")
    for tb in (st.traceback, dl.traceback):
        assert tb.startswith("Traceback (most recent call last):")
        assert 'return payload["txt"]' in tb and "in lookup" in tb
        assert tb.rstrip().endswith("KeyError: 'txt'")
    assert dl.error_text == "KeyError: 'txt'"

    task_out = await anyio.to_thread.run_sync(lambda: cli(redis_url, ns, "task", msg_id))
    assert "KeyError: 'txt'" in task_out and "Traceback (most recent call last)" in task_out
    assert 'return payload["txt"]' in task_out
    as_json = json.loads(
        await anyio.to_thread.run_sync(lambda: cli(redis_url, ns, "task", msg_id, "--json"))
    )
    assert as_json["error_type"] == "KeyError" and "in lookup" in as_json["traceback"]
    [run] = as_json["attempts"]  # from the index of recent messages
    assert (run["attempt"], run["agent_id"], run["status"]) == (1, "failing-1", "dead")
    assert "attempts (the index of recent messages)" in task_out
    show = await anyio.to_thread.run_sync(lambda: cli(redis_url, ns, "dlq", "show", dl.id))
    assert "KeyError: 'txt'" in show and 'return payload["txt"]' in show


async def test_a_retry_that_succeeds_shows_no_earlier_traceback(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    app = reach.Agent("flaky-1", capabilities=["flaky"])

    @app.handler("flaky")
    async def flaky(payload: Any, ctx: reach.Context) -> Any:
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")
        return "ok"

    async with serving(redis_url, ns, app) as client:
        env = client.build("flaky", None, timeout_s=15, max_attempts=3)
        assert await client.call(env) == "ok"
        st = await wait_status(client, env.msg_id, "succeeded")
        raw = await r.hgetall(Keys(ns).idem(env.key))
    assert (st.error_type, st.traceback) == ("", "")
    assert b"traceback" not in raw  # the attempt that failed left nothing behind


async def test_a_long_traceback_keeps_its_last_bytes(redis_url: str, ns: str, r: AnyRedis) -> None:
    async with serving(redis_url, ns, failing_agent(), traceback_max_bytes=600) as client:
        msg_id = await fail_once(client, "fail.deep", {"depth": 200})
        st = await get_status(r, Keys(ns), msg_id)
    assert 0 < len(st.traceback.encode()) <= 600
    assert st.traceback.startswith("[... earlier lines cut]\n")
    assert st.traceback.rstrip().endswith("KeyError: 'txt'")


async def test_no_traceback_is_stored_with_a_bound_of_zero(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    async with serving(redis_url, ns, failing_agent(), traceback_max_bytes=0) as client:
        msg_id = await fail_once(client, "fail.key", {})
        st = await get_status(r, Keys(ns), msg_id)
        [dl] = await wait_until(lambda: letters(r, ns, "fail.key"), what="dead letter")
    assert (st.traceback, dl.traceback, dl.error_type) == ("", "", "KeyError")


async def test_the_redaction_hook_decides_what_is_stored(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    seen: list[str] = []

    def redact(text: str) -> str:
        seen.append(text)
        return text.replace("s3cr3t", "***")

    async with serving(redis_url, ns, failing_agent(), redact_traceback=redact) as client:
        msg_id = await fail_once(client, "fail.secret", {"token": "s3cr3t"})
        st = await get_status(r, Keys(ns), msg_id)
        [dl] = await wait_until(lambda: letters(r, ns, "fail.secret"), what="dead letter")
    assert len(seen) == 1 and "s3cr3t" in seen[0]
    for tb in (st.traceback, dl.traceback):
        assert "s3cr3t" not in tb and "RuntimeError: upstream refused token ***" in tb


async def test_a_redaction_hook_that_raises_stores_a_note(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    def broken(text: str) -> str:
        raise LookupError("no rules loaded")

    async with serving(redis_url, ns, failing_agent(), redact_traceback=broken) as client:
        msg_id = await fail_once(client, "fail.secret", {"token": "s3cr3t"})
        st = await get_status(r, Keys(ns), msg_id)
    assert "s3cr3t" not in st.traceback
    assert "redaction hook raised LookupError: no rules loaded" in st.traceback


@pytest.mark.cluster
async def test_tracebacks_on_a_cluster(redis_cluster: RedisTestCluster, ns: str) -> None:
    url = redis_cluster.url
    r = await connect(url)
    try:
        async with serving(url, ns, failing_agent()) as client:
            env = client.build("fail.key", {}, timeout_s=15, max_attempts=1)
            with pytest.raises(reach.RemoteError):
                await client.call(env)

            async def stored() -> Any:
                st = await get_status(r, Keys(ns), env.msg_id)
                return st if st.traceback else None

            # The reply and the detail are written by one pipeline across nodes: either
            # may land first.
            st = await wait_until(stored, what="the stored traceback")
            [dl] = await wait_until(lambda: letters(r, ns, "fail.key"), what="dead letter")
    finally:
        await r.aclose()
    assert st.error_text == "KeyError: 'txt'" and "in lookup" in st.traceback
    assert "in lookup" in dl.traceback


async def test_a_worker_logs_one_warning_line_per_dead_letter(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    workers = Workers(redis_url, ns, "tests.support.agents_failing")
    log = tmp_path / "worker.log"
    try:
        workers.start("failing_agent", log=log)
        async with reach.Client(redis_url=redis_url, namespace=ns) as client:
            await wait_eligible(client, "fail.key", ["failing-1"], timeout=30)
            msg_ids = [await fail_once(client, "fail.key", {"n": i}) for i in range(2)]
    finally:
        workers.stop_all()
    lines = [ln for ln in log.read_text().splitlines() if "dead-lettered" in ln]
    assert len(lines) == 2, log.read_text()
    for msg_id, line in zip(msg_ids, lines, strict=True):
        assert "WARNING" in line and msg_id in line
        assert "max_attempts" in line and "KeyError: 'txt'" in line
    assert "Traceback" not in log.read_text()  # the traceback is logged at DEBUG only


async def test_dead_letter_lines_are_rate_limited_and_tracebacks_logged_at_debug(
    redis_url: str, ns: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At DEBUG each dead letter's WARNING line is followed by its traceback; past the
    window's lines the rest are counted, and the first line of the next window says how
    many were left out. The worker's limit gets 2 lines a window here and a clock the test
    moves (the runtime's: 10 lines per 10 s of time.monotonic)."""
    clock = [1000.0]
    monkeypatch.setattr(worker_letters, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(
        worker_letters, "ReportLimit", partial(worker_letters.ReportLimit, per_window=2)
    )
    caplog.set_level(logging.DEBUG, logger="reach.runtime")

    def logged(start: str) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "reach.runtime" and r.getMessage().startswith(start)
        ]

    async def lines(n: int) -> list[str]:
        async def enough() -> list[str]:
            got = logged("dead-lettered ")
            return got if len(got) >= n else []

        return await wait_until(enough, what=f"{n} dead-letter lines")

    async with serving(redis_url, ns, failing_agent()) as client:
        burst = [await fail_once(client, "fail.key", {"n": i}) for i in range(4)]
        first = await lines(2)
        clock[0] += 60  # a new window
        later = await fail_once(client, "fail.key", {"n": 4})
        every = await lines(3)
    assert every[:2] == first and len(every) == 3, every
    for msg_id, line in zip(burst[:2], first, strict=True):
        assert msg_id in line and "max_attempts: KeyError: 'txt'" in line
        assert "not logged" not in line
    assert later in every[2] and every[2].endswith("[2 more dead letter(s) not logged]")
    tracebacks = logged("traceback of ")
    assert len(tracebacks) == 3, tracebacks  # one per line logged, at DEBUG
    for msg_id, tb in zip([*burst[:2], later], tracebacks, strict=True):
        assert tb.startswith(f"traceback of {msg_id}:\nTraceback (most recent call last):")
        assert 'return payload["txt"]' in tb and tb.endswith("KeyError: 'txt'")
    levels = {r.levelno for r in caplog.records if r.getMessage().startswith("traceback of ")}
    assert levels == {logging.DEBUG}


async def test_reach_worker_takes_the_bound_and_the_redaction_hook(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    """`reach worker --traceback-max-bytes N --redact-traceback MODULE:ATTR` (a real
    process): the stored tracebacks are cut to N bytes and pass through the hook."""
    workers = Workers(redis_url, ns, "tests.support.agents_failing")
    hook = "tests.support.agents_failing:mask_tokens"
    try:
        workers.start("failing_agent", "--traceback-max-bytes", "600", "--redact-traceback", hook)
        async with reach.Client(redis_url=redis_url, namespace=ns) as client:
            for cap in ("fail.deep", "fail.secret"):
                await wait_eligible(client, cap, ["failing-1"], timeout=30)
            deep = await get_status(
                r, Keys(ns), await fail_once(client, "fail.deep", {"depth": 200})
            )
            secret = await fail_once(client, "fail.secret", {"token": "s3cr3t"})
            masked = await get_status(r, Keys(ns), secret)
            [dl] = await wait_until(lambda: letters(r, ns, "fail.secret"), what="dead letter")
    finally:
        workers.stop_all()
    assert 0 < len(deep.traceback.encode()) <= 600
    assert deep.traceback.startswith("[... earlier lines cut]\n")
    for tb in (masked.traceback, dl.traceback):
        assert "s3cr3t" not in tb and "RuntimeError: upstream refused token ***" in tb


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--redact-traceback", "tests.support.agents_failing:no_such_hook"], "no attribute"),
        (["--redact-traceback", "tests.support.agents_failing:os"], "is module, not a function"),
        (["--redact-traceback", "no_colon_here"], "expected MODULE:ATTR"),
        (["--redact-traceback", "no_such_module_here:mask"], "cannot import"),
        (["--traceback-max-bytes", "-1"], "traceback-max-bytes"),
    ],
)
def test_reach_worker_refuses_a_bad_traceback_setting(
    redis_url: str, ns: str, args: list[str], says: str
) -> None:
    argv = ["worker", "tests.support.agents_failing:failing_agent", *args]
    res = CliRunner().invoke(cli_app, [*argv, "--redis-url", redis_url, "--namespace", ns])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.split()), res.output

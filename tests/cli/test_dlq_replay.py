"""`reach dlq replay`: where the outcome of a replayed dead letter goes, and `--wait`.

A real Redis, an agent in the test's loop whose handler rejects until told otherwise, and
callers that are gone (their Client closed) or still connected when the letter is
replayed. A gone caller's reply stream must stay empty: the reply goes nowhere (or to the
command itself with --wait, or to the client named with --reply-to).
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import pytest
from reach_cli.app import app as cli_app
from typer.testing import CliRunner

import reach
from reach import Agent, Context, admin
from reach.client import Client
from reach.connection import AnyRedis
from reach.keys import Keys
from tests.support.agents_messaging import serving, wait_status

pytestmark = pytest.mark.anyio
CAP = "replay.flaky"


class Switch:
    def __init__(self) -> None:
        self.accept = False


def flaky_agent(switch: Switch) -> Agent:
    app = Agent("replay-agent-1", capabilities=[CAP])

    @app.handler(CAP)
    async def flaky(payload: Any, ctx: Context) -> Any:
        if not switch.accept:
            raise reach.Reject(f"not yet: {payload}")
        return {"done": payload}

    return app


async def cli(redis_url: str, ns: str, *args: str, code: int = 0) -> Any:
    runner = CliRunner()
    res = await anyio.to_thread.run_sync(
        lambda: runner.invoke(cli_app, [*args, "--redis-url", redis_url, "--namespace", ns])
    )
    assert res.exit_code == code, (args, res.exit_code, res.output, res.exception)
    return res


async def dead_letter_of(redis_url: str, ns: str, client_id: str, payload: str) -> str:
    """A request of caller ``client_id`` that is dead-lettered (rejected); the caller's
    Client is closed on return: the caller is gone. Returns the dead letter's id."""
    async with Client(redis_url=redis_url, namespace=ns, client_id=client_id) as c:
        with pytest.raises(reach.Rejected):
            await c.request(CAP, payload, timeout_s=20)
    return await letter_id(redis_url, ns, payload)


async def letter_id(redis_url: str, ns: str, payload: str) -> str:
    res = await cli(redis_url, ns, "dlq", "list", "--json")
    want = f"not yet: {payload}"[:200]  # a long error is kept cut
    [d] = [d for d in json.loads(res.stdout) if d["error"][:200] == want]
    return str(d["id"])


async def test_a_replayed_dead_letter_of_a_gone_caller_leaves_nothing_in_its_reply_stream(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    keys = Keys(ns)
    switch = Switch()
    async with serving(redis_url, ns, flaky_agent(switch)) as client:
        gone = await dead_letter_of(redis_url, ns, "gone-caller", "a")
        gone_wait = await dead_letter_of(redis_url, ns, "gone-caller-2", "b")
        named = await dead_letter_of(redis_url, ns, "gone-caller-3", "c")
        # a caller still connected: its letter's outcome goes back to it
        async with Client(redis_url=redis_url, namespace=ns, client_id="live-caller") as live:
            with pytest.raises(reach.Rejected):
                await live.request(CAP, "d", timeout_s=20)
            live_letter = await letter_id(redis_url, ns, "d")
            assert "live-caller" in (await admin.live_clients(r, keys) or set())
            assert "gone-caller" not in (await admin.live_clients(r, keys) or set())
            for c in ("gone-caller", "gone-caller-2", "gone-caller-3"):
                # What the original call read may linger in its stream (the reader deletes
                # answered replies in batches): cleared, so what the replay adds is seen.
                assert await r.xlen(keys.replies(c)) <= 1
                await r.delete(keys.replies(c))
            switch.accept = True

            # a gone caller: no reply stream; the outcome is in the task record
            out = json.loads((await cli(redis_url, ns, "dlq", "replay", gone, "--json")).stdout)
            [sent] = out["sent"]
            assert (sent["id"], sent["reply_to"], sent["why"]) == (gone, None, "caller gone")
            st = await wait_status(client, sent["msg_id"], "succeeded")
            assert st.reply is not None
            assert await r.exists(keys.replies("gone-caller")) == 0

            # the live caller gets its reply (and the record has it too)
            out = json.loads(
                (await cli(redis_url, ns, "dlq", "replay", live_letter, "--json")).stdout
            )
            [sent] = out["sent"]
            assert (sent["reply_to"], sent["why"]) == ("live-caller", "caller live")
            with anyio.fail_after(20):
                assert await live.result(sent["msg_id"]) == {"done": "d"}

            # --wait: the command takes the gone caller's place, prints the outcome, and
            # leaves no reply stream of its own behind
            res = await cli(redis_url, ns, "dlq", "replay", gone_wait, "--wait")
            assert "succeeded" in res.stdout and '{"done": "b"}' in res.stdout, res.stdout
            assert "(fallback)" in res.stdout
            assert await r.exists(keys.replies("gone-caller-2")) == 0
            [own] = re.findall(r"reply to (\S+) \(fallback\)", res.stdout)
            assert own.startswith("c-") and await r.exists(keys.replies(own)) == 0

            # --reply-to: the operator names the client whose stream gets it
            out = json.loads(
                (
                    await cli(
                        redis_url, ns, "dlq", "replay", named, "--reply-to", "ops-1", "--json"
                    )
                ).stdout
            )
            [sent] = out["sent"]
            assert (sent["reply_to"], sent["why"]) == ("ops-1", "named")
            await wait_status(client, sent["msg_id"], "succeeded")
            assert await r.exists(keys.replies("gone-caller-3")) == 0
            assert await r.xlen(keys.replies("ops-1")) == 1


async def test_replay_wait_prints_a_failed_outcome_and_exits_1(
    redis_url: str, ns: str, r: AnyRedis
) -> None:
    switch = Switch()  # rejects again: the replay is dead-lettered once more
    async with serving(redis_url, ns, flaky_agent(switch)):
        letter = await dead_letter_of(redis_url, ns, "gone-caller", "x")
        await r.delete(Keys(ns).replies("gone-caller"))  # what the first call read
        res = await cli(redis_url, ns, "dlq", "replay", letter, "--wait", "--json", code=1)
        out = json.loads(res.stdout)
        [sent] = out["sent"]
        assert sent["outcome"]["status"] == "dead"
        assert "not yet: x" in sent["outcome"]["error"]
        assert sent["why"] == "fallback"
        res = await cli(redis_url, ns, "dlq", "list", "--json")
        assert len(json.loads(res.stdout)) == 1  # dead-lettered again, filed anew
        assert await r.exists(Keys(ns).replies("gone-caller")) == 0
        text = await cli(
            redis_url, ns, "dlq", "replay", "--all", "--wait", "--timeout-s", "20", code=1
        )
        assert "dead: not yet: x" in text.stdout, text.stdout


async def test_dlq_show_and_list_cut_long_values_unless_full(redis_url: str, ns: str) -> None:
    switch = Switch()
    long = "x" * 3000
    async with serving(redis_url, ns, flaky_agent(switch)):
        letter = await dead_letter_of(redis_url, ns, "gone-caller", long)
        shown = (await cli(redis_url, ns, "dlq", "show", letter)).stdout
        # one row per envelope field, values cut with a note; the table wraps, never a repr
        assert "envelope.msg_id" in shown and "envelope.reply_to" in shown
        assert "--full shows all" in shown and shown.count("x") < 1000
        assert "{'" not in shown
        full = (await cli(redis_url, ns, "dlq", "show", letter, "--full")).stdout
        assert full.count("x") >= 3000  # the payload, whole
        assert "--full shows all" not in full
        listed = (await cli(redis_url, ns, "dlq", "list")).stdout
        assert listed.count("x") < 200 and "--full shows all" in listed
        error = json.loads((await cli(redis_url, ns, "dlq", "list", "--json")).stdout)[0]["error"]
        listed = (await cli(redis_url, ns, "dlq", "list", "--full")).stdout
        assert len(error) > 200 and listed.count("x") >= error.count("x")
        as_json = json.loads((await cli(redis_url, ns, "dlq", "show", letter, "--json")).stdout)
        assert as_json["payload"] == long  # --json: always whole
